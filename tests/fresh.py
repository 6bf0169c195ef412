"""Loading checkpoints in a fresh Python process, with or without hf-posenc importable."""

import json
import os
import subprocess
import sys
import textwrap

import torch

# A fresh interpreter; with BLOCK, importing hf_posenc is impossible (as on a machine without it installed).
BLOCK = textwrap.dedent(
    """
    import importlib.abc, sys
    class _NoHfPosenc(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "hf_posenc" or name.startswith("hf_posenc."):
                raise ModuleNotFoundError(f"No module named {name!r}")
    sys.meta_path.insert(0, _NoHfPosenc())
    """
)
LOAD = textwrap.dedent(
    """
    import json, sys, torch
    from transformers import AutoModelForCausalLM
    jobs, ids, mode = json.loads(sys.argv[1]), torch.load(sys.argv[2]), sys.argv[3]
    if mode == "plugin":
        import hf_posenc
    results = {}
    for job in jobs:
        d = job["dir"]
        try:
            model = AutoModelForCausalLM.from_pretrained(
                d, attn_implementation=job.get("attn"), trust_remote_code=mode == "remote"
            ).eval()
            if job.get("adapter"):
                from peft import PeftModel
                model = PeftModel.from_pretrained(model, job["adapter"])
        except Exception as exc:  # reported back to the test, which checks the message
            results[job["out"]] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        with torch.no_grad():
            torch.save(model(ids).logits, job["out"])
        base = model.get_base_model() if job.get("adapter") else model
        results[job["out"]] = {"class": type(base).__name__, "module": type(base).__module__,
                               "rope": base.config.rope_parameters}
    print("RESULTS" + json.dumps(results))
    """
)


def load_in_fresh_process(jobs, ids, tmp_path, mode):
    """Load each job's checkpoint in a new interpreter: mode "plugin" (import hf_posenc), "stock" (hf_posenc
    cannot be imported) or "remote" (cannot be imported; trust_remote_code=True)."""
    torch.save(ids, tmp_path / "ids.pt")
    code = (BLOCK if mode != "plugin" else "") + LOAD
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(jobs), str(tmp_path / "ids.pt"), mode],
        capture_output=True, text=True, timeout=900, env=env, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULTS"))
    return json.loads(line.removeprefix("RESULTS"))


def jobs_for(dirs, tag, schemes=None, **extra):
    """Jobs for load_in_fresh_process; eager attention, except for TAPA, which brings its own."""
    schemes = schemes or [None] * len(dirs)
    return [{"dir": str(d), "out": str(d / f"logits-{tag}.pt"), "attn": None if s == "tapa" else "eager", **extra}
            for d, s in zip(dirs, schemes)]
