"""``evaluate``: several models (or positional-encoding schemes) × perplexity, passkey and needle tasks."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tqdm.auto import tqdm

from hf_posenc_cli.arguments import EVAL_TASKS as TASKS  # the command line's --tasks and --depths
from hf_posenc_cli.arguments import NEEDLE_DEPTHS as DEFAULT_DEPTHS

from .needle import NEEDLE_TASKS, TOKENS_PER_VALUE, build_needle_prompt, score_needle
from .passkey import KEY_RANGE, MAX_NEW_TOKENS, build_passkey_prompt, score_passkey
from .perplexity import perplexity_at_lengths, tokenize_text
from .prompting import GenerateFn, greedy_generate
from .results import EvaluationResult, RetrievalTrial


def expand_tasks(tasks: Sequence[str]) -> list[str]:
    """Task names with ``needle`` expanded to ``needle_single``, ``needle_multikey``, ``needle_multivalue``."""
    if isinstance(tasks, str):
        raise TypeError(f"tasks must be a list of names such as ['ppl', 'passkey'], got the string {tasks!r}")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ValueError(f"unknown tasks {unknown}; choose from {', '.join(TASKS)}")
    out: list[str] = []
    for t in tasks:
        out += [f"needle_{n}" for n in NEEDLE_TASKS] if t == "needle" else [t]
    return list(dict.fromkeys(out))


def prompt_rng(seed: int, task: str, length: int, depth: float, trial: int) -> random.Random:
    """The random stream of one retrieval prompt of :func:`evaluate`'s grid (its key or values): the same for every
    model evaluated with ``seed``, so models are compared on the same prompts."""
    return random.Random(f"{seed}/{task}/{length}/{float(depth)!r}/{trial}")


def passkey_key(seed: int, length: int, depth: float, trial: int) -> int:
    """The key the passkey prompt at this point of :func:`evaluate`'s grid hides (to keep training keys apart)."""
    return prompt_rng(seed, "passkey", length, depth, trial).randint(*KEY_RANGE)


def _prompt(task: str, tokenizer: Any, length: int, depth: float, rng: random.Random, num_distractors: int,
            num_values: int):
    if task == "passkey":
        return build_passkey_prompt(tokenizer, length, depth, rng.randint(*KEY_RANGE))
    return build_needle_prompt(tokenizer, task.removeprefix("needle_"), length, depth, rng, num_distractors, num_values)


def _score(task: str, output: str, answers: list[str]) -> tuple[float, bool]:
    if task == "passkey":
        hit = score_passkey(output, int(answers[0]))
        return float(hit), hit
    return score_needle(output, answers)


def evaluate(
    models: Mapping[str, Any],
    tokenizer: Any,
    tasks: Sequence[str] = ("ppl", "passkey", "needle"),
    lengths: Sequence[int] = (512, 1024),
    depths: Sequence[float] = DEFAULT_DEPTHS,
    *,
    text: str | None = None,
    stride: int | None = None,
    max_tokens: int | None = None,
    trials: int = 1,
    seed: int = 0,
    num_distractors: int = 3,
    num_values: int = 4,
    max_new_tokens: int | None = None,
    generate: GenerateFn | None = None,
    fast: bool = True,
    chunk_size: int = 1024,
    progress: bool = True,
) -> EvaluationResult:
    """Evaluate every model of ``models`` (name → causal LM, patched or not) on ``tasks``.

    * ``ppl``: sliding-window perplexity of ``text`` at each of ``lengths`` (see :mod:`.perplexity`);
    * ``passkey``: Landmark-attention passkey retrieval on the ``lengths`` × ``depths`` grid, ``trials`` keys each;
    * ``needle`` (or ``needle_single`` / ``needle_multikey`` / ``needle_multivalue``): RULER-style needles.

    ``tokenizer`` is one tokenizer or a mapping name → tokenizer. Prompts depend only on ``seed``, task, length,
    depth and trial (and the tokenizer), so every model answers the same prompts. ``generate`` replaces greedy
    decoding (``generate(model, tokenizer, prompt, max_new_tokens) -> text``); ``max_new_tokens`` overrides the
    per-task defaults (10 for the passkey, 12 per expected needle value)."""
    if not isinstance(models, Mapping) or not models:
        raise TypeError("models must be a non-empty dict mapping a name to a model, e.g. {'rope': m1, 'cope': m2}")
    task_list = expand_tasks(tasks)
    lengths = [int(n) for n in lengths]
    depths = [float(d) for d in depths]
    if not lengths or min(lengths) < 2:
        raise ValueError(f"lengths must be a non-empty list of token counts >= 2, got {lengths}")
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    if "ppl" in task_list and text is None:
        raise ValueError("the 'ppl' task needs text= (the evaluation text as a string); or drop 'ppl' from tasks")
    retrieval_tasks = [t for t in task_list if t != "ppl"]
    if retrieval_tasks and not depths:
        raise ValueError("depths must list at least one needle depth in [0, 1] for the retrieval tasks")
    tokenizers = {name: tokenizer[name] if isinstance(tokenizer, Mapping) else tokenizer for name in models}
    generate = greedy_generate if generate is None else generate

    result = EvaluationResult(settings={
        "tasks": task_list, "lengths": lengths, "depths": depths, "stride": stride, "max_tokens": max_tokens,
        "trials": trials, "seed": seed, "num_distractors": num_distractors, "num_values": num_values,
        "max_new_tokens": max_new_tokens,
    })
    prompt_cache: dict[tuple[int, str, int, float, int], Any] = {}
    for name, model in models.items():
        tok = tokenizers[name]
        if "ppl" in task_list:
            ids = tokenize_text(tok, text, max_tokens)
            result.perplexity += perplexity_at_lengths(model, ids, lengths, stride, name=name, fast=fast,
                                                       chunk_size=chunk_size, progress=progress)
        grid = [(t, n, d, i) for t in retrieval_tasks for n in lengths for d in depths for i in range(trials)]
        for task, length, depth, trial in tqdm(grid, desc=f"retrieval {name}", disable=not progress or not grid,
                                               leave=False):
            cache_key = (id(tok), task, length, depth, trial)
            if cache_key not in prompt_cache:
                rng = prompt_rng(seed, task, length, depth, trial)
                prompt_cache[cache_key] = _prompt(task, tok, length, depth, rng, num_distractors, num_values)
            prompt = prompt_cache[cache_key]
            budget = max_new_tokens or (MAX_NEW_TOKENS if task == "passkey" else TOKENS_PER_VALUE * len(prompt.answers))
            output = generate(model, tok, prompt.text, budget)
            score, exact = _score(task, output, prompt.answers)
            result.retrieval.append(RetrievalTrial(
                model=name, task=task, length=length, depth=depth, trial=trial, prompt_tokens=prompt.tokens,
                answers=list(prompt.answers), output=output, score=score, exact=exact,
            ))
    return result


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
    tasks: Sequence[str] = ("ppl", "passkey", "needle"),
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
    result = None
    for name, scheme in parsed.items():  # one patched model at a time
        model = fresh()
        if scheme is not None:
            patch_model(model, scheme, replace=replace)
        part = evaluate({name: model}, tokenizer, tasks, lengths, depths, progress=progress, **kwargs)
        result = part if result is None else result.merge(part)
        del model
    result.settings["schemes"] = {name: None if s is None else {"scheme": s.name, **s.to_dict()}
                                  for name, s in parsed.items()}
    return result
