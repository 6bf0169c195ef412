"""Miniature reproductions of the papers' claims (``hf-posenc experiment NAME``): every scheme side by side on a
real held-out text, several seeds, in minutes on 2 CPU cores.

* :mod:`.length_generalisation`: train from scratch at L, evaluate at L…8L;
* :mod:`.corpus`: Jane Austen's novels from Debian's ``r-cran-janeaustenr`` (read by :mod:`.rdata`), one novel
  held out; :mod:`.tokenizer`: the byte-level tokenizer;
* :mod:`.runner`: cells (scheme × seed) trained with :mod:`hf_posenc.training`, evaluated with
  :mod:`hf_posenc.evaluation`, cached, summarised as mean ± sd; :mod:`.report`: JSON, Markdown, PNG.

This is an application layer: it imports training, evaluation and the core, and nothing but the CLI imports it.
"""

from .config import LengthGeneralisationConfig, ModelSettings, TrainSettings
from .corpus import Corpus, austen_corpus, ngram_entropies

__all__ = ["LengthGeneralisationConfig", "ModelSettings", "TrainSettings", "Corpus", "austen_corpus",
           "ngram_entropies"]
