"""``evaluate``: several models (or positional-encoding schemes) × perplexity, passkey and lm-eval's RULER tasks."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from hf_posenc_cli.vocabulary import EVAL_TASKS as TASKS  # the command line's --tasks and --depths
from hf_posenc_cli.vocabulary import NEEDLE_DEPTHS as DEFAULT_DEPTHS
from hf_posenc_cli.vocabulary import RULER_SAMPLES, RULER_TASKS

from .passkey import KEY_RANGE, MAX_NEW_TOKENS, build_passkey_prompt, score_passkey
from .perplexity import perplexity_at_lengths, tokenize_text
from .prompting import GenerateFn, greedy_generate
from .results import EvaluationResult, RetrievalTrial


def check_tasks(tasks: Sequence[str]) -> list[str]:
    """``tasks`` as a list without repeats, each one of :data:`TASKS` (``ppl``, ``passkey`` and lm-eval's RULER
    tasks)."""
    if isinstance(tasks, str):
        raise TypeError(f"tasks must be a list of names such as ['ppl', 'passkey'], got the string {tasks!r}")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ValueError(f"unknown tasks {unknown}; choose from {', '.join(TASKS)}")
    return list(dict.fromkeys(tasks))


def prompt_rng(seed: int, task: str, length: int, depth: float, trial: int) -> random.Random:
    """The random stream of one retrieval prompt of :func:`evaluate`'s grid (its key): the same for every model
    evaluated with ``seed``, so models are compared on the same prompts."""
    return random.Random(f"{seed}/{task}/{length}/{float(depth)!r}/{trial}")


def passkey_key(seed: int, length: int, depth: float, trial: int) -> int:
    """The key the passkey prompt at this point of :func:`evaluate`'s grid hides (to keep training keys apart)."""
    return prompt_rng(seed, "passkey", length, depth, trial).randint(*KEY_RANGE)


@dataclass
class _Plan:
    """What :func:`evaluate` was asked, checked; the prompts it builds, shared by every model it scores (passkey
    prompts and lm-eval's RULER tasks are built once per tokenizer)."""

    tasks: list[str]
    lengths: list[int]
    depths: list[float]
    text: str | None
    options: dict[str, Any]  # stride, max_tokens, trials, seed, samples, max_new_tokens, batch_size
    generate: GenerateFn
    fast: bool
    chunk_size: int
    progress: bool
    _passkeys: dict[tuple[int, int, float, int], Any] = field(default_factory=dict)
    _ruler: dict[int, Any] = field(default_factory=dict)

    @property
    def ruler_tasks(self) -> list[str]:
        return [t for t in self.tasks if t in RULER_TASKS]

    def settings(self) -> dict[str, Any]:
        settings = {"tasks": self.tasks, "lengths": self.lengths, "depths": self.depths, **self.options}
        if self.ruler_tasks:
            from .harness import lm_eval_version

            settings["lm_eval_version"] = lm_eval_version()
        return settings

    def passkey_prompt(self, tokenizer: Any, length: int, depth: float, trial: int) -> Any:
        key = (id(tokenizer), length, depth, trial)
        if key not in self._passkeys:
            self._passkeys[key] = build_passkey_prompt(tokenizer, length, depth,
                                                       passkey_key(self.options["seed"], length, depth, trial))
        return self._passkeys[key]

    def ruler(self, tokenizer: Any) -> Any:
        if id(tokenizer) not in self._ruler:
            from .harness import RulerTasks

            self._ruler[id(tokenizer)] = RulerTasks.build(tokenizer, self.ruler_tasks, self.lengths,
                                                          self.options["samples"], self.options["seed"])
        return self._ruler[id(tokenizer)]


def _plan(tasks: Sequence[str], lengths: Sequence[int], depths: Sequence[float], *, text: str | None = None,
          stride: int | None = None, max_tokens: int | None = None, trials: int = 1, seed: int = 0,
          samples: int = RULER_SAMPLES, batch_size: int = 1, max_new_tokens: int | None = None,
          generate: GenerateFn | None = None, fast: bool = True, chunk_size: int = 1024,
          progress: bool = True) -> _Plan:
    """The checked plan of an :func:`evaluate` call (its arguments): a bad argument, a missing lm-eval or an offline
    RULER task that downloads text fails here, before any model runs."""
    options = {"stride": stride, "max_tokens": max_tokens, "trials": trials, "seed": seed, "samples": samples,
               "batch_size": batch_size, "max_new_tokens": max_new_tokens}
    task_list = check_tasks(tasks)
    lengths = [int(n) for n in lengths]
    depths = [float(d) for d in depths]
    if not lengths or min(lengths) < 2:
        raise ValueError(f"lengths must be a non-empty list of token counts >= 2, got {lengths}")
    if trials < 1 or samples < 1 or batch_size < 1:
        raise ValueError(f"trials, samples and batch_size must be >= 1, got {trials}, {samples} and {batch_size}")
    if "ppl" in task_list and text is None:
        raise ValueError("the 'ppl' task needs text= (the evaluation text as a string); or drop 'ppl' from tasks")
    if "passkey" in task_list and not depths:
        raise ValueError("depths must list at least one needle depth in [0, 1] for the passkey task")
    plan = _Plan(task_list, lengths, depths, text, options, greedy_generate if generate is None else generate, fast,
                 chunk_size, progress)
    if plan.ruler_tasks:
        from .harness import check_ruler_tasks

        check_ruler_tasks(plan.ruler_tasks, lengths)
    return plan


def _perplexity(plan: _Plan, name: str, model: Any, tokenizer: Any) -> EvaluationResult:
    ids = tokenize_text(tokenizer, plan.text, plan.options["max_tokens"])
    return EvaluationResult(perplexity_at_lengths(model, ids, plan.lengths, plan.options["stride"], name=name,
                                                  fast=plan.fast, chunk_size=plan.chunk_size,
                                                  progress=plan.progress))


def _passkey(plan: _Plan, name: str, model: Any, tokenizer: Any) -> EvaluationResult:
    grid = [(n, d, i) for n in plan.lengths for d in plan.depths for i in range(plan.options["trials"])]
    trials = []
    for length, depth, trial in tqdm(grid, desc=f"passkey {name}", disable=not plan.progress, leave=False):
        prompt = plan.passkey_prompt(tokenizer, length, depth, trial)
        output = plan.generate(model, tokenizer, prompt.text, plan.options["max_new_tokens"] or MAX_NEW_TOKENS)
        hit = score_passkey(output, int(prompt.answers[0]))
        trials.append(RetrievalTrial(model=name, task="passkey", length=length, depth=depth, trial=trial,
                                     prompt_tokens=prompt.tokens, answers=list(prompt.answers), output=output,
                                     score=float(hit), exact=hit))
    return EvaluationResult(retrieval=trials)


def _ruler(plan: _Plan, name: str, model: Any, tokenizer: Any) -> EvaluationResult:
    samples = plan.ruler(tokenizer).run(name, model, max_new_tokens=plan.options["max_new_tokens"],
                                        batch_size=plan.options["batch_size"])
    return EvaluationResult(lm_eval=samples)


def _run(plan: _Plan, models: Mapping[str, Any], tokenizer: Any) -> EvaluationResult:
    tokenizers = {name: tokenizer[name] if isinstance(tokenizer, Mapping) else tokenizer for name in models}
    result = EvaluationResult(settings=plan.settings())
    for name, model in models.items():
        result = result.merge(_score(plan, name, model, tokenizers[name]))
    return result


def _score(plan: _Plan, name: str, model: Any, tokenizer: Any) -> EvaluationResult:
    """One model on every task of the plan."""
    result = EvaluationResult()
    if "ppl" in plan.tasks:
        result = result.merge(_perplexity(plan, name, model, tokenizer))
    if "passkey" in plan.tasks:
        result = result.merge(_passkey(plan, name, model, tokenizer))
    if plan.ruler_tasks:
        result = result.merge(_ruler(plan, name, model, tokenizer))
    return result


def evaluate(
    models: Mapping[str, Any],
    tokenizer: Any,
    tasks: Sequence[str] = ("ppl", "passkey"),
    lengths: Sequence[int] = (512, 1024),
    depths: Sequence[float] = DEFAULT_DEPTHS,
    *,
    text: str | None = None,
    stride: int | None = None,
    max_tokens: int | None = None,
    trials: int = 1,
    seed: int = 0,
    samples: int = RULER_SAMPLES,
    batch_size: int = 1,
    max_new_tokens: int | None = None,
    generate: GenerateFn | None = None,
    fast: bool = True,
    chunk_size: int = 1024,
    progress: bool = True,
) -> EvaluationResult:
    """Evaluate every model of ``models`` (name → causal LM, patched or not) on ``tasks``.

    * ``ppl``: sliding-window perplexity of ``text`` at each of ``lengths`` (see :mod:`.perplexity`);
    * ``passkey``: Landmark-attention passkey retrieval on the ``lengths`` × ``depths`` grid, ``trials`` keys each;
    * lm-eval's RULER tasks (``niah_single_1``, ``ruler_vt``, ...; the ``hf-posenc[eval]`` extra): the first
      ``samples`` of the 500 lm-eval builds at each of ``lengths`` (see :mod:`.harness`), ``batch_size`` prompts per
      generate call.

    ``tokenizer`` is one tokenizer or a mapping name → tokenizer. Prompts depend only on ``seed``, task, length,
    depth and trial (and the tokenizer), so every model answers the same prompts. ``generate`` replaces the
    passkey's greedy decoding (``generate(model, tokenizer, prompt, max_new_tokens) -> text``); ``max_new_tokens``
    overrides the per-task answer lengths (10 for the passkey, each RULER task's own)."""
    if not isinstance(models, Mapping) or not models:
        raise TypeError("models must be a non-empty dict mapping a name to a model, e.g. {'rope': m1, 'cope': m2}")
    plan = _plan(tasks, lengths, depths, text=text, stride=stride, max_tokens=max_tokens, trials=trials, seed=seed,
                 samples=samples, batch_size=batch_size, max_new_tokens=max_new_tokens, generate=generate, fast=fast,
                 chunk_size=chunk_size, progress=progress)
    return _run(plan, models, tokenizer)


SchemeSpec = Any  # "cope:clip_low_n=10", a SchemeConfig, or None (the base as it is)


def scheme_label(spec: SchemeSpec) -> str:
    """The name a scheme spec is reported under: the spec string itself, the config's name and options, or
    ``"base"`` for ``None``."""
    if spec is None:
        return "base"
    if isinstance(spec, str):
        return spec.strip()
    options = ",".join(f"{k}={v}" for k, v in spec.to_dict().items() if v != getattr(type(spec)(), k))
    return spec.name + (f":{options}" if options else "")


def evaluate_schemes(
    base: Any | Callable[[], Any],
    schemes: Sequence[SchemeSpec] | Mapping[str, SchemeSpec],
    tokenizer: Any,
    tasks: Sequence[str] = ("ppl", "passkey"),
    lengths: Sequence[int] = (512, 1024),
    depths: Sequence[float] = DEFAULT_DEPTHS,
    *,
    progress: bool = True,
    replace: bool = False,
    **kwargs: Any,
) -> EvaluationResult:
    """Evaluate one base model under each scheme, side by side, without saving a checkpoint per scheme.

    ``base`` is a loaded causal LM (each scheme patches a deep copy, so the base itself is never changed and two
    models are in memory at a time) or a function returning a fresh copy of it (then one model at a time, as
    ``hf-posenc eval BASE --schemes ...`` does). ``schemes`` lists scheme specs — ``"cope:clip_low_n=10"``,
    ``"prope:p=0.75"``, ``"tapa"``, a :class:`~hf_posenc.schemes.SchemeConfig`, or ``None`` for the unpatched
    base — or maps result names to them. Every spec is parsed before any model is patched, so a typo fails at
    once. ``replace=True`` lets a scheme replace one the base already carries (``patch_model``'s ``replace``). The
    other arguments are :func:`evaluate`'s; results are merged in the given order, and ``settings["schemes"]``
    records each name's scheme."""
    from ..patching import patch_model
    from ..schemes import SchemeConfig
    from ..schemes.spec import parse_scheme_spec

    named = dict(schemes) if isinstance(schemes, Mapping) else {scheme_label(s): s for s in schemes}
    if isinstance(schemes, str) or not named:
        raise TypeError("schemes must be a non-empty list of specs such as ['rope', 'cope:clip_low_n=10'] "
                        f"(or a dict name -> spec), got {schemes!r}")
    if not isinstance(schemes, Mapping) and len(named) != len(schemes):
        raise ValueError(f"schemes {list(schemes)} repeat; give each scheme once (or name them with a dict).")
    parsed: dict[str, SchemeConfig | None] = {}
    for name, spec in named.items():
        parsed[name] = parse_scheme_spec(spec) if isinstance(spec, str) else spec
        if parsed[name] is not None and not isinstance(parsed[name], SchemeConfig):
            raise TypeError(f"scheme {name!r}: expected a spec string, a SchemeConfig or None, got "
                            f"{type(spec).__name__}")
    fresh = base if callable(base) and not hasattr(base, "config") else (lambda: copy.deepcopy(base))
    plan = _plan(tasks, lengths, depths, progress=progress, **kwargs)  # every scheme answers the same prompts
    result = None
    for name, scheme in parsed.items():  # one patched model at a time
        model = fresh()
        if scheme is not None:
            patch_model(model, scheme, replace=replace)
        part = _run(plan, {name: model}, tokenizer)
        result = part if result is None else result.merge(part)
        del model
    result.settings["schemes"] = {name: None if s is None else {"scheme": s.name, **s.to_dict()}
                                  for name, s in parsed.items()}
    return result
