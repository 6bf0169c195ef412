"""TAPE: contextualized equivariant positional encoding for pretrained models (``tape-contextualized-equivariant-pe.md``).

Every token carries a positional state E: one complex number per RoPE frequency per key/value head, stored as
real channels ``[re_0 … re_{F−1}, im_0 … im_{F−1}]`` (F = D/2), initialised from the model's own rotary
frequencies (so TAPE composes with CoPE, p-RoPE or YaRN). In each layer:

* token mixing (eq. 6): queries and keys are multiplied by their token's state, ``q ⊙ z`` in RoPE's rotate-half
  form, so a logit depends on E only through z_i·conj(z_j) (invariant to a common rotation: eq. 4);
* attention-side update (eq. 7): the same softmax mixes the states, Ẽ = P·E. E rides along as extra value
  channels, so the KV cache stores the states of past keys (in the layers that mix them: 1.5× the plain cache
  there). Eager computes P·[V | E] in one call; SDPA on CPU in inference takes one map for both, blocked over
  query rows (:mod:`.one_map`); the other fused backends (sdpa elsewhere, flex, flash) make a second call with the
  same q, k and mask, or, with attention dropout, one call over [V | E] so that one dropout mask acts on both (see
  :func:`mix_values_and_states`); the fused Triton kernel in ``hf_posenc.kernels.tape`` does both in one pass. A
  zero-initialised head-mixing map (query heads → key/value heads) adds it back: E ← E + W_att·Ẽ; while W_att is
  exactly zero and needs no gradient (inference at init), Ẽ would be multiplied by zero and is not computed;
* MLP-side update (eq. 8): E ← E + W₂·(silu(W_ψ·m) ⊙ W₁·E), with m the token MLP's output, W₁/W₂ acting on the
  head axis and shared over frequencies and re/im (equivariant, eq. 5); W₂ starts at zero.

With W_att = W₂ = 0 the patched model is bit-identical to the original (§3.3). The states travel between decoder
layers as a second tensor beside the hidden features (:class:`TapeLayerMixin`): gradient checkpointing (reentrant
or not) tracks them, ``output_hidden_states`` returns the hidden features alone, :func:`record_tape_states` reads
the states, and ``output_attentions`` returns the attention maps under eager attention. The last layer (per
rotary layer type in Gemma3) computes no Ẽ: no later layer reads it.
"""

from __future__ import annotations

from ..masks import padding_mask
from ..registry import AttentionFunctions, register_scheme
from .attention import TapeAttentionMixin, mix_values_and_states, rotate, tape_attention, tape_fused_attention_forward
from .config import ATTN_NAME, TAPEConfig
from .modeling import TapeBlock, TapeLayerMixin, head_map, initial_state, install_tape, record_tape_states, uninstall_tape

register_scheme(TAPEConfig, attention=AttentionFunctions(name=ATTN_NAME, forward=tape_fused_attention_forward,
                                                         mask=padding_mask))

__all__ = [
    "TAPEConfig", "ATTN_NAME", "TapeBlock", "TapeLayerMixin", "TapeAttentionMixin", "head_map", "initial_state",
    "rotate", "mix_values_and_states", "tape_attention", "tape_fused_attention_forward", "install_tape",
    "uninstall_tape", "record_tape_states",
]
