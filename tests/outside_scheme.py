"""docs/architecture.md's "Adding a scheme" example (``HalfConfig``), run as a user runs it: the block as a script
(its scheme module is ``__main__``) or saved as a module that a script imports, in a fresh Python process (the
registry is process-wide, so the test process never registers it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
MODES = ("__main__", "module")


def docs_block() -> str:
    """The docs' scheme module, as written on the page."""
    page = (REPO / "docs" / "architecture.md").read_text()
    return re.search(r"```python\n(# half_scheme\.py.*?)```", page, re.S).group(1)


def run_as_user(mode: str, body: str, tmp_path: Path, *args: str, timeout: int = 600) -> str:
    """Run ``body`` after the docs' block registered ``half``: in the same script (``mode="__main__"``) or after
    ``from half_scheme import HalfConfig`` (``mode="module"``). Returns stdout; a failure fails the test with stderr."""
    work = tmp_path / f"user-{mode.strip('_')}"
    work.mkdir()
    if mode == "__main__":
        script = docs_block() + "\n" + body
    else:
        (work / "half_scheme.py").write_text(docs_block())
        script = "from half_scheme import HalfConfig\n" + body
    (work / "run.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), str(TESTS), str(REPO)]), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(work / "run.py"), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL, cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# What a user does with the docs' scheme: save its model and a CoPE one, export it for stock Transformers and, where
# llama.cpp's converter is unpacked, to GGUF (a two-layer Llama with SmolLM2's vocabulary) with the patched model's
# greedy tokens and prompt log-probabilities for the same prompts (tests/test_serving_llamacpp.py runs the file).
USER_RUN = '''
import json, sys
from pathlib import Path
import torch
import hf_posenc
from hf_posenc.schemes import REGISTRY
from tiny import random_ids, tiny_model

out, converter = Path(sys.argv[1]), Path(sys.argv[2])
model = hf_posenc.patch_model(tiny_model("llama"), "half")
model.save_pretrained(out / "patched")
hf_posenc.patch_model(tiny_model("llama"), "cope", clip_low_n=3).save_pretrained(out / "cope")
hf_posenc.export_stock(model, out / "stock")
ids = random_ids(2, 40)
with torch.no_grad():
    torch.save(model(ids).logits, out / "logits.pt")
    torch.save(tiny_model("llama")(ids).logits, out / "plain.pt")
torch.save(ids, out / "ids.pt")
printed = {"package": REGISTRY["half"].package}
if (converter / "convert_hf_to_gguf.py").is_file():
    sys.path.insert(0, sys.argv[3])
    from reference import model_outputs
    from hf_posenc.models import load_tokenizer, smollm2_gguf

    tokenizer = load_tokenizer(*smollm2_gguf())
    kw = dict(vocab_size=len(tokenizer), initializer_range=0.15)
    gguf_model = hf_posenc.patch_model(tiny_model("llama", **kw), "half")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 20000, (96,), generator=g).tolist() for _ in range(2)]
    hf_posenc.export_gguf(gguf_model, out / "half.gguf", "f32", tokenizer=tokenizer, llama_cpp=converter)
    printed.update(prompts=prompts, outputs=model_outputs(gguf_model, prompts, 8),
                   plain=model_outputs(tiny_model("llama", **kw), prompts, 8))
(out / "printed.json").write_text(json.dumps(printed))
'''
_RUNS: dict[str, tuple[Path, dict]] = {}


def user_run(mode: str, tmp_path_factory) -> tuple[Path, dict]:
    """:data:`USER_RUN` in ``mode`` (once per test session): its output folder and what it printed."""
    import json

    if mode not in _RUNS:
        tmp = tmp_path_factory.mktemp(f"half-{mode.strip('_')}")
        converter = REPO / "build" / "llama-cpp-python" / "llama.cpp"
        run_as_user(mode, USER_RUN, tmp, str(tmp / "out"), str(converter), str(REPO / "scripts" / "serving"))
        _RUNS[mode] = tmp / "out", json.loads((tmp / "out" / "printed.json").read_text())
    return _RUNS[mode]
