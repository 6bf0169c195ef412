"""Miniature reproductions of the papers' claims (``hf-posenc experiment NAME``): every scheme side by side on a
real held-out text, several seeds, in minutes on 2 CPU cores.

* :mod:`.length_generalisation`: train from scratch at L, evaluate at L…8L;
* :mod:`.tapa_trainability`: TAPA's α, θ, phase, learning rate, warm-up and initial scale swept against RoPE/NoPE;
* :mod:`.context_extension`: a RoPE base pretrained at L, continued at 4L with each scheme, evaluated to 16L and
  by passkey retrieval;
* :mod:`.prope_gemma_ratio`: RoPE, p-RoPE 0.75 / 0.25 and NoPE at Gemma's θ / L, scored at L (the p-RoPE paper's
  claim), with what the design can detect;
* :mod:`.tapa_depth`: the TAPA sweep's best setting against RoPE and NoPE at 2 and 4 layers: does the gap shrink?
* :mod:`.tapa_curves`: RoPE (two rates), NoPE, TAPA and TAPA started in the paper's phase regime (the hot start),
  held-out loss at 1k, 2k and 4k steps with the phase at distance 1, and a per-method rate grid chosen on a
  validation text: was TAPA's gap the setup or the method?
* :mod:`.tapa_scale`: RoPE and TAPA (the paper's setting and the sweep's θ) at 15M parameters, 8 layers, L = 256, on
  one GPU (``--size gpu``, the Triton kernel): does the gap hold at a size where TAPA might train?
* :mod:`.tape_arithmetic`: RoPE and TAPE on reversed-digit addition, trained to 20 digits and tested to 40 (the TAPE
  paper's Fig. 5), exact-match accuracy by length, on one GPU (``--size gpu``);
* :mod:`.cope_passkey`: RoPE, CoPE and HardClip in the CoPE paper's recipe (ABF to its base / length ratio, passkey
  windows mixed into the continued training at 4L, YaRN x4 beyond), held-out loss and passkey retrieval at 4L, 8L
  and 16L, with the angles that say whether the paper's claims can show at this size;
* :mod:`.tape_peft`: 4-layer RoPE bases (several pretraining seeds) continued at 2L with PI x2, training the norms
  and TAPE's blocks (at the authors' width and at the paper's parameter ratio), or LoRA at r = 1…16, or nothing
  else, each arm at its own rate chosen on a validation text: TAPE's claim against the LoRA rank curve;
* :mod:`.why`: the position-generalization diagnostics on each experiment's trained models;
  :mod:`.reproduce`: a rerun with other seeds against a committed report;
* :mod:`.corpus`: Jane Austen's novels from Debian's ``r-cran-janeaustenr`` (read by :mod:`.rdata`), one novel
  held out; :mod:`.tokenizer`: the byte-level tokenizer;
* :mod:`.runner`: cells (scheme × seed) trained with :mod:`hf_posenc.training`, evaluated with
  :mod:`hf_posenc.evaluation`, cached, summarised as mean ± sd; :mod:`.report`: JSON, Markdown (rendered from the
  JSON alone, so ``--render-only`` rewrites it without training), PNG;
* :mod:`.stats`: the test every comparison carries (95 % t intervals, paired by seed or Welch's);
  :mod:`.claims`: the rotation angles that decide what a miniature can test, and the one line per paper claim
  (confirmed, refuted, cannot be tested) that ends every report.

A package of its own beside the library: it imports ``hf_posenc`` (training, evaluation, the core) and
``hf_posenc`` never imports it (an import-linter contract); ``hf-posenc experiment`` reaches it from
:mod:`hf_posenc_cli`. The research harness stays out of what ``import hf_posenc`` and checkpoints' remote code
carry, as the examples and research projects of Transformers and PEFT live outside their libraries.
"""

from .config import (
    ContextExtensionConfig, LengthGeneralisationConfig, ModelSettings, PropeGemmaRatioConfig, TapaDepthConfig,
    TapaTrainabilityConfig, TrainSettings, Variant,
)
from .corpus import Corpus, austen_corpus, ngram_entropies

__all__ = ["LengthGeneralisationConfig", "TapaTrainabilityConfig", "ContextExtensionConfig", "PropeGemmaRatioConfig",
           "TapaDepthConfig", "Variant", "ModelSettings", "TrainSettings", "Corpus", "austen_corpus", "ngram_entropies"]
