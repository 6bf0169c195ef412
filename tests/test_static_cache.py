"""Static KV caches (``StaticCache``, ``generate(cache_implementation="static")``, what ``torch.compile``d generation
uses) give the tokens and logits of a dynamic cache and of full forward passes, for every scheme and family.

A static cache hands attention all of its preallocated slots, most of them not written yet, with the queries in
the middle; an attention that assumes the queries are the last keys (TAPA, fused TAPE) reads the empty slots and
misplaces causality. Sliding windows of 6 on Gemma2/3 make the static sliding-window layers wrap during the test.
"""

import warnings

import pytest
import torch
from transformers import StaticCache

import hf_posenc
from hf_posenc.schemes.tape import TapeBlock
from tiny import ARCHS, greedy_without_cache, logits, random_ids, tiny_model

SCHEMES = {
    "cope": dict(clip_low_n=3),
    "hardclip": dict(clip_low_n=2),
    "prope": dict(p=0.5),
    "rope": dict(scaling="yarn", factor=2.0),
    "tapa": dict(backend="reference"),
    "tapa-triton": dict(backend="triton"),
    "tape": dict(frequencies={"scheme": "cope", "clip_low_n": 2}),
    "tape-triton": dict(backend="triton"),
}
PROMPT, NEW = 8, 6


def static_model(arch: str, scheme: str):
    """A tiny model of ``arch`` patched with ``scheme``; TAPE weights random so that the states matter."""
    config = {"sliding_window": 6} if arch in ("gemma2", "gemma3_text") else {}
    if arch == "gemma2" and scheme.startswith("tapa"):
        config.update(attn_logit_softcapping=None, final_logit_softcapping=None)  # TAPA scores take no soft-cap
    model = tiny_model(arch, "eager" if arch == "gemma2" else "sdpa", **config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TAPA warns that it needs training
        model = hf_posenc.patch_model(model, scheme.removesuffix("-triton"), **SCHEMES[scheme])
    g = torch.Generator().manual_seed(0)
    for block in (m for m in model.modules() if isinstance(m, TapeBlock)):
        for p in block.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.3
    # float64 where the backend takes it (the Triton kernels do not): cached and full passes then differ only by
    # rounding far below any logit gap
    return model if scheme.endswith("-triton") else model.double()


def refused(arch: str, scheme: str) -> bool:
    return scheme == "tape-triton" and arch in ("gemma2", "gemma3_text")  # the fused kernel has no sliding window


@pytest.mark.upstream
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("arch", ARCHS)
def test_static_cache_prefill_and_generation_equal_the_dynamic_cache_and_full_passes(arch, scheme):
    model = static_model(arch, scheme)
    triton = scheme.endswith("-triton")  # interpreted kernels are slow: one row, fewer tokens, no recomputation
    ids = random_ids(1 if triton else 2, PROMPT)
    if refused(arch, scheme):
        with pytest.raises(ValueError, match="no sliding window"):
            logits(model, ids)
        return
    with torch.no_grad():
        cache = StaticCache(config=model.config, max_cache_len=32)  # 24 slots stay unwritten
        prefill = model(ids, past_key_values=cache, use_cache=True).logits
        step = model(ids[:, :1], past_key_values=cache, use_cache=True).logits  # one decode step after it
    full = logits(model, ids)
    if scheme.startswith(("tapa", "tape-")):  # hf-posenc's own attention reads exactly the written keys
        assert torch.equal(prefill, full)
    else:  # Transformers' attention masks the empty slots (its eager Gemma2 differs from a full pass by ~1e-7)
        torch.testing.assert_close(prefill, full, rtol=1e-6, atol=1e-6)
    tol = 1e-5 if triton else 1e-6
    torch.testing.assert_close(step[:, -1], logits(model, torch.cat([ids, ids[:, :1]], 1))[:, -1], rtol=tol, atol=tol)

    kw = dict(max_new_tokens=3 if triton else NEW, do_sample=False, pad_token_id=0, eos_token_id=None)
    static = model.generate(ids, cache_implementation="static", **kw)
    assert torch.equal(static, model.generate(ids, **kw))
    if not triton:  # cached Triton decoding against full passes: test_tapa.py / test_tape.py
        assert torch.equal(static, greedy_without_cache(model, ids, NEW))


@pytest.mark.parametrize("scheme", ["tapa", "tape-triton"])
def test_static_cache_with_a_left_padded_batch_equals_the_dynamic_cache(scheme):
    model = static_model("qwen3", scheme)
    ids = random_ids(2, PROMPT)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None,
              output_logits=True, return_dict_in_generate=True)
    static = model.generate(ids, cache_implementation="static", **kw)
    dynamic = model.generate(ids, **kw)
    assert torch.equal(static.sequences, dynamic.sequences)
    for a, b in zip(static.logits, dynamic.logits):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("scheme", ["tapa", "tapa-triton", "tape-triton"])
def test_compiled_static_cache_generation_is_one_graph_and_equals_the_dynamic_cache(monkeypatch, scheme):
    """What ``generate(cache_implementation="static")`` compiles on CUDA (torch.compile of the decoding step), forced
    on CPU: the whole step is one graph (``fullgraph=True`` raises on any graph break; the attention is one opaque
    op), it is traced once for every decoding step (no recompilation as the cache fills), its attention reads every
    slot of the cache (``every_slot``: no host read, so a CUDA graph captures it) where the uncompiled prefill reads
    the written ones, and it generates the dynamic cache's tokens on a left-padded batch."""
    import collections
    import importlib

    from torch._dynamo.utils import counters
    from transformers.generation import CompileConfig

    model = static_model("llama", scheme)
    ids = random_ids(2, PROMPT)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    kw = dict(attention_mask=mask, max_new_tokens=3 if scheme.endswith("-triton") else NEW, do_sample=False,
              pad_token_id=0, eos_token_id=None, output_logits=True, return_dict_in_generate=True)
    dynamic = model.generate(ids, **kw)
    config = CompileConfig(fullgraph=True, mode="default")
    config._compile_all_devices = True  # Transformers compiles on CPU only when asked (its testing switch)
    calls = collections.Counter()
    module = importlib.import_module(f"hf_posenc.schemes.{scheme.removesuffix('-triton')}.attention")
    for name in ("every_slot", "written_keys"):
        monkeypatch.setattr(module, name, lambda *a, n=name, f=getattr(module, name): (calls.update([n]), f(*a))[1])
    torch._dynamo.reset()
    counters.clear()
    static = model.generate(ids, cache_implementation="static", compile_config=config, **kw)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"]
    layers = model.config.num_hidden_layers
    assert calls == {"written_keys": layers, "every_slot": layers * (kw["max_new_tokens"] - 1)}, calls
    assert torch.equal(static.sequences, dynamic.sequences)
    for a, b in zip(static.logits, dynamic.logits):  # fp32 (Triton) or float64, compiled or not: rounding apart
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_compiled_attention_calls_the_graph_safe_op_only_where_every_slot_is_exact(monkeypatch):
    """`compiled.attention_call`: the plain function eagerly; compiling without gradients, the op that reads every
    slot where `reads_every_slot` holds and a backend has one (TAPA's chunked path reads the host: None), else the
    op that reads the written slots."""
    from hf_posenc.schemes import compiled
    from hf_posenc.schemes.tapa.attention import tapa_attend as plain, tapa_attend_every_slot as every

    states = torch.zeros(2, 8, dtype=torch.int8)
    assert compiled.attention_call(plain, every, 1, 8, states) is plain  # not compiling
    monkeypatch.setattr(compiled, "compiled_inference", lambda: True)
    assert compiled.attention_call(plain, every, 1, 8, states) is every.op
    assert compiled.attention_call(plain, None, 1, 8, states) is plain.op
    assert compiled.attention_call(plain, every, 2, 8, states) is plain.op
    assert compiled.attention_call(plain, every, 1, 8, states, sliding_window=4) is plain.op
    # TAPA's attention function hands its chunked backend no graph-safe op, the others their own
    from types import SimpleNamespace

    from hf_posenc.schemes.tapa import attention as tapa

    calls = []
    for name in ("every_slot", "written_keys"):
        monkeypatch.setattr(tapa, name, lambda *a, n=name, f=getattr(tapa, name): (calls.append(n), f(*a))[1])
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 5, 8)
    states = torch.tensor([[1, 1, 1, 1, -1]], dtype=torch.int8)
    for backend in ("chunked", "reference"):
        options = dict(alpha=0.1, theta=0.5, phase="quadratic", backend=backend)
        module = SimpleNamespace(config=SimpleNamespace(hf_posenc={"options": options}), training=False)
        tapa.tapa_attention_forward(module, q, k, k, states, position_ids=torch.tensor([[3]]))
    assert calls == ["written_keys", "every_slot"]


def test_static_cache_key_states_mark_padding_and_unwritten_slots():
    """The mask of a static cache's slots (a tensor ``q_offset``): real, padding and unwritten keys, built without
    reading the offset on the host; ``written_keys`` keeps the written slots with their padding mask, and
    ``every_slot`` (a compiled decoding step: one query, no sliding window) all slots, the unwritten ones masked."""
    from hf_posenc.schemes.masks import (KEY_PADDING, KEY_REAL, KEY_UNWRITTEN, every_slot, padding_mask,
                                         reads_every_slot, written_keys)

    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])  # 4 past tokens and the current one
    states = padding_mask(2, 1, 8, q_offset=torch.tensor(4), attention_mask=mask)
    r, p, u = KEY_REAL, KEY_PADDING, KEY_UNWRITTEN
    assert states.dtype == torch.int8
    assert states.tolist() == [[p, p, r, r, r, u, u, u], [r, r, r, r, r, u, u, u]]
    assert padding_mask(1, 2, 4, q_offset=torch.tensor(1)).tolist() == [[r, r, r, u]]  # no mask: every key real
    k = torch.randn(2, 1, 8, 4)
    key, value, padding = written_keys(k, k + 1, states)
    assert torch.equal(key, k[:, :, :5]) and torch.equal(value, k[:, :, :5] + 1)
    assert padding.tolist() == (mask == 1).tolist()
    key, value, padding = every_slot(k, k + 1, states)
    assert key is k and padding.tolist() == (states == r).tolist()
    with pytest.raises(ValueError, match="covers 9 keys but attention received 8"):
        every_slot(k, k, torch.ones(2, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="4-D attention mask"):
        every_slot(k, k, torch.ones(2, 1, 1, 8, dtype=torch.bool))
    assert reads_every_slot(1, 8, states) and reads_every_slot(1, 5, padding[:, :5]) and reads_every_slot(1, 5, None)
    # queries but the last would see the slots after them (causality by index), a window would count the empty
    # slots, and equal lengths without a mask are searched for packed documents on the host
    assert not (reads_every_slot(2, 8, states) or reads_every_slot(1, 8, states, 4) or reads_every_slot(5, 5, None))
    with pytest.raises(ValueError, match="pass the mask of every past and current token"):
        padding_mask(2, 1, 8, q_offset=torch.tensor(5), attention_mask=mask)
