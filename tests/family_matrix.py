"""The family matrix: tiny random configs of every rotary causal-LM type in Transformers, and the checks that make
a (model type, scheme) cell of the support table "verified".

Shared by ``tests/test_families.py`` and ``scripts/families_table.py`` (which writes ``hf_posenc/data/families.json``
from these same checks), so the committed table is what the checks produce.
"""

from __future__ import annotations

import copy
import math
import tempfile
from typing import Any

import torch

import hf_posenc
from hf_posenc.families.derive import FamilyRefused, rotary_causal_lm_types, static_refusal, stock_classes
from hf_posenc.families.table import table_schemes

# Identity settings (the model must not change at all) and active settings of each frequency scheme.
FREQUENCY_SCHEMES = {
    "cope": ({"clip_low_n": 0}, {"clip_low_n": 4}),
    "hardclip": ({"clip_low_n": 0}, {"clip_low_n": 4}),
    "prope": ({"p": 1.0}, {"p": 0.5}),
    "rope": ({}, {"scaling": "yarn", "factor": 2.0}),
}
VOCAB = 128
# Sizes every tiny config gets where its config has the field (GQA 4/2 heads, head dim 16, MoE with 4 experts).
SHRINK: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": VOCAB, "max_position_embeddings": 256,
    "sliding_window": 8, "attention_chunk_size": 8, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "expert_intermediate_size": 32,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 32,
    "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16, "initializer_range": 0.15,
    "attention_dropout": 0.0, "hidden_dropout": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
    "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "dropout": 0.0,
}
MAX_PARAMS = 5_000_000  # a tiny model; anything larger means the shrink missed a size
# Config-specific sizes the generic shrink cannot guess.
EXTRA: dict[str, dict[str, Any]] = {
    "dots3_note_text": {"index_topk": 8, "shared_experts_intermediate_size": 32, "index_head_dim": 16, "index_n_heads": 2,
                        "head_dim": 32,
                        "per_layer_config": {"01": {"num_attention_heads": 2, "num_key_value_heads": 2}}},
    "dbrx": {"d_model": 64, "n_heads": 4, "n_layers": 2, "max_seq_len": 256,
             "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0}, "ffn_config": {"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2}},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    "gemma3n_text": {"num_hidden_layers": 4, "num_kv_shared_layers": 2,  # the last two layers reuse the cache
                     "layer_types": ["sliding_attention", "full_attention"] * 2, "vocab_size_per_layer_input": VOCAB, "hidden_size_per_layer_input": 16,
                     "laurel_rank": 8},
    "phi4_multimodal": {"audio_config": {"num_blocks": 1, "nemo_conv_channels": 16, "ext_pw_out_channel": 64,
                                         "depthwise_separable_out_channel": 64}},
    "blt": {"encoder_hash_byte_group_vocab": 64, "encoder_config": {"hidden_size_global": 64},
            "decoder_config": {"hidden_size_global": 64}},
    "gemma4_text": {"vocab_size_per_layer_input": VOCAB},
    "longcat_flash": {"ffn_hidden_size": 128, "expert_ffn_hidden_size": 32, "num_layers": 2, "moe_topk": 2,
                      "zero_expert_num": 2},
    "zaya": {"num_experts_per_tok": 1},
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {"layer_types": ["mamba", "attention"]},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    "bailing_hybrid": {"num_expert_group": 1, "topk_group": 1, "num_experts_per_token": 2, "layer_group_size": 2},
}


class TinyConfigError(RuntimeError):
    """The generic tiny-config builder could not build a working tiny model of a type."""


def _shrink_list(values: list, n: int) -> list:
    """A per-layer list cut to ``n`` layers, keeping one layer of each distinct kind first (a sliding and a full
    layer, a NoPE and a RoPE layer)."""
    distinct = list(dict.fromkeys(v for v in values if isinstance(v, (str, int, float, bool))))
    return (distinct + list(values))[:n] if len(distinct) == len(set(map(repr, distinct))) else list(values)[:n]


def _shrunk(values: dict[str, Any], sub_configs: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Keyword overrides that shrink one config's ``values`` (and, recursively, its sub-configs': BLT's local and
    global transformers, a multimodal model's vision and audio towers); ``extra``: the type's own sizes, a dict for
    a sub-config key merging into that sub-config."""
    layers_before = values.get("num_hidden_layers")
    kw = {k: v for k, v in SHRINK.items() if k in values}
    n = extra.get("num_hidden_layers", kw.get("num_hidden_layers", layers_before))
    for key, value in values.items():
        if isinstance(value, list) and layers_before and len(value) == layers_before and key not in kw:
            kw[key] = _shrink_list(value, n)
    if "kv_lora_rank" in values and "num_key_value_heads" in kw:  # MLA: one key/value head per query head
        kw["num_key_value_heads"] = kw["num_attention_heads"]
    for key, sub_class in sub_configs.items():
        if isinstance(values.get(key), dict):
            kw[key] = {**values[key], **_shrunk(values[key], getattr(sub_class, "sub_configs", {}) or {},
                                                extra.get(key, {}))}
    kw.update({k: v for k, v in extra.items() if not (k in sub_configs and isinstance(v, dict))})
    return kw


def tiny_config(model_type: str) -> Any:
    """A two-layer random config of ``model_type``: Transformers' defaults with every size shrunk."""
    config_class, _ = stock_classes(model_type)
    try:
        default = config_class()
    except Exception as exc:  # the defaults of some configs do not validate; shrink from the raw defaults then
        raise TinyConfigError(f"default {config_class.__name__}() fails: {type(exc).__name__}: {exc}") from exc
    kw = _shrunk(default.to_dict(), getattr(config_class, "sub_configs", {}) or {}, EXTRA.get(model_type, {}))
    try:
        return config_class(**kw)
    except Exception as exc:  # reported as the row's reason; the builder then needs an EXTRA entry
        raise TinyConfigError(f"{config_class.__name__}(tiny sizes) fails: {type(exc).__name__}: {exc}") from exc


def stock_model(model_type: str, seed: int = 0, attn: str = "eager") -> Any:
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type)
    try:
        with torch.device("meta"):  # count first: a config the generic shrink missed can need gigabytes
            n_params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    except Exception as exc:
        raise TinyConfigError(f"building the tiny model fails: {type(exc).__name__}: {exc}") from exc
    if n_params > MAX_PARAMS:
        raise TinyConfigError(f"the shrunk config still has {n_params / 1e6:.0f}M parameters (limit "
                              f"{MAX_PARAMS / 1e6:.0f}M): add the sizes it needs to EXTRA")
    torch.manual_seed(seed)
    try:
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    except Exception as exc:
        raise TinyConfigError(f"building the tiny model fails: {type(exc).__name__}: {exc}") from exc
    return model.eval()


def input_ids(length: int = 48, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (1, length), generator=g)


def logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def greedy_without_cache(model: Any, ids: torch.Tensor, steps: int) -> torch.Tensor:
    for _ in range(steps):
        ids = torch.cat([ids, logits(model, ids)[:, -1].argmax(-1, keepdim=True)], dim=-1)
    return ids


def rotary_inv_freqs(model: Any) -> dict[str, torch.Tensor]:
    """Every inverse-frequency buffer of the model's text rotary modules, by buffer name."""
    found = {}
    for name, buffer in model.named_buffers():
        if name.endswith("inv_freq") and "original" not in name and "vision" not in name:
            found[name] = buffer.detach().double()
    return found


def expected_inv_freq(scheme: str, options: dict[str, Any], stock: torch.Tensor) -> torch.Tensor | None:
    """The inverse frequencies a frequency scheme must give, from the paper's formulas on the rotated frequency
    pairs (``stock``: the unpatched module's n rotated frequencies), independent of hf-posenc's code."""
    n = stock.shape[-1]
    if scheme in ("cope", "hardclip"):
        c = options["clip_low_n"]
        w = [1.0] * n
        for j in range(n - c, n):
            w[j] = 0.0 if scheme == "hardclip" else 0.5 * (1 + math.cos(math.pi * (j - (n - c)) / (c - 1)))
        return stock * torch.tensor(w, dtype=torch.float64)
    if scheme == "prope":  # keep the int(p·r // 2) highest frequencies of the r rotated dims (Barbero et al.)
        keep = int(options["p"] * (2 * n) // 2)
        return torch.cat([stock[:keep], torch.zeros(n - keep, dtype=torch.float64)])
    return None


class Refused(Exception):
    """``patch_model`` refused the scheme on this model (a ``ValueError`` naming the reason)."""


def _patch(model: Any, scheme: str, **options: Any) -> Any:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TAPA's "needs training" warning
        try:
            return hf_posenc.patch_model(model, scheme, **options)
        except ValueError as exc:  # FamilyRefused, or options the model's rope type cannot take: the reason
            raise Refused(str(exc)) from exc


# Reloading a checkpoint may change the memory layout of some weights (Transformers converts MoE experts on load),
# and with it the summation order: measured up to 1.2e-7 on these tiny models, for stock models too. Where a scheme
# moves the logits by less (CoPE over a model whose lowest frequencies are already ~0), the reloaded frequencies are
# compared bit for bit as well.
RELOAD_ATOL = 1e-6


def _reload_close(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=RELOAD_ATOL, msg=lambda m: f"{what}: {m}")


def _round_trip(model: Any, ids: torch.Tensor, expected: torch.Tensor, keep: Any = None) -> None:
    """save_pretrained → from_pretrained (the patched class again, the same weights bit for bit, the same logits)
    and export_stock → plain Transformers' class (the same logits). ``keep``: a directory to leave both checkpoints
    in (``<keep>/patched``, ``<keep>/stock``), for the fresh-process check."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(keep) if keep is not None else Path(tmp)
        model.save_pretrained(root / "patched")
        loaded = AutoModelForCausalLM.from_pretrained(root / "patched",
                                                      attn_implementation=model.config._attn_implementation).eval()
        assert type(loaded) is type(model), (type(loaded), type(model))
        want = model.state_dict()
        for name, tensor in loaded.state_dict().items():
            assert torch.equal(tensor, want[name]), f"save/load changed {name}"
        # buffers that are not saved are rebuilt by the family's init on load (FalconH1's Mamba mup_vector): the
        # patched class must run that init, not leave uninitialised memory
        want = dict(model.named_buffers())
        for name, tensor in loaded.named_buffers():
            assert torch.equal(tensor, want[name]), f"save/load did not rebuild the buffer {name}"
        # the scheme itself survives bit for bit (its effect on tiny logits can be below the reload tolerance)
        freqs = rotary_inv_freqs(model)
        for name, tensor in rotary_inv_freqs(loaded).items():
            assert torch.equal(tensor, freqs[name]), f"save/load changed the frequencies {name}"
        _reload_close(logits(loaded, ids), expected, "save/load round trip")
        if hf_posenc.get_scheme(model).name in FREQUENCY_SCHEMES:
            hf_posenc.export_stock(model, root / "stock")
            stock = AutoModelForCausalLM.from_pretrained(root / "stock", attn_implementation="eager").eval()
            assert not type(stock).__name__.endswith("PosencForCausalLM"), type(stock)
            # the export folds an attention factor into q/k (gpt-oss's YaRN): another rounding, up to 3e-6
            torch.testing.assert_close(logits(stock, ids), expected, rtol=1e-5, atol=10 * RELOAD_ATOL,
                                       msg=lambda m: f"stock export: {m}")


def _generation(model: Any, ids: torch.Tensor, steps: int = 3) -> None:
    cached = model.generate(ids, max_new_tokens=steps, do_sample=False, use_cache=True, pad_token_id=0,
                            eos_token_id=None)
    assert torch.equal(cached, greedy_without_cache(model, ids, steps)), "cached generation != full forward"


def active_options(stock: Any, scheme: str) -> dict[str, Any]:
    """The active settings of a frequency scheme on ``stock``: CoPE/HardClip clip at most the pairs it rotates
    (partial rotary such as GPT-NeoX or StableLM may rotate fewer than the setting clips)."""
    active = FREQUENCY_SCHEMES[scheme][1]
    if "clip_low_n" in active:
        pairs = [f.shape[-1] for f in rotary_inv_freqs(stock).values()]
        active = {**active, "clip_low_n": min([active["clip_low_n"], *pairs])}
    return active


def check_frequency_scheme(stock: Any, scheme: str, ids: torch.Tensor, reference: torch.Tensor,
                           round_trip: bool, keep: Any = None) -> None:
    """Identity settings bitwise equal; active settings: frequencies by the formula, cached generation equal to
    the full forward, and (``round_trip``) save/load giving the same logits."""
    identity, active = FREQUENCY_SCHEMES[scheme][0], active_options(stock, scheme)
    model = _patch(copy.deepcopy(stock), scheme, layers="all", **identity)
    assert torch.equal(logits(model, ids), reference), f"{scheme} {identity}: logits differ from the unpatched model"
    before = rotary_inv_freqs(stock)
    model = _patch(copy.deepcopy(stock), scheme, layers="all", **active)
    after = rotary_inv_freqs(model)
    for name, freqs in before.items():
        want = expected_inv_freq(scheme, active, freqs)
        if want is not None:
            torch.testing.assert_close(after[name], want, rtol=1e-6, atol=0, msg=f"{scheme} frequencies of {name}")
    out = logits(model, ids)
    assert not torch.equal(out, reference), f"{scheme} {active} changed nothing"
    _generation(model, ids)
    if round_trip:
        _round_trip(model, ids, out, keep)


def check_tapa(stock: Any, ids: torch.Tensor) -> None:
    model = patched_for_round_trip(stock, "tapa")
    out = logits(model, ids)
    assert torch.isfinite(out).all(), "tapa: non-finite logits"
    _generation(model, ids)
    _round_trip(model, ids, out)


def move_tape_states(model: Any) -> Any:
    """Give a zero-initialised TAPE model non-zero state updates (seeded), so its positional states move."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer, "tape"):
                for weight in (layer.tape.attn_mix.weight, layer.tape.w2.weight):
                    weight.copy_(torch.randn(weight.shape, generator=g) * 0.1)
    return model


def patched_for_round_trip(stock: Any, scheme: str) -> Any:
    """The patched model whose checkpoint the round trips save: active settings of a frequency scheme, TAPA's
    reference backend, TAPE with moving states."""
    if scheme in FREQUENCY_SCHEMES:
        return _patch(copy.deepcopy(stock), scheme, layers="all", **active_options(stock, scheme))
    if scheme == "tapa":
        return _patch(copy.deepcopy(stock), "tapa", backend="reference")
    return move_tape_states(_patch(copy.deepcopy(stock), "tape"))


def check_tape(stock: Any, ids: torch.Tensor, reference: torch.Tensor) -> None:
    model = _patch(copy.deepcopy(stock), "tape")
    out = logits(model, ids)
    assert torch.equal(out, reference), "tape: zero-initialised TAPE changed the logits"
    model = move_tape_states(model)  # make the positional states move, then check the cache and the round trip
    out = logits(model, ids)
    _generation(model, ids)
    _round_trip(model, ids, out)


def check_registered(stock: Any, scheme: str, ids: torch.Tensor) -> None:
    """A scheme registered from outside the package, with its default options: finite logits and cached
    generation equal to the full forward (its own identity settings and formulas are its package's to test)."""
    model = _patch(copy.deepcopy(stock), scheme)
    assert torch.isfinite(logits(model, ids)).all(), f"{scheme}: non-finite logits"
    _generation(model, ids)


def check_family(model_type: str, schemes: tuple[str, ...] | None = None,
                 round_trip_schemes: tuple[str, ...] = ("cope",), triage: bool = False,
                 keep: Any = None) -> dict[str, dict[str, str]]:
    """Run the checks of each scheme (default: every registered one) on a tiny ``model_type``:
    ``{scheme: {"status", "reason"?}}``.

    A refusal (a ``ValueError`` from ``patch_model``) is recorded with its reason; a tiny config that cannot be
    built makes the row untested with the reason; any other failure propagates (a test failure)."""
    schemes = table_schemes() if schemes is None else schemes
    reason = static_refusal(model_type)
    if reason is not None:
        return {s: {"status": "refused", "reason": reason} for s in schemes}
    try:
        stock = stock_model(model_type)
    except TinyConfigError as exc:
        return {s: {"status": "untested", "reason": f"no tiny config: {exc}"} for s in schemes}
    ids = input_ids()
    try:
        reference = logits(stock, ids)
    except Exception as exc:  # the unpatched model itself does not run: a scheme is refused, or cannot be checked
        failed = f"the unpatched tiny model's forward fails: {type(exc).__name__}: {exc}"[:300]
        return {s: _refused_or(stock, s, {"status": "untested", "reason": failed}) for s in schemes}
    results = {}
    for scheme in schemes:
        try:
            if scheme in FREQUENCY_SCHEMES:
                check_frequency_scheme(stock, scheme, ids, reference, scheme in round_trip_schemes,
                                       None if keep is None else f"{keep}/{scheme}")
            elif scheme == "tapa":
                check_tapa(stock, ids)
            elif scheme == "tape":
                check_tape(stock, ids, reference)
            else:
                check_registered(stock, scheme, ids)
        except Refused as exc:
            results[scheme] = {"status": "refused", "reason": refusal_reason(str(exc))}
            continue
        except Exception as exc:  # a failed check: a test failure, or (triage=True) the table generator's finding
            if not triage:
                raise
            results[scheme] = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        results[scheme] = {"status": "verified"}
    return results


def _refused_or(stock: Any, scheme: str, otherwise: dict[str, str]) -> dict[str, str]:
    """``scheme``'s refusal on ``stock`` as a table entry, or ``otherwise`` where patch_model accepts it."""
    try:
        _patch(copy.deepcopy(stock), scheme)
    except Refused as exc:
        return {"status": "refused", "reason": refusal_reason(str(exc))}
    return otherwise


def refusal_reason(message: str) -> str:
    """The reason part of a refusal message (between the model type and the list of verified families)."""
    reason = message.split(": ", 1)[-1]
    return reason.split(". See `hf-posenc families`")[0].split(". Families verified")[0].rstrip(".")


def universe() -> list[str]:
    return rotary_causal_lm_types()


__all__ = ["FREQUENCY_SCHEMES", "TinyConfigError", "check_family", "patched_for_round_trip", "stock_model",
           "tiny_config", "universe"]
