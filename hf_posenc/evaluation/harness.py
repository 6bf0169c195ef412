"""lm-evaluation-harness's RULER tasks on in-memory models (the ``hf-posenc[eval]`` extra).

lm-eval's ``HFLM`` takes a model object, so a model patched in memory is scored as it is, without saving a
checkpoint. RULER's tasks build their samples from the model's own tokenizer at each requested length (lm-eval's task
metadata ``{"max_seq_lengths": [...], "tokenizer": DIR}``; the tokenizer is saved to a temporary directory for it),
500 per length; :class:`RulerTasks` builds them once per tokenizer, seeded, and picks the first ``samples`` of each
length, so every model answers the same prompts. The score of a sample is lm-eval's: the fraction of the expected
strings found in the greedy answer (RULER's ``string_match_all``; ``string_match_part`` for the QA tasks).

What a task needs beyond the tokenizer (lm-eval 0.4.13, read from its ``tasks/ruler`` sources):

* nothing: ``niah_single_1`` (a needle in the repeated "The grass is green..." haystack), ``niah_multikey_2`` and
  ``niah_multikey_3`` (a haystack made of distractor needles), ``ruler_vt``, ``ruler_cwe`` (wonderwords' bundled
  word lists), ``ruler_fwe``. These run offline;
* the Paul Graham essays haystack (the Hub dataset ``baber/paul_graham_essays``) and nltk's ``punkt_tab`` sentence
  splitter: ``niah_single_2``, ``niah_single_3``, ``niah_multikey_1``, ``niah_multiquery``, ``niah_multivalue``.
  Both can be cached, and then run offline;
* SQuAD 2.0's or HotpotQA's dev set, which lm-eval downloads at every run and keeps no copy of: ``ruler_qa_squad``,
  ``ruler_qa_hotpot``. They need the network.

Offline (``HF_HUB_OFFLINE=1``, or the Hub unreachable), :func:`check_ruler_tasks` refuses a task whose data is not on
this machine before any model runs, naming what to cache. lm-eval's RULER generator fetches ``punkt_tab`` when it is
first imported; unless an essay task asks for it, that fetch is skipped (nothing else uses it).
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import random
import socket
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any
from urllib.parse import urlparse

from hf_posenc_cli.vocabulary import RULER_LOCAL_TASKS, RULER_TASKS

from .prompting import count_tokens
from .results import LmEvalSample

logger = logging.getLogger(__name__)

#: The lm-eval releases these tasks are tested with (pyproject.toml's ``eval`` extra).
LM_EVAL_TESTED = ((0, 4, 13), (0, 5))
INSTALL = "pip install 'hf-posenc[eval]'"
ESSAYS = "baber/paul_graham_essays"
ESSAY_TASKS = ("niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multiquery", "niah_multivalue")
CACHE_ESSAYS = (f"the Paul Graham essays (the Hub dataset {ESSAYS}) and nltk's punkt_tab: cache them once with "
                f"network access (python -c \"import datasets; datasets.load_dataset('{ESSAYS}', split='train')\" "
                "and python -m nltk.downloader punkt_tab)")
#: Shortest length lm-eval 0.4.13 builds these tasks at (measured: at 512 tokens ruler_vt's generator never ends and
#: ruler_cwe's scorer divides by zero, an empty answer list); 1024 works for both.
MIN_LENGTHS = {"ruler_vt": 1024, "ruler_cwe": 1024}
QA_DATA = {
    "ruler_qa_squad": "SQuAD 2.0's dev set (dev-v2.0.json)",
    "ruler_qa_hotpot": "HotpotQA's dev set (hotpot_dev_distractor_v1.json of the Hub dataset namlh2004/hotpotqa)",
}


def lm_eval_version() -> str:
    """The installed lm-eval's version; an ImportError naming the extra when it is missing or outside the tested
    range."""
    try:
        found = metadata.version("lm_eval")
        import lm_eval  # noqa: F401  (installed but broken: the ImportError names what is missing)
    except (metadata.PackageNotFoundError, ImportError) as err:
        raise ImportError(f"the RULER tasks run through lm-evaluation-harness, which is not installed: {INSTALL}") \
            from err
    release = tuple(int(p) for p in found.split(".")[:3] if p.isdigit())
    low, high = LM_EVAL_TESTED
    if not low <= release < high:
        raise ImportError(f"lm-eval {found} is installed; hf-posenc's RULER tasks are tested with "
                          f"lm-eval>=0.4.13,<0.5: {INSTALL}")
    return found


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` is set, or the Hub's host takes no connection within 3 seconds."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return True
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=3).close()
    except OSError:
        return True
    return False


def _punkt_installed() -> bool:
    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab")
    except LookupError:
        return False
    return True


def _import_generator_without_punkt() -> None:
    """Import lm-eval's RULER generator without the punkt_tab fetch it makes when it is first imported (only the essay
    haystacks split sentences; its "Downloaded punkt_tab" line is dropped with it)."""
    import nltk

    real = nltk.download

    def skip(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
        logger.info("nltk's %s not fetched: no requested RULER task splits sentences", info_or_id)
        return False  # what nltk.download returns when it did not download

    printed = io.StringIO()
    nltk.download = skip
    try:
        with contextlib.redirect_stdout(printed):
            import lm_eval.tasks.ruler.prepare_niah  # noqa: F401
    finally:
        nltk.download = real
    for line in printed.getvalue().splitlines():
        if not line.startswith("Downloaded punkt_tab"):
            print(line)


def check_ruler_tasks(tasks: Sequence[str], lengths: Sequence[int]) -> None:
    """Check that lm-eval is installed and that every task in ``tasks`` (RULER task names) can build its samples at
    ``lengths`` here: offline, a task that downloads text is refused (ValueError) unless its data is cached, naming
    what to cache. Nothing is loaded for the locally generated tasks."""
    unknown = [t for t in tasks if t not in RULER_TASKS]
    if unknown:
        raise ValueError(f"unknown RULER tasks {unknown}; choose from {', '.join(RULER_TASKS)}")
    short = {t: MIN_LENGTHS[t] for t in tasks if t in MIN_LENGTHS and min(lengths) < MIN_LENGTHS[t]}
    if short:
        raise ValueError("; ".join(f"{t} needs lengths >= {n} (lm-eval's generator fails below)" for t, n in
                                   short.items()) + f"; got {sorted(lengths)}")
    lm_eval_version()
    downloading = [t for t in tasks if t not in RULER_LOCAL_TASKS]
    if not downloading:
        return
    offline = hub_offline()
    qa = [t for t in downloading if t in QA_DATA]
    if offline and qa:
        raise ValueError("offline (HF_HUB_OFFLINE=1 or no network): " + "; ".join(
            f"{t} downloads {QA_DATA[t]} at every run and lm-eval keeps no copy" for t in qa)
            + f". Run them with network access, or choose among the tasks built here: {', '.join(RULER_LOCAL_TASKS)}")
    essays = [t for t in downloading if t in ESSAY_TASKS]
    if not essays:
        return
    if not _punkt_installed():
        if offline:
            raise ValueError(f"offline (HF_HUB_OFFLINE=1 or no network): {', '.join(essays)} need {CACHE_ESSAYS}; "
                             "nltk's punkt_tab is not installed")
        import nltk

        nltk.download("punkt_tab", quiet=True)  # what lm-eval's generator does on its first import
    if offline:
        from lm_eval.tasks.ruler.prepare_niah import get_haystack

        try:
            get_haystack(type_haystack="essay")  # lm-eval's own loader (cached by it): from the datasets cache
        except Exception as err:  # datasets raises ConnectionError, FileNotFoundError, ... when it is not cached
            raise ValueError(f"offline (HF_HUB_OFFLINE=1 or no network): {', '.join(essays)} need {CACHE_ESSAYS}; "
                             f"loading {ESSAYS} from the cache failed ({type(err).__name__}: {err})") from err


def _ruler_directory() -> str:
    import lm_eval

    return os.path.join(os.path.dirname(lm_eval.__file__), "tasks", "ruler")


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Python's and numpy's global random streams seeded (RULER's generators draw from them), then restored."""
    import numpy as np

    state, np_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed)
    try:
        yield
    finally:
        random.setstate(state)
        np.random.set_state(np_state)


@dataclass
class RulerTasks:
    """lm-eval's RULER ``tasks`` built for one tokenizer at ``lengths`` (seeded with ``seed``), and the ``samples``
    first samples of each length that :meth:`run` scores. Build it with :meth:`build`."""

    tokenizer: Any
    lengths: list[int]
    samples: int
    manager: Any  # lm_eval.tasks.TaskManager
    tasks: dict[str, Any]  # task name -> lm_eval Task
    doc_ids: dict[str, list[int]]  # task name -> the scored samples' positions in the task's documents

    @classmethod
    def build(cls, tokenizer: Any, tasks: Sequence[str], lengths: Sequence[int], samples: int,
              seed: int = 0) -> RulerTasks:
        """Generate ``tasks``' samples at ``lengths`` with ``tokenizer`` (lm-eval builds 500 per length) and pick the
        first ``samples`` of each length; call :func:`check_ruler_tasks` first."""
        from lm_eval.tasks import TaskManager

        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        if not any(t in ESSAY_TASKS for t in tasks) and not _punkt_installed():
            _import_generator_without_punkt()
        with tempfile.TemporaryDirectory(prefix="hf-posenc-ruler-tokenizer-") as directory:
            tokenizer.save_pretrained(directory)  # lm-eval's RULER loads the tokenizer by name
            manager = TaskManager(include_defaults=False, include_path=_ruler_directory(),
                                  metadata={"tokenizer": directory, "max_seq_lengths": [int(n) for n in lengths]})
            with _seeded(seed):
                loaded = manager.load(list(tasks))["tasks"]
        doc_ids = {}
        for name, task in loaded.items():
            by_length: dict[int, list[int]] = {int(n): [] for n in lengths}
            for position, doc in enumerate(task.eval_docs):
                by_length[int(doc["max_length"])].append(position)
            short = {n: len(ids) for n, ids in by_length.items() if len(ids) < samples}
            if short:
                raise ValueError(f"{name}: lm-eval built only {short} samples at those lengths, fewer than "
                                 f"samples={samples}; ask for fewer samples")
            doc_ids[name] = sorted(i for ids in by_length.values() for i in ids[:samples])
        return cls(tokenizer, [int(n) for n in lengths], samples, manager, loaded, doc_ids)

    def run(self, name: str, model: Any, *, max_new_tokens: int | None = None,
            batch_size: int = 1) -> list[LmEvalSample]:
        """Score ``model`` (any causal LM, patched or not, on its device) on every task: lm-eval's ``HFLM`` around
        the model object and a copy of the tokenizer (lm-eval may set its pad token), greedy answers of each task's
        length (``max_new_tokens`` overrides it), no prompt truncated."""
        import lm_eval
        from lm_eval.models.huggingface import HFLM

        room = max_new_tokens or 0  # each sample's length already counts its task's answer
        lm = HFLM(pretrained=model, backend="causal", tokenizer=copy.deepcopy(self.tokenizer),
                  batch_size=batch_size, max_length=max(self.lengths) + room)
        out = lm_eval.simple_evaluate(
            lm, tasks=list(self.tasks.values()), task_manager=self.manager, samples=self.doc_ids, log_samples=True,
            bootstrap_iters=0, gen_kwargs={"max_gen_toks": max_new_tokens} if max_new_tokens else None)
        scored = []
        for task in self.tasks:
            for sample in out["samples"][task]:
                doc = sample["doc"]
                length = int(doc["max_length"])
                scored.append(LmEvalSample(
                    model=name, task=task, length=length, index=int(doc["index"]),
                    prompt_tokens=count_tokens(self.tokenizer, sample["arguments"][0][0]),
                    answers=[str(a) for a in doc["outputs"]], output=sample["filtered_resps"][0],
                    score=float(sample[str(length)])))
        return sorted(scored, key=lambda s: (RULER_TASKS.index(s.task), s.length, s.index))
