"""The experiments' text: Jane Austen's six novels from Debian's ``r-cran-janeaustenr`` (public domain texts,
Project Gutenberg editions), read without R from the package's lazy-load database (:mod:`.rdata`).

``bash scripts/data/install_austen.sh`` downloads the Debian package with ``apt-get download`` and unpacks it
under ``$HF_POSENC_DATA`` (default ``~/.cache/hf-posenc/data``) without installing R; a system-wide
``apt-get install r-cran-janeaustenr`` is found as well.

Split: *Persuasion* (the last novel, 458k characters) is held out whole for evaluation; the other five novels
(3.5M characters) are the training documents. Holding out a whole novel means no passage, chapter or character
list of the evaluation text was seen in training.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

NOVELS = ("emma", "mansfieldpark", "northangerabbey", "prideprejudice", "sensesensibility", "persuasion")
HELDOUT = "persuasion"
DEBIAN_PACKAGE = "r-cran-janeaustenr"
_RDATA = Path("usr/lib/R/site-library/janeaustenr/data/Rdata")


def data_dir() -> Path:
    """Where ``scripts/data/install_austen.sh`` unpacks packages: ``$HF_POSENC_DATA`` or ``~/.cache/hf-posenc/data``."""
    return Path(os.environ.get("HF_POSENC_DATA") or Path.home() / ".cache" / "hf-posenc" / "data").expanduser()


def find_janeaustenr() -> Path:
    """The base path (``.../data/Rdata``) of the janeaustenr lazy-load database; a clear error naming the install
    script when neither the unpacked package nor a system-wide install is there."""
    candidates = [data_dir() / DEBIAN_PACKAGE / _RDATA, Path("/") / _RDATA]
    for base in candidates:
        if base.with_suffix(".rdb").is_file():
            return base
    raise FileNotFoundError(
        f"Jane Austen's novels ({DEBIAN_PACKAGE}) are not installed: none of "
        f"{', '.join(str(c.with_suffix('.rdb')) for c in candidates)} exists. Run `bash scripts/data/install_austen.sh` "
        "(downloads the Debian package and unpacks it, no R needed), or `apt-get install r-cran-janeaustenr`."
    )


INSTALL_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "data" / "install_austen.sh"  # source checkout


def ensure_janeaustenr() -> Path:
    """:func:`find_janeaustenr`, installing the novels first where they are missing and this is a source checkout
    (the README's editable install): ``scripts/data/install_austen.sh``, seconds; elsewhere the error names it."""
    import subprocess
    import sys

    try:
        return find_janeaustenr()
    except FileNotFoundError:
        if not INSTALL_SCRIPT.is_file():
            raise
    print(f"the experiments' text ({DEBIAN_PACKAGE}) is not installed: running scripts/data/install_austen.sh "
          "(downloads the Debian package and unpacks it, no R needed)", file=sys.stderr)
    done = subprocess.run(["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True)
    if done.returncode != 0:
        raise FileNotFoundError(f"installing {DEBIAN_PACKAGE} failed ({done.stderr.strip()[-500:]}); run `bash "
                                f"{INSTALL_SCRIPT}` yourself, or `apt-get install {DEBIAN_PACKAGE}`.")
    return find_janeaustenr()


def load_austen() -> dict[str, str]:
    """The six novels as ``name -> text`` (the package's lines joined by newlines)."""
    from .rdata import read_lazyload

    objects = read_lazyload(ensure_janeaustenr())
    missing = [n for n in NOVELS if n not in objects]
    if missing:
        raise ValueError(f"{DEBIAN_PACKAGE} lacks {missing}; found {sorted(objects)}")
    return {name: "\n".join("" if line is None else line for line in objects[name].value) for name in NOVELS}


@dataclass
class Corpus:
    """Training documents and the held-out text of an experiment.

    Attributes:
        name: a short description recorded in the results (source and split).
        train: ``name -> text`` of the training documents.
        heldout: the evaluation text (never trained on).
    """

    name: str
    train: dict[str, str]
    heldout: str

    def write_train_files(self, directory: str | os.PathLike) -> list[str]:
        """One ``.txt`` per training document under ``directory`` (what a recipe's ``data.files`` reads)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        return [write_text(out / f"{name}.txt", text) for name, text in self.train.items()]


def write_text(path: Path, text: str) -> str:
    """Write ``text`` to ``path`` unless the file already holds it (a rerun leaves it untouched); returns the path."""
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return str(path)


def austen_corpus() -> Corpus:
    """Five novels for training, *Persuasion* held out."""
    novels = load_austen()
    return Corpus(name=f"Jane Austen's novels (Debian {DEBIAN_PACKAGE}); train: "
                       f"{', '.join(n for n in NOVELS if n != HELDOUT)}; held out: {HELDOUT}",
                  train={n: t for n, t in novels.items() if n != HELDOUT}, heldout=novels[HELDOUT])


def ngram_entropies(ids: Sequence[int]) -> dict[str, float]:
    """Plug-in entropies (nats per token) of a token sequence, measured on the sequence itself.

    ``unigram``: H(X) of the token frequencies; ``bigram``: the conditional entropy H(X_t | X_{t-1}) of adjacent
    pairs. A model that uses no context cannot beat the first on this text, nor one that uses only the previous
    token the second, even if it had been fitted to the text itself (the plug-in estimates are, if anything, low),
    so a model below the bigram floor is using more than one token of context.
    """
    if len(ids) < 2:
        raise ValueError(f"need at least 2 tokens for the n-gram entropies, got {len(ids)}")
    n = len(ids)
    uni = Counter(ids)
    unigram = -sum(c / n * math.log(c / n) for c in uni.values())
    pairs = Counter(zip(ids[:-1], ids[1:]))
    firsts = Counter(ids[:-1])
    m = n - 1
    bigram = -sum(c / m * math.log(c / firsts[a]) for (a, _), c in pairs.items())
    return {"unigram": unigram, "bigram": bigram}
