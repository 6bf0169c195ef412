"""PEFT with a patched model: configs that train a scheme's own modules, adapters that remember their base, and
loading that refuses a wrong base.

PEFT saves only the adapter weights and ``modules_to_save``: new parameters that merely have ``requires_grad=True``
are silently dropped, and an adapter loaded onto a base that lacks those modules (TAPE's ``tape`` blocks on an
unpatched model) silently drops them too. An adapter loaded onto a base patched with another scheme, or the same
scheme with other options, loads without a word and gives wrong outputs. So:

* :mod:`~hf_posenc.adapters.config`: :func:`lora_config` puts a scheme's modules in ``modules_to_save``; any other
  config that would leave them frozen gets them added, with a warning (:func:`train_scheme_modules`).
* :mod:`~hf_posenc.adapters.record`: :func:`save_adapter` saves an adapter with its **adapter record**
  (``hf_posenc_adapter.json``: the base's scheme record), its base named as a user loads it, and a model card;
  :func:`describe_adapter` is its part after PEFT's save.
* :mod:`~hf_posenc.adapters.check`: :func:`check_adapter_base` refuses a base whose scheme record differs from the
  adapter record, naming both and the fix; :func:`load_adapter` loads behind it.
* :mod:`~hf_posenc.adapters.guard`: :func:`guard_peft` (run by ``import hf_posenc``) makes PEFT's and Transformers'
  own loading, wrapping and saving do all of the above, so TRL's ``SFTTrainer`` with a hand-written
  ``LoraConfig`` and ``trainer.save_model`` gets the same adapter as ``hf-posenc train``.
"""

from .check import check_adapter_base, load_adapter, patch_call, record_differences
from .config import (
    ATTENTION_PROJECTIONS,
    lora_config,
    norm_module_names,
    scheme_modules_left_frozen,
    train_scheme_modules,
)
from .guard import GUARD_ENV, guard_enabled_by_environment, guard_peft, unguard_peft
from .record import (
    ADAPTER_RECORD,
    AdapterRecord,
    adapter_base_name,
    caller_describes,
    describe_adapter,
    read_adapter_record,
    save_adapter,
    write_adapter_record,
)

__all__ = [
    "ADAPTER_RECORD", "ATTENTION_PROJECTIONS", "GUARD_ENV", "AdapterRecord", "adapter_base_name", "caller_describes",
    "check_adapter_base", "describe_adapter", "guard_enabled_by_environment", "guard_peft", "load_adapter",
    "lora_config", "norm_module_names", "patch_call", "read_adapter_record", "record_differences", "save_adapter",
    "scheme_modules_left_frozen", "train_scheme_modules", "unguard_peft", "write_adapter_record",
]
