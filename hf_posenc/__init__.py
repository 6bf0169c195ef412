"""hf-posenc: switch the positional encoding of Hugging Face RoPE checkpoints in a few lines.

```python
import hf_posenc
model = hf_posenc.load_model("@smollm2")           # embedded SmolLM2-135M, offline; or AutoModelForCausalLM...
hf_posenc.patch_model(model, scheme="cope")        # or "hardclip", "prope", "rope"
model.save_pretrained("out")                        # the scheme is recorded in config.json
AutoModelForCausalLM.from_pretrained("out")         # patched again (after `import hf_posenc`)
```

``import hf_posenc`` registers every scheme's rope types, attention functions and patched model types with Transformers.
"""

from .record import FORMAT_VERSION, LIBRARY_VERSION
from .schemes import (
    SCHEMES, CoPEConfig, HardClipConfig, PRoPEConfig, RoPEConfig, SchemeConfig, TAPAConfig, TAPEConfig,
    make_scheme, on_register, register_scheme, register_with_transformers,
)

on_register(register_with_transformers)  # every scheme's rope types and attention, and those registered later

from .families import FAMILIES  # noqa: E402  (registers the patched model types)
from .patching import get_scheme, patch_model  # noqa: E402
from .export import export_stock  # noqa: E402
from .gguf_export import export_gguf  # noqa: E402
from .hub import push_to_hub  # noqa: E402
from .models import load_model  # noqa: E402
from . import remote_code  # noqa: E402,F401  (registers the remote-code writer of save_pretrained)

__version__ = LIBRARY_VERSION


def _guard_peft() -> None:
    """Make PEFT's and Transformers' adapter loading refuse a base the adapter was not trained on, their adapter
    injection train a scheme's own modules, and their adapter saves write the adapter record; see
    ``hf_posenc.adapters.guard``. ``HF_POSENC_GUARD_PEFT=0`` opts out."""
    import importlib.util

    if importlib.util.find_spec("peft") is not None:
        from .adapters import guard_enabled_by_environment, guard_peft

        if guard_enabled_by_environment():
            guard_peft()


_guard_peft()

__all__ = [
    "patch_model", "get_scheme", "load_model", "export_stock", "export_gguf", "push_to_hub", "make_scheme", "register_scheme",
    "SCHEMES", "FAMILIES", "SchemeConfig",
    "CoPEConfig", "HardClipConfig", "PRoPEConfig", "RoPEConfig", "TAPAConfig", "TAPEConfig", "FORMAT_VERSION", "__version__",
]
