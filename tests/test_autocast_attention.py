"""The schemes' own attention under autocast. A Llama layer of an fp32 model trained with ``bf16=True`` (autocast)
hands attention mixed dtypes on CUDA: the projections in bf16, but q and k rotated by fp32 RoPE tables, so fp32 q/k
beside a bf16 v (a TAPA run on an H100 stopped at the kernel's one-dtype check). SDPA's inputs are cast by autocast;
TAPA's and TAPE's fused attention cast them the same way. fp16 here: the Triton interpreter has no bf16."""

import warnings

import pytest
import torch

import hf_posenc
from hf_posenc.schemes.tapa.attention import tapa_attention_forward
from hf_posenc.schemes.tape.attention import tape_fused_attention_forward
from tiny import tiny_model

ENTRIES = {"tapa": tapa_attention_forward, "tape": tape_fused_attention_forward}


def _attention(scheme: str) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TAPA's "needs training"
        model = hf_posenc.patch_model(tiny_model("llama", "sdpa"), scheme, backend="triton")
    return model.model.layers[0].self_attn


@pytest.mark.upstream
@pytest.mark.parametrize("scheme", list(ENTRIES))
def test_mixed_dtypes_under_autocast_run_in_the_autocast_dtype(scheme):
    attn, entry = _attention(scheme), ENTRIES[scheme]
    g = torch.Generator().manual_seed(0)
    hq, hkv, d = attn.config.num_attention_heads, attn.config.num_key_value_heads, attn.head_dim
    width = 2 * d if scheme == "tape" else d  # TAPE's fused kernel reads [V | E]
    q, k = torch.randn(2, hq, 12, d, generator=g), torch.randn(2, hkv, 12, d, generator=g)
    v = torch.randn(2, hkv, 12, width, generator=g).half()
    with torch.autocast("cpu", dtype=torch.float16):
        out, _ = entry(attn, q, k, v, None)
    expected, _ = entry(attn, q.half(), k.half(), v, None)  # cast by hand, no autocast
    assert out.dtype == torch.float16 and torch.equal(out, expected)
    with pytest.raises(TypeError, match="share one dtype"):  # without autocast a mix is still the caller's error
        entry(attn, q, k, v, None)
