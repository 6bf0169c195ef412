"""Length-generalisation evaluation for any Hugging Face causal LM, patched by hf-posenc or not.

```python
from hf_posenc.evaluation import evaluate, write_report
result = evaluate({"rope": stock, "cope": patched}, tokenizer, tasks=["ppl", "passkey", "niah_single_1"],
                  lengths=[2048, 8192, 16384], depths=[0, 0.5, 1], text=open("book.txt").read())
write_report(result, "eval-out")     # results.json, report.md, perplexity.png, passkey.png, ruler.png

# or one base under several schemes, without saving a checkpoint per scheme
result = evaluate_schemes(stock, ["rope", "cope:clip_low_n=10", "prope:p=0.75"], tokenizer, tasks=["ppl"],
                          lengths=[2048, 8192], text=text)
```

* :mod:`.perplexity`: sliding-window perplexity (Press et al. stride method), chunked output head;
* :mod:`.passkey`: passkey retrieval in the Landmark-attention format;
* :mod:`.harness`: lm-evaluation-harness's RULER tasks on the in-memory models (the ``hf-posenc[eval]`` extra);
* :mod:`.report`: JSON, Markdown and PNG plots; :mod:`.cli`: the ``hf-posenc eval`` sub-command.
"""

from .harness import RulerTasks, check_ruler_tasks
from .passkey import PasskeyPrompt, build_passkey_prompt, key_digit_accuracy, passkey_prompt, score_passkey
from .perplexity import (
    TextTooShortError, perplexity_at_lengths, sliding_window_perplexity, tokenize_text, window_nll,
    window_nll_reference,
)
from .prompting import GenerateFn, greedy_generate
from .report import markdown_report, plot_accuracy_heatmaps, plot_lm_eval_heatmaps, plot_perplexity, write_report
from .results import PERPLEXITY_METHOD, EvaluationResult, LmEvalSample, PerplexityResult, RetrievalTrial
from .runner import RULER_TASKS, TASKS, check_tasks, evaluate, evaluate_schemes, scheme_label

__all__ = [
    "evaluate", "evaluate_schemes", "scheme_label", "check_tasks", "TASKS", "RULER_TASKS", "EvaluationResult",
    "PerplexityResult", "RetrievalTrial", "LmEvalSample", "PERPLEXITY_METHOD", "RulerTasks", "check_ruler_tasks",
    "sliding_window_perplexity", "perplexity_at_lengths", "tokenize_text", "window_nll", "window_nll_reference",
    "TextTooShortError", "passkey_prompt", "build_passkey_prompt", "score_passkey", "key_digit_accuracy", "PasskeyPrompt",
    "greedy_generate", "GenerateFn", "write_report", "markdown_report", "plot_perplexity", "plot_accuracy_heatmaps",
    "plot_lm_eval_heatmaps",
]
