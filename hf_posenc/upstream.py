"""Every keyword, private name and internal layout of Transformers (and of argparse, as HfArgumentParser builds it)
that hf-posenc relies on, in one place, with one test each (``tests/test_upstream_api.py``), run on the locked
releases and on the newest ones (the upstream lane, ``scripts/upstream_lane.py``). The command line's own parsers
keep the argparse internals they read beside them, in ``hf_posenc_cli.arguments``.

A new Transformers release that moves one of these fails a named test in the upstream lane instead of changing
what a patched model computes. What moved so far:

* 5.24 passes the KV cache to decoder layers and attention modules as ``cache=`` (5.18–5.23:
  ``past_key_values=``; the old keyword is deprecated until 5.40). A layer forward that takes only one spelling
  receives the other in ``**kwargs`` and silently runs without a cache: :func:`layer_cache` reads both.

The public extension points (``ROPE_INIT_FUNCTIONS``, ``AttentionInterface``, ``AttentionMaskInterface``,
``AutoConfig.register``) are used where they are needed and are not listed here.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

# The keywords under which a decoder layer / attention module receives the KV cache, newest first.
CACHE_KEYWORDS = ("cache", "past_key_values")

# PreTrainedModel's hook that picks the attention implementation (at init and in set_attn_implementation); the
# patched model classes override it to keep the implementation a scheme requires (families/base.py).
ATTN_IMPLEMENTATION_HOOK = "_check_and_adjust_attn_implementation"


def layer_cache(past_key_values: Any = None, cache: Any = None) -> Any:
    """The KV cache a decoder layer or attention module was given, under either spelling (``cache`` in
    Transformers 5.24+, ``past_key_values`` before), or None. Both at once, different: an error, never a guess."""
    if cache is not None and past_key_values is not None and cache is not past_key_values:
        raise TypeError("got two different KV caches, as `cache` and as `past_key_values`; pass one (`cache` in "
                        "Transformers 5.24 and later, `past_key_values` before).")
    return cache if cache is not None else past_key_values


def attn_implementation(config: Any) -> str | None:
    """The attention implementation a model runs (``config._attn_implementation``: private, no public reader)."""
    return config._attn_implementation


def name_or_path(config: Any) -> str | None:
    """Where a config (so its model) was loaded from: the Hub id or folder ``from_pretrained`` read, or None
    (``PretrainedConfig._name_or_path``: private, set by every ``from_pretrained``)."""
    return getattr(config, "_name_or_path", None) or None


def family_eager_attention(module_name: str) -> Callable[..., Any]:
    """A family's own eager attention function, ``eager_attention_forward`` in its modeling module (a module-level
    name every family defines; eager is not in ``ALL_ATTENTION_FUNCTIONS``)."""
    return sys.modules[module_name].eager_attention_forward


def supports_attention_backend(model_class: type) -> bool:
    """Whether a model class computes attention through ``ALL_ATTENTION_FUNCTIONS`` (a private class flag)."""
    return bool(getattr(model_class, "_supports_attention_backend", False))


def no_split_modules(module: Any) -> Any:
    """The decoder-layer class names FSDP's wrap policy and ``device_map="auto"`` read (private attribute), as set
    on the module itself, or None."""
    return vars(module).get("_no_split_modules")


def set_no_split_modules(module: Any, names: set[str]) -> None:
    module._no_split_modules = names


def extra_config_types() -> dict:
    """``CONFIG_MAPPING``'s registry of types added with ``AutoConfig.register`` (private ``_extra_content``)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING._extra_content


def set_extra_config_types(content: dict) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    CONFIG_MAPPING._extra_content = content


def parser_option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    """The argparse action behind ``flag`` (``--name``), as HfArgumentParser built it (argparse private)."""
    return parser._option_string_actions[flag]


def parser_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every action of a parser (argparse private ``_actions``)."""
    return parser._actions

