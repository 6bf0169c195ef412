"""Triton is optional: on a machine without it (macOS, Windows) both kernel packages import, TAPA and TAPE models
run on their CPU paths, and each Triton entry point raises an ImportError that says how to install Triton."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Run in a fresh interpreter in which `import triton` fails as it does where Triton is not installed.
SCRIPT = textwrap.dedent('''
    import importlib.abc, os, sys
    os.environ.pop("TRITON_INTERPRET", None)

    class NoTriton(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoTriton())
    sys.path.insert(0, "tests")
    import torch
    from hf_posenc.kernels import tapa, tape
    assert tapa.TRITON_IMPORT_ERROR is not None and tape.TRITON_IMPORT_ERROR is not None
    assert "triton" not in sys.modules
    q = torch.randn(1, 2, 8, 16)
    k, v, e = torch.randn(1, 1, 8, 16), torch.randn(1, 1, 8, 16), torch.randn(1, 1, 8, 16)
    o, e_out = tape.tape_attention(q, k, v, e)
    torch.testing.assert_close(o, tape.tape_attention_reference(q, k, v, e)[0])
    tapa.tapa_attention(q, k, v)
    for entry, call in ((tapa.tapa_attention_triton, (q, k, v)), (tape.tape_attention_triton, (q, k, v, e))):
        try:
            entry(*call)
        except ImportError as exc:
            assert "pip install hf-posenc[triton]" in str(exc), exc
        else:
            raise AssertionError("a Triton entry point ran without Triton")
    import hf_posenc
    from tiny import random_ids, tiny_model
    for scheme in ("tapa", "tape"):
        model = hf_posenc.patch_model(tiny_model("llama", "sdpa"), scheme)
        with torch.no_grad():
            assert torch.isfinite(model(random_ids(1, 12)).logits).all()
    print("OK without triton")
''')


def test_kernel_packages_and_attention_schemes_work_without_triton():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "OK without triton" in done.stdout, done.stderr[-3000:]
