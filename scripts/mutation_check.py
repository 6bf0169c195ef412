#!/usr/bin/env python
"""Mutation check: proves that the test suite can fail.

Each mutation below is a named wrong edit of the code (a wrong head, a dropped mask, a frequency taper in the wrong
variable, ...). The check applies one at a time to a COPY of the repository (the shared working tree is never
touched), runs the tests listed for it in that copy, and expects them to fail. It exits 1, listing the culprits,
when a mutation survives (its tests still pass), when a mutation's anchor text no longer occurs exactly once in its
file (the code moved on: update the mutation so the check cannot silently rot), when a run errs instead of failing
(collection error, timeout, or the copy's code was not the code imported), or when the listed tests fail without any
mutation (a baseline run on an unmutated copy, so that a kill means something).

    python scripts/mutation_check.py                  # everything, 2 runs at a time
    python scripts/mutation_check.py --list           # names, files and tests
    python scripts/mutation_check.py --only tapa-ignores-alpha tape-psi-reads-residual-stream
    python scripts/mutation_check.py --anchors        # only check that every anchor is present once (seconds)

The copy holds the files git tracks or would track (``git ls-files -co --exclude-standard``) under
:data:`COPIED`; the tests run with the copy as working directory and first entry of ``sys.path`` and
``PYTHONPATH``, and a pytest plugin written into the copy checks that ``hf_posenc`` was imported from it (hf-posenc
is installed editable, pointing at the main working tree, so a slip here would test the unmutated code). Each run is
a process forked from the check itself after it has imported what every run needs (:data:`PRELOADED`: torch,
transformers' modeling utilities, PEFT, pytest; about 9 s of one core, most of a typical run) and nothing of
hf-posenc, which each run imports from its copy; a run is its own process group, killed whole at its timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What the tests import or read (scripts and requirements: the upstream lane's runner and the lock it reads).
COPIED = ("hf_posenc", "hf_posenc_cli", "hf_posenc_experiments", "tests", "recipes", "pyproject.toml", "README.md", "docs",
          "scripts", "requirements")
GUARD_MODULE = "_mutation_guard"
GUARD_OK = "MUTATION-GUARD hf_posenc imported from the copy"
GUARD = f'''"""Written by scripts/mutation_check.py: fail the run if hf_posenc is not the mutated copy's."""
import importlib
import os

import pytest


def pytest_collection_finish(session):
    module = importlib.import_module("hf_posenc")
    root = os.path.realpath(os.environ["HF_POSENC_MUTATION_COPY"])
    where = os.path.realpath(module.__file__)
    if not where.startswith(root + os.sep):
        pytest.exit(f"hf_posenc was imported from {{where}}, not from the mutated copy {{root}}", returncode=3)
    print("\\n{GUARD_OK}", flush=True)
'''

TAPE_EQ = "tests/test_tape_equations.py"
TAPA_EQ = "tests/test_tapa_equations.py"


@dataclass(frozen=True)
class Mutation:
    """A wrong edit: replace ``old`` (which must occur exactly once in ``file``) by ``new``; ``tests`` must fail."""

    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str


MUTATIONS: tuple[Mutation, ...] = (
    # -- TAPE (paper §3.2, eq. 6-8) ----------------------------------------------------------------------------
    Mutation(
        "tape-query-heads-use-the-wrong-kv-state", "hf_posenc/schemes/tape/attention.py",
        "q, k = rotate(q, tables).transpose(1, 2), rotate(k, tables).transpose(1, 2)",
        "q, k = rotate(q, [t.flip(2) for t in tables]).transpose(1, 2), rotate(k, tables).transpose(1, 2)",
        (f"{TAPE_EQ}::test_layer_follows_eq_6_to_8",),
        "eq. 6 with GQA: query head h must be rotated by the state of its own key/value head h // group",
    ),
    Mutation(
        "tape-psi-reads-residual-stream", "hf_posenc/schemes/tape/modeling.py",
        "e = tape.mlp_update(tape.attention_update(e, e_tilde), m)",
        "e = tape.mlp_update(tape.attention_update(e, e_tilde), x)",
        (f"{TAPE_EQ}::test_layer_follows_eq_6_to_8",),
        "eq. 8: ψ reads the token MLP's output, not the residual stream after it",
    ),
    Mutation(
        "tape-eq7-removed-state-not-mixed-by-attention", "hf_posenc/schemes/tape/modeling.py",
        "e = tape.mlp_update(tape.attention_update(e, e_tilde), m)",
        "e = tape.mlp_update(tape.attention_update(e, e.repeat_interleave(e_tilde.shape[2] // e.shape[2], dim=2)), m)",
        (f"{TAPE_EQ}::test_layer_follows_eq_6_to_8",),
        "eq. 7: Ẽ = P·E, not E",
    ),
    Mutation(
        "tape-updated-state-not-passed-to-the-next-layer", "hf_posenc/schemes/tape/modeling.py",
        "states = torch.cat([states[:, :, :t], e[:, :, None], states[:, :, t + 1 :]], dim=2)",
        "states = states",
        (f"{TAPE_EQ}::test_model_logits_follow_eq_6_to_8_across_layers",),
        "§3.2: the contextualised state of layer l is the positional encoding of layer l+1",
    ),
    Mutation(
        "tape-psi-without-silu", "hf_posenc/schemes/tape/modeling.py",
        "gate = nn.functional.silu(self.w_psi(mlp_out))",
        "gate = self.w_psi(mlp_out)",
        (f"{TAPE_EQ}::test_layer_follows_eq_6_to_8",),
        "eq. 8: ψ is an MLP (silu gate, as in the released code), not a linear map",
    ),
    Mutation(
        "tape-attention-update-without-residual", "hf_posenc/schemes/tape/modeling.py",
        "else e + mix_heads(head_map(self.attn_mix), e_tilde)",
        "else mix_heads(head_map(self.attn_mix), e_tilde)",
        (f"{TAPE_EQ}::test_layer_follows_eq_6_to_8",),
        "§3.3: the update is added to E through a residual connection (zero init = the original model)",
    ),
    Mutation(
        "tape-gemma3-layer-types-share-one-state", "hf_posenc/schemes/tape/modeling.py",
        "return layer_types.index(config.layer_types[layer_idx]) if len(layer_types) > 1 else 0",
        "return 0",
        (f"{TAPE_EQ}::test_layer_follows_eq_6_to_8",),
        "Gemma3 sliding and global layers rotate with different bases: each type keeps its own state",
    ),
    Mutation(
        "tape-layer-reads-only-the-old-cache-keyword", "hf_posenc/schemes/tape/modeling.py",
        "cache = layer_cache(past_key_values, cache)",
        "cache = past_key_values",
        ("tests/test_upstream_api.py::test_tape_layer_reads_the_cache_under_either_keyword",),
        "Transformers 5.24 passes the KV cache as `cache=`: a layer reading only `past_key_values` decodes without "
        "the states of past keys, silently",
    ),
    Mutation(
        "tape-fused-kernel-gets-values-without-states-at-init", "hf_posenc/schemes/tape/attention.py",
        "if mix_states and (not e_tilde_unread or name == ATTN_NAME):",
        "if mix_states and not e_tilde_unread:",
        ("tests/test_tape.py::test_generate_equals_full_forward_for_every_backend_and_cache",),
        "backend='triton' at init on CPU: the fused kernel reads [V | E] even while W_att = 0 leaves Ẽ unread",
    ),
    Mutation(
        "config-record-and-rope-parameters-never-compared", "hf_posenc/families/base.py",
        "        if implied != rope:",
        "        if False:",
        ("tests/test_checkpoint.py::test_a_config_whose_record_and_rope_parameters_disagree_is_refused_naming_both",),
        "config.json holds the scheme twice: an edited copy must be an error, not a model running another scheme "
        "than get_scheme reports",
    ),
    Mutation(
        "stock-export-patched-again-silently", "hf_posenc/patching.py",
        "    if not compose:\n        check_not_an_export(config, config_scheme)",
        "    if compose:\n        check_not_an_export(config, config_scheme)",
        ("tests/test_checkpoint.py::test_patching_a_stock_export_is_refused_naming_its_source_unless_composed",),
        "a stock export already carries its scheme as stock rope types: patching it again applies the scheme twice",
    ),
    Mutation(
        "tape-sdpa-path-mixes-values-into-the-state", "hf_posenc/schemes/tape/attention.py",
        "e_tilde, _ = fn(attn, q, k, values_and_states[..., d:], attention_mask, **kwargs)",
        "e_tilde, _ = fn(attn, q, k, values_and_states[..., :d], attention_mask, **kwargs)",
        (f"{TAPE_EQ}::test_layer_follows_eq_6_to_8",),
        "eq. 7 on the fused backends (second attention call): Ẽ = P·E, not P·V",
    ),
    Mutation(
        "tape-one-map-path-mixes-values-into-the-state", "hf_posenc/schemes/tape/attention.py",
        "return out[..., :d], out[..., d:], None",
        "return out[..., :d], out[..., :d], None",
        (f"{TAPE_EQ}::test_layer_follows_eq_6_to_8",),
        "eq. 7 on SDPA's CPU inference path (one map over [V | E]): Ẽ = P·E, not P·V",
    ),
    Mutation(
        "tape-one-map-lets-a-query-see-the-next-key", "hf_posenc/schemes/tape/one_map.py",
        "dtype=torch.bool, device=query.device).triu_(1).unsqueeze(1)",
        "dtype=torch.bool, device=query.device).triu_(2).unsqueeze(1)",
        ("tests/test_tape_one_map.py::test_one_map_is_eager_attention_over_values_and_states",),
        "causal attention inside the diagonal block: query i attends keys 0..i only",
    ),
    Mutation(
        "tape-one-map-drops-the-last-attended-key", "hf_posenc/schemes/tape/one_map.py",
        "(attended * torch.arange(1, lk + 1, device=attended.device))",
        "(attended * torch.arange(0, lk, device=attended.device))",
        ("tests/test_tape_one_map.py::test_one_map_is_eager_attention_over_values_and_states",),
        "a masked block may skip only keys past the last one its rows attend (left-padded batches)",
    ),
    Mutation(
        "tape-skips-e-tilde-while-w-att-trains", "hf_posenc/schemes/tape/modeling.py",
        "and not (torch.is_grad_enabled() and weight.requires_grad) and not bool(weight.any()))",
        "and not bool(weight.any()))",
        ("tests/test_tape.py::test_zero_initialised_maps_get_gradients_at_init",),
        "W_att = 0 makes Ẽ unread in the forward pass, but W_att's gradient is Ẽ·grad: training must compute it",
    ),
    Mutation(
        "masks-read-on-the-host-in-every-layer", "hf_posenc/schemes/masks.py",
        'known = getattr(attention_mask, "_hf_posenc_read", None)',
        "known = None",
        ("tests/test_decode_host.py::test_a_decode_step_reads_the_mask_on_the_host_once",),
        "a host read of the mask waits for the device: once per forward, not once per layer of every decode step",
    ),
    Mutation(
        "tape-fused-path-copies-the-cache", "hf_posenc/schemes/tape/attention.py",
        "o, e = fused(query, key, value[..., :d], value[..., d:], scale=scaling,",
        "o, e = fused(query, key, value[..., :d].contiguous(), value[..., d:].contiguous(), scale=scaling,",
        ("tests/test_tape.py::test_fused_kernel_reads_values_and_states_in_place",),
        "the kernel reads V and E in place from the [V | E] cache rows; copying them costs decode a cache per layer",
    ),
    Mutation(
        "tape-kernel-dk-misses-the-softmax-scale", "hf_posenc/kernels/tape/triton_tape.py",
        "(dk * scale).to(DK_.dtype.element_ty)",
        "dk.to(DK_.dtype.element_ty)",
        ("tests/test_tape_kernel.py::test_triton_forward_and_gradients_match_reference",),
        "backward of S = scale·q kᵀ: dk = scale·dSᵀ·q",
    ),
    Mutation(
        "tape-fused-dq-drops-the-masked-tiles", "hf_posenc/kernels/tape/triton_tape.py",
        "if FUSE_DQ:",
        "if FUSE_DQ and not MASKED:",
        ("tests/test_tape_kernel.py::test_triton_forward_and_gradients_match_reference",),
        "the fused backward adds dq from every tile it visits, the diagonal and padded ones included",
    ),
    Mutation(
        "tape-fused-dq-misses-the-softmax-scale", "hf_posenc/kernels/tape/triton_tape.py",
        "return self.dq.mul_(self.dq_scale).to(self.dq_dtype)",
        "return self.dq.to(self.dq_dtype)",
        ("tests/test_tape_kernel.py::test_triton_forward_and_gradients_match_reference",),
        "the fused backward's fp32 accumulator holds dS·k; dq = scale·dS·k",
    ),
    # -- TAPA (paper §3 eq. 12, §4.5 eq. 16) -------------------------------------------------------------------
    Mutation(
        "tapa-cached-keys-one-position-early", "hf_posenc/schemes/tapa/attention.py",
        "torch.arange(1 - kv_len, 1, device=device)",
        "torch.arange(-kv_len, 0, device=device)",
        ("tests/test_tapa.py::test_kv_cache_generation_equals_full_forward",),
        "with a cache and no padding, key j sits kv_len - 1 - j positions before the last query (|m - n| of eq. 12)",
    ),
    Mutation(
        "tapa-ignores-key-padding", "hf_posenc/schemes/tapa/attention.py",
        "key_padding_mask=key_padding, q_segment_ids=segments",
        "key_padding_mask=None, q_segment_ids=segments",
        (f"{TAPA_EQ}::test_left_padding_equals_unpadded_rows",),
        "padded keys must not be attended",
    ),
    Mutation(
        "tapa-ignores-alpha", "hf_posenc/schemes/tapa/attention.py",
        'float(options["alpha"])', "0.1",
        (f"{TAPA_EQ}::test_full_pass_follows_eq_12_and_16",),
        "eq. 12: the distance exponent α is an option",
    ),
    Mutation(
        "tapa-ignores-theta", "hf_posenc/schemes/tapa/attention.py",
        'float(options["theta"])', "0.5",
        (f"{TAPA_EQ}::test_full_pass_follows_eq_12_and_16",),
        "eq. 11-12: the amplitude/phase split θ is an option",
    ),
    Mutation(
        "tapa-ignores-phase", "hf_posenc/schemes/tapa/attention.py",
        'options["phase"], options["backend"]', '"quadratic", options["backend"]',
        (f"{TAPA_EQ}::test_full_pass_follows_eq_12_and_16",),
        "§4.5 eq. 16: phase='linear' is the ablation",
    ),
    Mutation(
        "tapa-decode-key-positions-off-by-one", "hf_posenc/schemes/tapa/attention.py",
        "after = key_padding.flip(-1).long().cumsum(-1).flip(-1) - key_padding.long()",
        "after = key_padding.flip(-1).long().cumsum(-1).flip(-1)",
        (f"{TAPA_EQ}::test_decode_equals_the_full_pass", "tests/test_tapa.py::test_left_padded_batch_equals_one_by_one"),
        "eq. 12 needs |m − n| exactly: a cached key keeps its position",
    ),
    Mutation(
        "tapa-ignores-sliding-window", "hf_posenc/schemes/tapa/attention.py",
        'extra = {} if sliding_window is None else {"sliding_window": sliding_window}',
        "extra = {}",
        ("tests/test_tapa.py::test_sliding_window_layers_keep_their_window",),
        "Gemma2/3 sliding layers keep their window under TAPA",
    ),
    Mutation(
        "tapa-ignores-packed-sequences", "hf_posenc/schemes/tapa/attention.py",
        "segments = find_packed_sequence_indices(q_pos) if packed else None",
        "segments = None",
        ("tests/test_tapa.py::test_packed_sequences_equal_separate_passes",),
        "packed documents must not attend across their boundary",
    ),
    Mutation(
        "tapa-linear-phase-subtracts", "hf_posenc/kernels/tapa/naive.py",
        "ph = q_p.sum(-1)[..., :, None] + k_p.sum(-1)[..., None, :]",
        "ph = q_p.sum(-1)[..., :, None] - k_p.sum(-1)[..., None, :]",
        (f"{TAPA_EQ}::test_full_pass_follows_eq_12_and_16",),
        "eq. 16: φ = (q_P, k_P)·1 = Σ q_P + Σ k_P",
    ),
    Mutation(
        "tapa-phase-normalised-by-the-amplitude-width", "hf_posenc/kernels/tapa/naive.py",
        "c_p = 1.0 / math.sqrt(args.phase_dims)",
        "c_p = 1.0 / math.sqrt(args.amp_dims)",
        (f"{TAPA_EQ}::test_full_pass_follows_eq_12_and_16",),
        "eq. 12: the phase is divided by √((1−θ)D)",
    ),
    Mutation(
        "tapa-kernel-phase-normalised-by-the-amplitude-width", "hf_posenc/kernels/tapa/triton_tapa.py",
        "math.log2(1.0 / math.sqrt(args.phase_dims))",
        "math.log2(1.0 / math.sqrt(args.amp_dims))",
        (f"{TAPA_EQ}::test_triton_kernel_in_the_model_follows_eq_12_and_16",),
        "eq. 12 in the Triton kernel: the phase is divided by √((1−θ)D)",
    ),
    Mutation(
        "tapa-fused-backward-drops-the-phase-part-of-dq", "hf_posenc/kernels/tapa/triton_tapa.py",
        "            acc[..., da:] *= c_phase",
        "            acc[..., da:] *= 0.0",
        ("tests/test_tapa_kernel.py::test_kernel_matches_reference[gqa2-causal-37-fused-bwd]",),
        "the fused backward's dQ carries the chain rule through the phase product (−2π·c_A·Σ dS·g_P·k_P)",
    ),
    Mutation(
        "tapa-dispatch-runs-the-reference-on-cpu", "hf_posenc/kernels/tapa/dispatch.py",
        '    if q.device.type == "cpu":\n        return tapa_attention_chunked.with_args(q, k, v, args)',
        '    if q.device.type == "cpu":\n        return tapa_attention_reference.with_args(q, k, v, args)',
        ("tests/test_tapa_kernel.py::test_dispatch",),
        "the one TAPA dispatcher runs the chunked O(N)-memory path on CPU (float64, or without the interpreter)",
    ),
    Mutation(
        "perturbation-scores-the-perturbed-targets", "hf_posenc/diagnostics/perturbation.py",
        "    return chunk, positions, ~moved[1:]",
        "    return chunk, positions, ~moved[:-1]",
        ("tests/test_diagnostics.py::test_perturbation_scores_only_unperturbed_targets_paired_with_the_clean_text",),
        "Han & Ji §4.1: only the targets the perturbation left alone are scored (entry t scores token t + 1)",
    ),
    Mutation(
        "tapa-attention-ignores-autocast", "hf_posenc/schemes/tapa/attention.py",
        "    query, key, value = autocast_inputs(query, key, value)  # as autocast casts SDPA's inputs",
        "    pass",
        ("tests/test_autocast_attention.py::test_mixed_dtypes_under_autocast_run_in_the_autocast_dtype[tapa]",),
        "under autocast the attention inputs take autocast's dtype, as SDPA's do (fp32 q/k beside a bf16 v on CUDA)",
    ),
    # -- CoPE (§4.2 eq. 10) and HardClip ---------------------------------------------------------------------------
    Mutation(
        "cope-taper-linear-in-theta-not-in-the-index", "hf_posenc/schemes/cope/config.py",
        "w[n_freq - clip_low_n :] = 0.5 * (1.0 + torch.cos(torch.linspace(0.0, math.pi, clip_low_n, dtype=torch.float64)))",
        "theta = 10000.0 ** (-torch.arange(n_freq - clip_low_n, n_freq, dtype=torch.float64) / n_freq)\n"
        "            w[n_freq - clip_low_n :] = 0.5 * (1.0 + torch.cos(math.pi * (theta[0] - theta)"
        " / (theta[0] - theta[-1]).clamp_min(1e-300)))",
        ("tests/test_schemes.py::test_cope_frequencies_follow_eq10",),
        "eq. 10 in the index form of the authors' code: linspace over the clipped indices",
    ),
    Mutation(
        "cope-clips-the-highest-frequencies", "hf_posenc/schemes/cope/config.py",
        "w[n_freq - clip_low_n :] = 0.5 * (1.0 + torch.cos(torch.linspace(0.0, math.pi, clip_low_n, dtype=torch.float64)))",
        "w[:clip_low_n] = 0.5 * (1.0 + torch.cos(torch.linspace(math.pi, 0.0, clip_low_n, dtype=torch.float64)))",
        ("tests/test_schemes.py::test_cope_frequencies_follow_eq10",),
        "CoPE clips the LOW frequencies (the long wavelengths)",
    ),
    Mutation(
        "hardclip-zeroes-the-highest-frequencies", "hf_posenc/schemes/cope/config.py",
        "w[n_freq - clip_low_n :] = 0.0",
        "w[:clip_low_n] = 0.0",
        ("tests/test_schemes.py::test_hardclip_zeroes_lowest_frequencies",),
        "HardClip zeroes the lowest frequencies",
    ),
    Mutation(
        "cope-drops-the-base-attention-scaling", "hf_posenc/schemes/cope/rope_types.py",
        "return inv_freq * w, scaling",
        "return inv_freq * w, 1.0",
        ("tests/test_schemes.py::test_cope_composes_with_abf_and_yarn",),
        "CoPE over YaRN keeps YaRN's attention scaling",
    ),
    # -- p-RoPE (§6.1, App. D) -------------------------------------------------------------------------------------
    Mutation(
        "prope-keeps-the-lowest-frequencies", "hf_posenc/schemes/prope/__init__.py",
        'params = {"rope_type": "proportional", "rope_theta": base["rope_theta"], "partial_rotary_factor": float(self.p)}',
        "kept = int(self.p * head_dim // 2)\n"
        "        factors = [3.0e38] * (head_dim // 2 - kept) + [1.0] * kept  # only the lowest `kept` rotate\n"
        '        params = {"rope_type": "longrope", "rope_theta": base["rope_theta"], "short_factor": factors,\n'
        '                  "long_factor": factors, "factor": 1.0, "attention_factor": 1.0,\n'
        '                  "original_max_position_embeddings": max_position_embeddings}',
        ("tests/test_schemes.py::test_prope_equals_the_papers_apply_p_rope",),
        "p-RoPE keeps the fraction p of the HIGHEST frequencies",
    ),
    Mutation(
        "prope-keeps-the-complementary-fraction", "hf_posenc/schemes/prope/__init__.py",
        '"partial_rotary_factor": float(self.p)}',
        '"partial_rotary_factor": float(1.0 - self.p)}',
        ("tests/test_schemes.py::test_prope_equals_the_papers_apply_p_rope",),
        "p is the fraction kept (p = 1 is RoPE, p = 0 NoPE)",
    ),
    # -- evaluation ---------------------------------------------------------------------------------------------------
    Mutation(
        "passkey-lines-joined-by-spaces", "hf_posenc/evaluation/passkey.py",
        'return "\\n".join(lines)',
        'return " ".join(lines)',
        ("tests/test_evaluation.py::test_passkey_prompt_is_byte_exact",),
        "the Landmark-attention passkey format puts its five parts on separate lines",
    ),
    Mutation(
        "passkey-depth-counted-from-the-end", "hf_posenc/evaluation/passkey.py",
        "prefix = round(depth * n)\n        return passkey_prompt(prefix, n - prefix, key)",
        "prefix = round((1.0 - depth) * n)\n        return passkey_prompt(prefix, n - prefix, key)",
        ("tests/test_evaluation.py::test_passkey_prompt_fills_the_target_length",),
        "depth d puts round(d·n) filler characters BEFORE the needle",
    ),
    Mutation(
        "perplexity-scores-the-whole-window-not-the-stride", "hf_posenc/evaluation/perplexity.py",
        "yield begin, end, end - prev_end",
        "yield begin, end, end - begin",
        ("tests/test_evaluation.py::test_perplexity_equals_hand_loop",),
        "Press et al. stride method: only targets the previous window did not reach are scored",
    ),
    Mutation(
        "perplexity-fast-path-scores-shifted-hidden-states", "hf_posenc/evaluation/perplexity.py",
        "last_hidden_state[0, first_target - 1 : length - 1]",
        "last_hidden_state[0, first_target : length]",
        ("tests/test_evaluation.py::test_chunked_head_matches_full_logits",),
        "the hidden state at t predicts token t + 1",
    ),
    Mutation(
        "ruler-score-read-from-lm-evals-default-length", "hf_posenc/evaluation/harness.py",
        "score=float(sample[str(length)])",
        'score=float(sample["4096"])',
        ("tests/test_evaluation.py::test_ruler_runs_offline_on_patched_models_and_identity_scores_as_the_base",),
        "RULER's process_results scores a sample under its own length; every other length reads -1",
    ),
    Mutation(
        "ruler-punkt-download-not-skipped", "hf_posenc/evaluation/harness.py",
        "            _import_generator_without_punkt()",
        "            pass",
        ("tests/test_evaluation.py::test_ruler_runs_offline_on_patched_models_and_identity_scores_as_the_base",),
        "lm-eval's RULER generator fetches nltk's punkt_tab on import; the locally built tasks must fetch nothing",
    ),
    Mutation(
        "ruler-qa-tasks-not-refused-offline", "hf_posenc/evaluation/harness.py",
        "    if offline and qa:",
        "    if offline and not qa:",
        ("tests/test_evaluation.py::test_ruler_refuses_downloading_tasks_offline_naming_the_data",),
        "offline, a RULER task that downloads its text is refused before any model loads, naming the data",
    ),
    Mutation(
        "eval-cli-loads-models-before-checking-lm-eval", "hf_posenc/evaluation/cli.py",
        "        check_ruler_tasks([t for t in tasks if t in RULER_TASKS], args.lengths)",
        "        pass",
        ("tests/test_evaluation.py::test_ruler_without_lm_eval_names_the_extra",),
        "without lm-eval, `hf-posenc eval --tasks niah_single_1` names the extra before any model loads",
    ),
    # -- export for stock Transformers --------------------------------------------------------------------------------
    Mutation(
        "export-writes-the-taper-instead-of-its-inverse", "hf_posenc/schemes/cope/rope_types.py",
        'factors = taper_factors(rotary_dim(config, params) // 2, params["clip_low_n"], hard)',
        'factors = 1.0 / taper_factors(rotary_dim(config, params) // 2, params["clip_low_n"], hard)',
        ("tests/test_export_stock_equivalence.py",),
        "LongRoPE divides the frequencies by its factors: f_j = 1/w_j",
    ),
    Mutation(
        "export-passes-a-registered-rope-type-through", "hf_posenc/export.py",
        "if rope_type not in ROPE_TYPES and not scaled_prope:",
        "if not scaled_prope:",
        ("tests/test_registry.py::test_export_reads_the_registry_for_a_scheme_from_outside",
         "tests/test_export_stock_equivalence.py"),
        "a rope type a scheme registered is unknown to stock Transformers: it is written as per-dimension factors",
    ),
    Mutation(
        "export-ignores-a-declared-dynamic-rope-type", "hf_posenc/export.py",
        "if registered is None or not registered.dynamic:",
        "if True:",
        ("tests/test_registry.py::test_a_dynamic_rope_type_from_outside_is_refused_by_both_exports_naming_the_scheme",
         "tests/test_gguf_export.py::test_what_llama_cpp_cannot_express_is_refused_before_anything_is_written"),
        "a rope type declared dynamic has no fixed factors: both exports refuse it, naming the scheme",
    ),
    Mutation(
        "export-ignores-the-rope-types-closed-form-factors", "hf_posenc/export.py",
        "exact = registered.factors(config, params, layer_type) if registered and registered.factors else None",
        "exact = None",
        ("tests/test_export_stock_equivalence.py",),
        "CoPE over the default base is exported as f = 1/w exactly (bitwise logits), not as ratios",
    ),
    Mutation(
        "export-takes-float64-default-frequencies", "hf_posenc/export.py",
        "default = (1.0 / (theta ** exponent)).double()",
        "default = 1.0 / (theta ** exponent.double())",
        ("tests/test_registry.py::test_export_reads_the_registry_for_a_scheme_from_outside",),
        "the ratios are over Transformers' float32 default frequencies, so halving gives exactly 2",
    ),
    Mutation(
        "registry-keeps-a-scripts-none-package", "hf_posenc/schemes/registry.py",
        'package = getattr(sys.modules.get(config.__module__), "__package__", None) or ""',
        'package = getattr(sys.modules.get(config.__module__), "__package__", None)',
        ("tests/test_registry.py::test_a_scheme_defined_in_a_script_has_no_package_and_leaves_the_remote_code_alone",),
        "a scheme from __main__ has no package; remote code must not fail on it (every save did)",
    ),
    Mutation(
        "gguf-carries-every-family", "hf_posenc/gguf_export.py",
        'if arch not in table["rope_freqs_architectures"]:',
        "if False:",
        ("tests/test_gguf_export.py::test_what_llama_cpp_cannot_express_is_refused_before_anything_is_written",
         "tests/test_gguf_export.py::test_a_family_whose_llama_cpp_architecture_cannot_carry_the_scheme_is_refused_naming_all_three"),
        "a family whose llama.cpp architecture reads no rope_freqs would silently run plain RoPE: refused",
    ),
    Mutation(
        "gguf-looks-families-up-by-model-type", "hf_posenc/gguf_export.py",
        "hf_arch = family.stock_model_class.__name__",
        "hf_arch = family.stock_model_type",
        ("tests/test_gguf_export.py::test_families_llama_cpp_converts_to_its_llama_architecture_export",),
        "the converter's registry is keyed by the architecture class config.json names (MistralForCausalLM -> llama)",
    ),
    Mutation(
        "tapa-chunked-drops-a-workers-key-gradients", "hf_posenc/kernels/tapa/chunked.py",
        "    for other in per_worker[1:]:\n",
        "    for other in per_worker[1:-1]:\n",
        ("tests/test_tapa_chunked.py::test_worker_threads_give_the_single_thread_result",),
        "dK and dV are summed over every worker's partials: one left out is a wrong gradient with threads only",
    ),
    Mutation(
        "rate-grid-chooses-on-the-scored-text", "hf_posenc_experiments/length_generalisation.py",
        'validation_loss(result["model_dir"], prepared["validation_file"]',
        'validation_loss(result["model_dir"], prepared["eval_file"]',
        ("tests/test_experiments.py::test_prope_gemma_ratio_toy_end_to_end",),
        "a rate chosen on the text it is judged by would favour each row on its own score: the validation text",
    ),
    Mutation(
        "rate-grid-rows-keep-their-own-rate", "hf_posenc_experiments/length_generalisation.py",
        "(spec, model, dataclasses.replace(train, learning_rate=chosen[label]))",
        "(spec, model, train)",
        ("tests/test_experiments.py::test_prope_gemma_ratio_toy_end_to_end",),
        "after the grid every row's seeds run at the rate it chose, not at the preset's",
    ),
    Mutation(
        "a-grid-edge-choice-counts-as-tuned", "hf_posenc_experiments/claims.py",
        "        edge = self.at_edge()\n        if edge:\n",
        "        edge = self.at_edge()\n        if False:\n",
        ("tests/test_experiment_claims.py::test_a_negative_reading_without_a_fair_record_is_not_a_fair_test",
         "tests/test_experiment_claims.py::test_a_choice_inside_the_grid_is_fair_and_named"),
        "an arm whose best rate is the grid's highest or lowest has not had its best rate found: no fair test",
    ),
    Mutation(
        "a-widened-grid-stops-at-the-grid", "hf_posenc_experiments/rate_grid.py",
        "    if len(beyond) >= extensions:\n        return None\n",
        "    if True:\n        return None\n",
        ("tests/test_rate_grid.py::test_widening_goes_one_step_beyond_the_end_its_best_sits_at_until_it_is_inside_or_capped",
         "tests/test_rate_grid.py::test_bracketing_runs_finds_each_arms_best_inside_what_it_tried_and_only_those_at_an_end_pay"),
        "an arm whose best rate is an end of the grid must try a rate beyond it, or its best is never bracketed",
    ),
    Mutation(
        "a-widened-grid-ignores-its-cap", "hf_posenc_experiments/rate_grid.py",
        "    if len(beyond) >= extensions:\n",
        "    if len(beyond) >= extensions + 1:\n",
        ("tests/test_rate_grid.py::test_widening_goes_one_step_beyond_the_end_its_best_sits_at_until_it_is_inside_or_capped",),
        "the widening stops after the rates beyond each end that the settings allow, so an experiment's cost is bounded",
    ),
    Mutation(
        "settings-fingerprint-keeps-unused-optional-settings", "hf_posenc_experiments/config.py",
        "            if f.metadata.get(LEFT_OUT_AT_DEFAULT) and item == f.default:",
        "            if False:",
        ("tests/test_experiments.py::test_an_optional_setting_at_its_default_leaves_the_settings_and_their_fingerprint_as_without_it",),
        "the rate grid at its empty default would change the fingerprint of every report that nests these settings",
    ),
    Mutation(
        "quantizer-log-keeps-llama-cpp-pythons-verbosity", "hf_posenc/gguf_export.py",
        "    logger.setLevel(logging.DEBUG)\n",
        "",
        ("tests/test_gguf_export.py::test_a_failing_quantizer_raises_with_its_logs_tail_and_restores_the_output",),
        "after any Llama(verbose=False) in the process, llama.cpp's error lines were dropped: the failure said nothing",
    ),
    Mutation(
        "export-inverts-the-frequency-ratio-over-a-scaled-base", "hf_posenc/export.py",
        "default / inv.clamp_min(1e-300)",
        "inv / default.clamp_min(1e-300)",
        ("tests/test_export_stock_equivalence.py",),
        "over YaRN/PI/Llama-3 bases the factor is default / patched frequency",
    ),
    Mutation(
        "export-drops-the-attention-factor", "hf_posenc/export.py",
        '"attention_factor": float(attention_factor),',
        '"attention_factor": 1.0,',
        ("tests/test_export_stock_equivalence.py",),
        "CoPE over YaRN keeps YaRN's attention scaling in the stock config",
    ),
    # -- training recipes ---------------------------------------------------------------------------------------------
    Mutation(
        "recipe-overrides-ignored", "hf_posenc/training/config.py",
        "apply_overrides(data, list(overrides or []))",
        "apply_overrides(data, [])",
        ("tests/test_training.py::test_bad_recipes_name_the_key_or_path",),
        "key=value overrides on the command line change the recipe",
    ),
    Mutation(
        "recipe-override-values-not-read-as-yaml", "hf_posenc/training/config.py",
        'node[parts[-1]] = read_yaml(raw) if raw else ""',
        "node[parts[-1]] = raw",
        ("tests/test_training.py::test_bad_recipes_name_the_key_or_path",),
        "override values are YAML (numbers, lists, booleans), not strings",
    ),
    Mutation(
        "patched-class-skips-model-level-init-on-load", "hf_posenc/families/base.py",
        "        return False\n",
        "        return True\n",
        ("tests/test_families.py::test_family_checks_give_its_table_row[falcon_h1]",),
        "a patched class reloads its family's unsaved buffers (FalconH1's mup_vector) through the family's init",
    ),
    Mutation(
        "sharded-run-saves-one-ranks-partitions", "hf_posenc/training/trainer.py",
        "save_output(final, model_dir, save_tokenizer, state_dict=state,",
        "save_output(final, model_dir, save_tokenizer, state_dict=None,",
        ("tests/test_distributed.py::test_deepspeed_zero3_matches_one_process[tape]",),
        "a ZeRO-3 run saves the gathered state dict: every LoRA and TAPE weight whole",
    ),
    Mutation(
        "chunked-loss-reads-a-zero3-partitioned-head", "hf_posenc/training/trainer.py",
        'if head is None or hasattr(head.weight, "ds_id"):',
        "if head is None:",
        ("tests/test_distributed.py::test_deepspeed_zero3_matches_one_process[cope]",),
        "under ZeRO-3 the head's weight exists only inside its forward: the model computes the loss",
    ),
    Mutation(
        "sequence-parallel-resume-retrains-the-first-shards", "hf_posenc/training/sequence_parallel.py",
        "for _ in range((global_step % per_epoch) * accumulate):",
        "for _ in range(0):",
        ("tests/test_sequence_parallel.py::test_a_resume_advances_deepspeeds_loader_past_the_trained_micro_batches",
         "tests/test_distributed.py::test_sequence_parallel_zero3_resumes_after_a_kill"),
        "a resumed sequence-parallel run continues past the micro-batches its checkpoint trained",
    ),
    Mutation(
        "tape-one-map-path-bypasses-the-sequence-parallel-wrapper", "hf_posenc/schemes/tape/attention.py",
        "return (not attn.training and q.device.type",
        "return (q.device.type",
        ("tests/test_sequence_parallel.py::test_gradients_match_one_process[tape]",),
        "in training TAPE attends through the registered function, which DeepSpeed's wrapper replaces",
    ),
    Mutation(
        "chunked-training-loss-drops-the-logit-scale", "hf_posenc/training/trainer.py",
        "scale, softcap = output_logit_transform(self.causal_lm.config)",
        "scale, softcap = 1.0, output_logit_transform(self.causal_lm.config)[1]",
        ("tests/test_training.py::test_chunked_loss_reproduces_the_family_head[cohere-config0]",),
        "Cohere's logit_scale and Granite's logits_scaling belong to the head: the chunked loss must apply them",
    ),
    # -- static caches under torch.compile --------------------------------------------------------------------------
    Mutation(
        "tapa-attention-traced-in-compiled-generation", "hf_posenc/schemes/compiled.py",
        "    if not compiled_inference():\n        return plain\n",
        "    if True:\n        return plain\n",
        ("tests/test_static_cache.py::test_compiled_static_cache_generation_is_one_graph_and_equals_the_dynamic_cache[tapa]",),
        "compiled generation: the attention stays one opaque op (its launch planning would break the graph)",
    ),
    Mutation(
        "compiled-decoding-reads-the-written-slots", "hf_posenc/schemes/tape/attention.py",
        "attention_call(tape_fused_attend, tape_fused_attend_every_slot,",
        "attention_call(tape_fused_attend, None,",
        ("tests/test_static_cache.py::test_compiled_static_cache_generation_is_one_graph_and_equals_the_dynamic_cache[tape-triton]",),
        "a compiled decoding step reads every slot (no host read), so that a CUDA graph captures its attention",
    ),
    Mutation(
        "tapa-chunked-backend-called-graph-safe", "hf_posenc/schemes/tapa/attention.py",
        'every = None if options["backend"] == "chunked" else',
        'every = None if False else',
        ("tests/test_static_cache.py::test_compiled_attention_calls_the_graph_safe_op_only_where_every_slot_is_exact",),
        "TAPA's chunked path reads the host: a CUDA graph must not capture it",
    ),
    Mutation(
        "every-slot-reads-the-host", "hf_posenc/schemes/masks.py",
        "        return key, value, attention_mask == KEY_REAL\n",
        "        return written_keys(key, value, attention_mask)\n",
        ("tests/test_decode_host.py::test_a_compiled_decoding_step_reads_nothing_on_the_host[tapa]",),
        "what a CUDA graph captures reads nothing on the host",
    ),
    Mutation(
        "every-slot-attends-to-unwritten-slots", "hf_posenc/schemes/masks.py",
        "        return key, value, attention_mask == KEY_REAL\n",
        "        return key, value, attention_mask != KEY_PADDING\n",
        ("tests/test_static_cache.py::test_compiled_static_cache_generation_is_one_graph_and_equals_the_dynamic_cache[tapa-triton]",),
        "the slots a static cache has not written yet are masked in a compiled decoding step",
    ),
    Mutation(
        "every-slot-for-a-static-cache-prefill", "hf_posenc/schemes/masks.py",
        "(q_len == 1 and sliding_window is None)",
        "(sliding_window is None)",
        ("tests/test_static_cache.py::test_static_cache_key_states_mark_padding_and_unwritten_slots",),
        "several queries in a static cache would see the slots after them by index: they read the written slots",
    ),
    Mutation(
        "graph-safe-op-tagged-unsafe-for-cuda-graphs", "hf_posenc/schemes/compiled.py",
        "and not graph_safe",
        "and True",
        ("tests/test_decode_host.py::test_a_compiled_decoding_step_reads_nothing_on_the_host[tape]",),
        "Inductor captures the decoding step's attention in its CUDA graphs only if the op is not tagged unsafe",
    ),
    Mutation(
        "static-cache-mask-reads-the-offset-on-the-host", "hf_posenc/schemes/masks.py",
        "    if isinstance(q_offset, torch.Tensor):\n",
        "    if False:\n",
        ("tests/test_static_cache.py::test_static_cache_key_states_mark_padding_and_unwritten_slots",
         "tests/test_static_cache.py::test_compiled_static_cache_generation_is_one_graph_and_equals_the_dynamic_cache"),
        "a static cache's mask is built from its tensor offset with tensor operations (no recompilation per step)",
    ),
    # -- experiments and their measurements -------------------------------------------------------------------------
    Mutation(
        "tapa-packs-position-jumps-despite-a-mask", "hf_posenc/schemes/tapa/attention.py",
        "packed = attention_mask is None and q_len == kv_len and position_ids is not None",
        "packed = q_len == kv_len and position_ids is not None",
        ("tests/test_tapa.py::test_position_jumps_are_packing_only_without_a_mask[reference]",),
        "Transformers' rule: jumps in position ids are packed documents only without a mask (perturbation diagnostics)",
    ),
    Mutation(
        "passkey-digits-ranked-over-the-whole-vocabulary", "hf_posenc/evaluation/passkey.py",
        "predicted = [digit_ids[j] for j in among.argmax(-1).tolist()]",
        "predicted = logits[[i - 1 for i in positions]].argmax(-1).tolist()",
        ("tests/test_experiments.py::test_key_digit_accuracy_counts_digits_ranked_first",),
        "the teacher-forced key accuracy ranks the right digit among the ten digits, not among every token",
    ),
    Mutation(
        "reproduction-interval-ignores-the-new-seeds", "hf_posenc_experiments/reproduce.py",
        "half = t * stats[\"sd\"] * math.sqrt(1 / n + 1 / m)",
        "half = t * stats[\"sd\"] * math.sqrt(1 / n)",
        ("tests/test_experiments.py::test_reproducibility_uses_the_prediction_interval_of_a_mean",),
        "the prediction interval of a mean of m new seeds: sd * sqrt(1/n + 1/m), not the committed mean's error",
    ),
    Mutation(
        "cope-passkey-windows-after-the-novels", "hf_posenc_experiments/cope_passkey.py",
        '"train_files": [path, *prepared["train_files"]]}',
        '"train_files": [*prepared["train_files"], path]}',
        ("tests/test_experiment_cope_passkey.py::test_training_windows_hold_whole_passkeys_one_in_four",),
        "the passkey documents come first in the concat packing, so each fills exactly one training window",
    ),
    Mutation(
        "peft-r0-drops-the-scheme-modules", "hf_posenc/adapters/config.py",
        "modules_to_save=save or None, **kwargs)",
        "modules_to_save=None, **kwargs)",
        ("tests/test_checkpoint.py::test_lora_config_trains_the_scheme_modules_itself",),
        "peft.r: 0 trains the targets whole and still names the scheme's own modules (PEFT drops what is not saved)",
    ),
    # -- PEFT's own wrapping and saving over a patched base (issue #45: TRL's SFTTrainer, plain PEFT) ----------------
    Mutation(
        "peft-wrapping-leaves-the-scheme-modules-frozen", "hf_posenc/adapters/guard.py",
        'trained = train_scheme_modules(a["model"], config)',
        "trained = config",
        ("tests/test_checkpoint.py::test_every_adapter_loader_refuses_a_wrong_base_naming_the_fix_and_accepts_the_right_one"
         "[tape over cope-PeftModel.save_pretrained]",),
        "a hand-written LoraConfig (TRL's recipe) must train TAPE's blocks, or the run is plain LoRA on an identity TAPE",
    ),
    Mutation(
        "scheme-module-rule-ignores-exclude-modules", "hf_posenc/adapters/config.py",
        "if ours and not any(_saved(config, k) or _excluded(config, k) for k in ours):",
        "if ours and not any(_saved(config, k) for k in ours):",
        ("tests/test_checkpoint.py::test_a_scheme_module_kept_frozen_on_purpose_stays_frozen_without_a_word",),
        "exclude_modules (lora_config(scheme_modules=False)) keeps the scheme's modules frozen on purpose",
    ),
    Mutation(
        "peft-save-writes-no-adapter-record", "hf_posenc/adapters/guard.py",
        "    if caller_is_describing() or scheme_record(base) is None:\n        return",
        "    return",
        ("tests/test_checkpoint.py::test_every_adapter_loader_refuses_a_wrong_base_naming_the_fix_and_accepts_the_right_one"
         "[cope-PeftModel.save_pretrained]",),
        "trainer.save_model (PeftModel.save_pretrained) over a patched base writes the adapter record the check reads",
    ),
    Mutation(
        "transformers-adapter-save-writes-no-adapter-record", "hf_posenc/families/base.py",
        "                describe(self, save_directory)",
        "                pass",
        ("tests/test_checkpoint.py::test_every_adapter_loader_refuses_a_wrong_base_naming_the_fix_and_accepts_the_right_one",),
        "model.add_adapter then model.save_pretrained saves the adapter with its record, as a PeftModel's save does",
    ),
    # -- the command line (issue #36: help and argument errors without torch) ---------------------------------------
    Mutation(
        "cli-parsing-imports-hf-posenc", "hf_posenc_cli/arguments.py",
        'return metadata.version("hf-posenc")',
        'import hf_posenc\n        return hf_posenc.__version__',
        ("tests/test_cli.py::test_help_version_and_argument_errors_import_neither_hf_posenc_nor_torch",),
        "help, --version and argument errors must answer before hf_posenc (and so torch) is imported",
    ),
    Mutation(
        "library-may-import-the-console-command", "pyproject.toml",
        'forbidden_modules = ["hf_posenc_experiments", "hf_posenc_experiments.**", "hf_posenc_cli", "hf_posenc_cli.__main__"]',
        'forbidden_modules = ["hf_posenc_experiments", "hf_posenc_experiments.**", "hf_posenc_cli.__main__"]',
        ("tests/test_layers.py::test_the_library_importing_the_console_command_breaks_its_contract",),
        "the library imports of hf_posenc_cli only its standard-library vocabulary and parsers, never the console "
        "command that runs the library and the research harness",
    ),
    # -- the command line on a model without rotary embeddings, and -o's form (issue #45) ---------------------------
    Mutation(
        "info-reads-rope-parameters-of-any-config", "hf_posenc/cli.py",
        '"rope_parameters": getattr(config, "rope_parameters", None),',
        '"rope_parameters": config.rope_parameters,',
        ("tests/test_cli.py::test_info_describes_a_model_without_rotary_embeddings_and_says_no_scheme_applies",),
        "info on GPT-2 (no rope_parameters) reports the facts and exits 0, not an AttributeError",
    ),
    Mutation(
        "patch-loads-a-model-without-rotary-embeddings", "hf_posenc/cli.py",
        "    _refuse_without_rotary(args.source, args.gguf_file)\n    model = load_model(args.source, args.gguf_file)\n"
        "    patch_model(",
        "    model = load_model(args.source, args.gguf_file)\n    patch_model(",
        ("tests/test_cli.py::test_commands_refuse_a_model_without_rotary_embeddings_in_one_line_before_loading_it"
         "[command0]",),
        "patch refuses a non-rotary model from its config, in one line, before loading its weights",
    ),
    Mutation(
        "export-loads-a-model-without-rotary-embeddings", "hf_posenc/cli.py",
        "    _refuse_without_rotary(args.source, args.gguf_file)\n    if args.gguf is not None:",
        "    if args.gguf is not None:",
        ("tests/test_cli.py::test_commands_refuse_a_model_without_rotary_embeddings_in_one_line_before_loading_it"
         "[command1]",
         "tests/test_cli.py::test_commands_refuse_a_model_without_rotary_embeddings_in_one_line_before_loading_it"
         "[command2]"),
        "export (stock and GGUF) refuses a non-rotary model from its config, before loading its weights",
    ),
    Mutation(
        "diagnose-loads-a-model-without-rotary-embeddings", "hf_posenc/cli.py",
        '_refuse_without_rotary(path, args.gguf_file, "diagnose analyses how a model uses its rotary embedding")',
        "pass",
        ("tests/test_cli.py::test_commands_refuse_a_model_without_rotary_embeddings_in_one_line_before_loading_it"
         "[command3]",),
        "diagnose refuses a non-rotary model in one line (exit 2) before loading it, not with a layer-lookup error",
    ),
    Mutation(
        "scheme-option-form-checked-only-when-the-command-runs", "hf_posenc_cli/arguments.py",
        'metavar="KEY=VALUE", type=_key_value,',
        'metavar="KEY=VALUE",',
        ("tests/test_cli.py::test_a_scheme_option_without_a_key_and_value_is_an_argument_error_naming_the_form",),
        "-o without '=' is an argument error naming -o KEY=VALUE, answered while parsing (exit 2)",
    ),
    Mutation(
        "gguf-reader-missing-left-to-transformers", "hf_posenc/models.py",
        "    if gguf_file is not None:\n        require_gguf_reader(gguf_file)\n    return path, gguf_file",
        "    return path, gguf_file",
        ("tests/test_cli.py::test_the_embedded_model_without_the_gguf_reader_names_the_extra",
         "tests/test_cli.py::test_a_gguf_file_without_the_gguf_reader_names_the_extra_and_a_missing_one_is_named_first"),
        "without the gguf package, loading @smollm2 or a .gguf names pip install 'hf-posenc[gguf]', not Transformers' "
        "'Please install torch and gguf'",
    ),
    # -- resuming a training run (issue #45) -------------------------------------------------------------------------
    Mutation(
        "resume-lets-every-training-key-change", "hf_posenc/training/trainer.py",
        'CHANGEABLE_ON_RESUME = ("evaluation.", "training.logging_steps",',
        'CHANGEABLE_ON_RESUME = ("evaluation.", "training.", "training.logging_steps",',
        tuple(f"tests/test_training.py::test_resume_refuses_each_class_of_changed_training_key[{case}]"
              for case in ("learning-rate", "scheduler", "warmup", "steps", "seed")),
        "a resumed run may change what is logged or saved, never the learning rate, schedule, steps or seed",
    ),
    # -- the upstream lane on the newest torch (issue #45) -----------------------------------------------------------
    Mutation(
        "upstream-lane-leaves-torch-out", "scripts/upstream_lane.py",
        'UPSTREAM = ("torch", "transformers",',
        'UPSTREAM = ("transformers",',
        ("tests/test_upstream_lane.py::test_a_newer_torch_and_the_older_triton_it_pins_are_shown_and_blamed_as_such",),
        "the lane tests the newest torch and names it when it breaks a test",
    ),
    Mutation(
        "upstream-lane-calls-an-older-release-newer", "scripts/upstream_lane.py",
        """f"{'an older' if _older(*moved[n]) else 'a newer'} release of {n}""",
        """f"a newer release of {n}""",
        ("tests/test_upstream_lane.py::test_a_newer_torch_and_the_older_triton_it_pins_are_shown_and_blamed_as_such",),
        "the newest torch pins an older Triton than the lock's: the lane says older, not newer",
    ),
    Mutation(
        "upstream-lane-counts-the-cpu-wheel-as-another-torch", "scripts/upstream_lane.py",
        'return version.split("+", 1)[0]',
        "return version",
        ("tests/test_upstream_lane.py::test_the_torch_wheels_of_one_release_count_as_that_release",),
        "torch 2.13.0+cpu is the locked 2.13.0: not a moved package to blame",
    ),
    Mutation(
        "upstream-lane-skips-the-compile-lane-cell", "tests/test_compile_lane.py",
        "@pytest.mark.upstream\ndef test_one_cell_compiles_on_this_triton(one_cell):",
        "def test_one_cell_compiles_on_this_triton(one_cell):",
        ("tests/test_upstream_lane.py::test_the_lane_selects_the_interpreter_tests_and_the_compile_lane_without_its_seed",),
        "the kernels must compile on the newest torch's Triton, where the seed does not apply",
    ),
    # -- TAPA's phase regime and the hot start (eq. 12 at distance 1) --------------------------------------------
    Mutation(
        "tapa-hot-start-scales-q-and-k-by-the-whole-ratio", "hf_posenc/schemes/tapa/phase.py",
        'factor = math.sqrt(ratio) if phase == "quadratic" else ratio',
        "factor = ratio",
        ("tests/test_tapa_phase_regime.py::test_the_hot_start_reaches_its_target_and_leaves_the_amplitude_half",),
        "φ = q_P·k_P is bilinear: scaling each of q and k by the ratio scales the phase by its square",
    ),
    Mutation(
        "tapa-hot-start-scales-the-amplitude-half-too", "hf_posenc/schemes/tapa/phase.py",
        "torch.arange(amp_dims, head_dim)[None]).flatten()",
        "torch.arange(0, head_dim)[None]).flatten()",
        ("tests/test_tapa_phase_regime.py::test_the_hot_start_reaches_its_target_and_leaves_the_amplitude_half",),
        "the start must move only the phase of eq. 12, not the amplitude product",
    ),
    Mutation(
        "tapa-phase-regime-pairs-a-query-with-its-own-key", "hf_posenc/schemes/tapa/phase.py",
        "phase_at_distance_1(q[:, :, 1:], k[:, :, :-1], amp_dims, phase)",
        "phase_at_distance_1(q[:, :, 1:], k[:, :, 1:], amp_dims, phase)",
        ("tests/test_tapa_phase_regime.py::test_the_text_measure_pairs_each_query_with_the_previous_key",),
        "distance 1 is the query at m against the key at m − 1, not distance 0",
    ),
    Mutation(
        "recipe-scheme-init-is-ignored-by-the-trainer", "hf_posenc/training/trainer.py",
        "    if recipe.scheme.init:  # from scratch only (the recipe refuses it with model.path)",
        "    if False:",
        ("tests/test_tapa_phase_regime.py::test_a_recipe_starts_tapa_in_the_phase_regime_and_records_it",),
        "a hot start written in the recipe must reach the model that trains",
    ),
    # -- the verdict rule and the experiments' runner ---------------------------------------------------------------
    Mutation(
        "verdict-refuted-without-a-fair-record", "hf_posenc_experiments/claims.py",
        "        if status == REFUTED and not tuning.fair:",
        "        if False:",
        ("tests/test_experiment_claims.py::test_a_negative_reading_without_a_fair_record_is_not_a_fair_test",),
        "a negative reading without equal tuning in the paper's regime is not a refutation",
    ),
    Mutation(
        "verdict-ignores-the-paper-regime", "hf_posenc_experiments/claims.py",
        "        if not self.regime_reached:",
        "        if False:",
        ("tests/test_experiment_claims.py::test_a_negative_reading_without_a_fair_record_is_not_a_fair_test",),
        "a design outside the paper's regime cannot refute its claim",
    ),
    Mutation(
        "forked-cells-keep-every-torch-thread", "hf_posenc_experiments/runner.py",
        "    torch.set_num_threads(1)\n    try:\n        cell.run()",
        "    try:\n        cell.run()",
        ("tests/test_experiment_runner.py::test_forked_cells_equal_the_serial_run_in_order_and_cached",),
        "two workers on 2 cores with a thread pool each oversubscribe the cores",
    ),
    Mutation(
        "perturbation-batch-rows-scored-as-the-wrong-window", "hf_posenc/diagnostics/perturbation.py",
        "out[i] = nll[row]", "out[i] = nll[len(batch) - 1 - row]",
        ("tests/test_diagnostics.py::test_batched_windows_score_as_each_window_alone",),
        "the windows of one length run as one batch: each row's losses belong to the window it holds",
    ),
    Mutation(
        "launched-rank-ends-in-the-interpreters-shutdown", "hf_posenc/training/cli.py",
        "    end_launched_rank(status)\n",
        "",
        ("tests/test_training.py::test_a_launched_rank_that_succeeded_ends_without_the_interpreters_shutdown",),
        "a launched rank that succeeded can still abort in the interpreter's shutdown (C++ destructors, SIGABRT)",
    ),
)


# -- anchors ---------------------------------------------------------------------------------------------------------
def anchor_problems(mutation: Mutation, root: Path = REPO) -> list[str]:
    """What is wrong with a mutation's anchor and test list in the tree at ``root`` (empty when it can be applied)."""
    problems = []
    path = root / mutation.file
    if mutation.old == mutation.new:
        problems.append(f"{mutation.name}: old and new text are the same")
    if not path.is_file():
        problems.append(f"{mutation.name}: {mutation.file} does not exist")
    else:
        count = path.read_text(encoding="utf-8").count(mutation.old)
        if count != 1:
            problems.append(f"{mutation.name}: the anchor occurs {count} times in {mutation.file} (must be once): "
                            f"{mutation.old!r}")
    if not mutation.tests:
        problems.append(f"{mutation.name}: no tests listed")
    for test in mutation.tests:
        file, _, function = test.partition("::")
        test_path = root / file
        if not test_path.is_file():
            problems.append(f"{mutation.name}: test file {file} does not exist")
        elif function and not re.search(rf"^def {re.escape(function.split('[')[0])}\(", test_path.read_text(),
                                        re.MULTILINE):
            problems.append(f"{mutation.name}: {file} has no test function {function}")
    return problems


def check_names() -> list[str]:
    names = [m.name for m in MUTATIONS]
    return [f"mutation name {n!r} is used twice" for n in sorted({n for n in names if names.count(n) > 1})]


# -- running ---------------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    name: str
    status: str  # killed | survived | error | anchor
    seconds: float = 0.0
    killed_by: str = ""
    detail: str = ""
    tests: list[str] = field(default_factory=list)


def copy_repository(destination: Path) -> None:
    """Copy the files git tracks or would track under :data:`COPIED` (the working-tree versions) to ``destination``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-c", "-o", "--exclude-standard", "--", *COPIED],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for rel in filter(None, listed):
        source = REPO / rel
        if not source.is_file():  # deleted in the working tree but still tracked
            continue
        target = destination / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def classify(name: str, rc: int, output: str, seconds: float, tests: list[str], baseline: bool = False) -> Outcome:
    guarded = GUARD_OK in output
    failed = re.findall(r"^FAILED (\S+)", output, re.MULTILINE)
    tail = "\n".join(output.strip().splitlines()[-25:])
    if not guarded:
        return Outcome(name, "error", seconds, detail=f"exit {rc}, the import guard did not pass:\n{tail}", tests=tests)
    if baseline:
        status = "passed" if rc == 0 else "error"
        return Outcome(name, status, seconds, detail="" if rc == 0 else f"exit {rc}:\n{tail}", tests=tests)
    if rc == 0:
        return Outcome(name, "survived", seconds, tests=tests)
    if rc == 1 and failed:
        return Outcome(name, "killed", seconds, killed_by=failed[0], tests=tests)
    return Outcome(name, "error", seconds, detail=f"exit {rc} (not a test failure):\n{tail}", tests=tests)


# What every test run imports before its first test (about 9 s of one core here, nearly all of a typical mutation's
# run: transformers' modeling utilities alone take 7): the check imports them once and forks each run from that
# process, which then imports only hf-posenc itself, from its copy. Nothing of hf-posenc may be imported before.
PRELOADED = ("torch", "transformers.modeling_utils", "peft", "pytest")
OWN_PACKAGES = ("hf_posenc", "hf_posenc_cli", "hf_posenc_experiments")


def preload() -> None:
    """Import :data:`PRELOADED` into this process (the one every run is forked from), refusing an hf-posenc already
    imported: a forked run would inherit it and test the main tree instead of its mutated copy."""
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)
    inherited = sorted(name for name in sys.modules if name.split(".")[0] in OWN_PACKAGES)
    if inherited:
        raise RuntimeError(f"the mutation check must start before hf-posenc is imported (found {inherited[:3]}): "
                           "run it as `python scripts/mutation_check.py`")


@dataclass
class Run:
    """A forked pytest run in progress: its own session (process group), its output in ``log``."""

    name: str
    mutation: Mutation | None
    tests: list[str]
    copy: Path
    log: Path
    pid: int
    start: float
    timed_out: bool = False


def _run_pytest_here(copy: Path, tests: list[str], log: Path) -> None:
    """The forked child: become the copy's ``python -m pytest`` (the copy as working directory, first on the path
    and on PYTHONPATH for the tests' own subprocesses; output to ``log``; no input) and exit with pytest's code.
    Never returns."""
    code = 4
    try:
        os.setsid()  # its own process group: a timeout kills the tests' subprocesses with it
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.chdir(copy)
        os.environ["PYTHONPATH"] = os.pathsep.join([str(copy)] + ([os.environ["PYTHONPATH"]]
                                                                 if os.environ.get("PYTHONPATH") else []))
        os.environ["HF_POSENC_MUTATION_COPY"] = str(copy)
        os.environ["HF_HUB_OFFLINE"] = "1"
        here = os.path.realpath(Path(__file__).parent)  # the script's folder, first on the path of `python SCRIPT`
        sys.path[:] = [str(copy)] + [p for p in sys.path if p and os.path.realpath(p) != here]
        import pytest

        code = int(pytest.main(["-x", "-q", "-rf", "--no-header", "-p", "no:cacheprovider", "-p", GUARD_MODULE,
                                *tests]))
    except BaseException:  # into the log: a run that errs is classified as an error, never as a kill
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def start_run(mutation: Mutation | None, tests: list[str]) -> Run | Outcome:
    """Apply ``mutation`` (None: the baseline) to a fresh copy and fork its pytest run (an :class:`Outcome` at once
    when the mutation's anchor is not in the copy)."""
    name = mutation.name if mutation else "baseline (no mutation)"
    copy = Path(tempfile.mkdtemp(prefix=f"hf-posenc-mutation-{mutation.name if mutation else 'baseline'}-"))
    copy_repository(copy)
    if mutation is not None:
        problems = anchor_problems(mutation, copy)
        if problems:
            shutil.rmtree(copy, ignore_errors=True)
            return Outcome(name, "anchor", detail="; ".join(problems), tests=tests)
        path = copy / mutation.file
        path.write_text(path.read_text(encoding="utf-8").replace(mutation.old, mutation.new), encoding="utf-8")
    (copy / f"{GUARD_MODULE}.py").write_text(GUARD)
    log = copy / "mutation-check-output.txt"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _run_pytest_here(copy, tests, log)
    return Run(name, mutation, tests, copy, log, pid, time.monotonic())


def _kill_group(run: Run) -> None:
    """Kill the run's process group: the run itself if it still runs, and whatever its tests left running."""
    try:
        os.killpg(run.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # nothing left of it
        pass


def finish_run(run: Run, status: int, keep: bool) -> Outcome:
    """Classify a finished run from its exit status and output, and drop its copy (unless ``keep``)."""
    seconds = time.monotonic() - run.start
    _kill_group(run)
    output = run.log.read_text(errors="replace") if run.log.is_file() else ""
    rc = -1 if run.timed_out else os.waitstatus_to_exitcode(status)
    if run.timed_out:
        output += f"\n(timed out after {seconds:.0f} s)"
    if keep:
        print(f"kept {run.copy}", file=sys.stderr)
    else:
        shutil.rmtree(run.copy, ignore_errors=True)
    return classify(run.name, rc, output, seconds, run.tests, baseline=run.mutation is None)


def run_all(jobs: list[tuple[Mutation | None, list[str]]], workers: int, timeout: float, keep: bool = False,
            report: Callable[[Outcome], None] = lambda outcome: None) -> list[Outcome]:
    """Run every (mutation, tests) pair in order, ``workers`` forked runs at a time; ``report`` hears each outcome
    as its run ends. Call :func:`preload` first (once) so that the runs start with the heavy imports done."""
    pending = list(reversed(jobs))
    running: dict[int, Run] = {}
    outcomes: list[Outcome] = []

    def done(outcome: Outcome) -> None:
        outcomes.append(outcome)
        report(outcome)

    try:
        while pending or running:
            while pending and len(running) < max(1, workers):
                started = start_run(*pending.pop())
                if isinstance(started, Outcome):
                    done(started)
                else:
                    running[started.pid] = started
            for pid, run in list(running.items()):
                reaped, status = os.waitpid(pid, os.WNOHANG)
                if reaped:
                    done(finish_run(running.pop(pid), status, keep))
                elif time.monotonic() - run.start > timeout and not run.timed_out:
                    run.timed_out = True
                    _kill_group(run)
            time.sleep(0.05)
    finally:  # interrupted: no run outlives the check, no copy stays behind
        for run in running.values():
            _kill_group(run)
            os.waitpid(run.pid, 0)
            if not keep:
                shutil.rmtree(run.copy, ignore_errors=True)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run (default 900)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--anchors", action="store_true", help="only check the anchors and test names")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of the tests without mutation")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copies (for debugging)")
    parser.add_argument("--json", type=Path, help="write the outcomes to this file")
    args = parser.parse_args(argv)

    selected = list(MUTATIONS)
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in MUTATIONS})
        if unknown:
            parser.error(f"unknown mutation(s) {unknown}; see --list")
        selected = [m for m in MUTATIONS if m.name in args.only]
    if args.list:
        for m in selected:
            print(f"{m.name}\n  {m.file}: {m.why}\n  tests: {' '.join(m.tests)}")
        return 0

    problems = check_names() + [p for m in selected for p in anchor_problems(m)]
    if args.anchors or problems:
        for p in problems:
            print(f"ANCHOR   {p}")
        print(f"{len(selected)} mutations, {len(problems)} anchor problem(s)")
        return 1 if problems else 0

    if args.jobs > 1:  # several pytest runs at once: one thread each (torch's default, one per core, oversubscribes)
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: the forked runs inherit its pool
    os.environ["HF_HUB_OFFLINE"] = "1"  # before huggingface_hub is imported: it reads the variable once
    start = time.monotonic()
    preload()
    jobs: list[tuple[Mutation | None, list[str]]] = [(m, list(m.tests)) for m in selected]
    if not args.no_baseline:
        union = list(dict.fromkeys(t for m in selected for t in m.tests))
        jobs.insert(0, (None, union))

    def report(outcome: Outcome) -> None:
        by = f"  by {outcome.killed_by}" if outcome.killed_by else ""
        print(f"{outcome.status.upper():9}{outcome.name} ({outcome.seconds:.0f} s){by}", flush=True)
        if outcome.detail:
            print("    " + outcome.detail.replace("\n", "\n    "), flush=True)

    outcomes = run_all(jobs, args.jobs, args.timeout, args.keep, report)
    total = time.monotonic() - start

    bad = [o for o in outcomes if o.status not in ("killed", "passed")]
    killed = sum(o.status == "killed" for o in outcomes)
    print(f"\n{killed} of {len(selected)} mutations killed in {total:.0f} s ({args.jobs} at a time)")
    for o in bad:
        print(f"NOT OK   {o.name}: {o.status}")
    if args.json:
        args.json.write_text(json.dumps({"seconds": total, "outcomes": [asdict(o) for o in outcomes]}, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
