"""The command line's vocabulary: the names its arguments accept (analyses, evaluation tasks, experiment names and
sizes, selftest sizes and dtypes, weight dtypes), defined once.

A leaf of the standard library only: :mod:`hf_posenc_cli.arguments` builds the parsers from it, and the library's
modules that run the commands (``hf_posenc.diagnostics``, ``hf_posenc.evaluation``, ``hf_posenc.selftest``) and
the research harness (``hf_posenc_experiments``) import their names from it, without importing the parsers (an
import-linter contract in pyproject.toml keeps it free of ``hf_posenc``, torch and Transformers, and a test keeps
it free of anything outside the standard library).
"""

from __future__ import annotations

PERTURBATION_SCORES = ("all", "unperturbed")  # hf_posenc.diagnostics.perturbation.SCORES
ANALYSES = ("frequency_usage", "positional_heads", "disentanglement", "distance_bias", "semantic_decay", "perturbation",
            "phase_regime")
# the evaluation tasks: hf-posenc's own (perplexity, passkey), then lm-evaluation-harness's RULER tasks
# (hf_posenc.evaluation.harness runs them, with the hf-posenc[eval] extra); the first six build their samples locally
RULER_LOCAL_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_cwe", "ruler_fwe")
RULER_TASKS = RULER_LOCAL_TASKS + ("niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multiquery",
                                   "niah_multivalue", "ruler_qa_squad", "ruler_qa_hotpot")
EVAL_TASKS = ("ppl", "passkey") + RULER_TASKS
NEEDLE_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)  # the passkey's needle
RULER_SAMPLES = 50  # samples per length of each RULER task (lm-eval builds 500; published RULER figures use all)
WEIGHT_DTYPES = ("auto", "float32", "bfloat16", "float16")
# experiment name -> its module in hf_posenc_experiments and its config in hf_posenc_experiments.cli.CONFIGS
EXPERIMENTS = ("length_generalisation", "tapa_trainability", "context_extension", "prope_gemma_ratio", "tapa_depth",
               "tapa_scale", "tape_arithmetic", "cope_passkey", "tape_peft", "tapa_curves")
EXPERIMENT_SIZES = ("toy", "small", "gpu")  # gpu: only the experiments made for a GPU
SELFTEST_SIZES = ("realistic", "small", "tiny")
SELFTEST_DTYPES = ("bf16", "fp16", "fp32")
