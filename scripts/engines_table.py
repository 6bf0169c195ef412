"""Write the distributed-engine table (hf_posenc/data/engines.json) from a run of tests/test_distributed.py.

    .venv/bin/python scripts/engines_table.py

Runs the two-process tests (about 8 minutes on 2 CPU cores) and turns each test's outcome into its cell: a passed
parity test makes its (engine, scheme) verified, a passed refusal test refused (with the refusal's reason), the
context-parallel probe "not verifiable here". Any failed or skipped test: nothing is written, exit 1.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARITY = {"test_ddp_matches_one_process": "DDP", "test_fsdp2_matches_one_process": "FSDP2",
          "test_deepspeed_zero3_matches_one_process": "ZeRO-3",
          "test_sequence_parallel_matches_one_process": "sequence parallel (Ulysses)"}
RESUME = {"sequence parallel (Ulysses) with ZeRO-3": "test_sequence_parallel_zero3_resumes_after_a_kill",
          "FSDP2": "test_fsdp2_resumes_after_a_kill"}
CP_PROBE = "test_context_parallel_has_no_cpu_path_in_this_pytorch"
TABLE_CHECK = "test_engine_table_cells_name_tests_of_this_module_and_the_docs_embed_it"
CP_REFUSAL = "test_context_parallel_refuses_tapa_and_tape"
NO_CPU_CP = ("PyTorch's context parallelism shards SDPA's CUDA kernels only (no sharding strategy for the CPU "
             "flash-attention op) and accelerate enables it only with FSDP2 on GPUs; the frequency schemes change "
             "only the rotary frequencies of each position, so nothing of theirs stops it")


def main() -> int:
    import importlib.metadata as md
    import json

    sys.path.insert(0, str(ROOT))
    from hf_posenc.training.distributed import context_parallel_refusal
    from hf_posenc.training.engines import ENGINE_TABLE_PATH, ENGINES

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_distributed.py",
                               f"--junitxml={report}", "--deselect", f"tests/test_distributed.py::{TABLE_CHECK}"],
                              cwd=ROOT)  # the check of the table being written cannot pass before it is written
        cases = ET.parse(report).getroot().iter("testcase")
        outcome = {c.get("name"): not any(child.tag in ("failure", "error", "skipped") for child in c) for c in cases}
    if done.returncode != 0 or not all(outcome.values()):
        print("tests failed or were skipped; the table is only written from a clean run:",
              [name for name, ok in outcome.items() if not ok])
        return 1
    # the schemes the parity tests ran (their parameters; the test module names each scheme's test options)
    schemes = list(dict.fromkeys(name.partition("[")[2].rstrip("]") for name in outcome
                                 if name.partition("[")[0] in PARITY and "[" in name))
    cells: dict[str, dict[str, dict[str, str]]] = {engine: {} for engine in ENGINES}
    for scheme in schemes:
        for test, engine in PARITY.items():
            if outcome.get(f"{test}[{scheme}]"):
                cells[engine][scheme] = {"status": "verified", "test": f"{test}[{scheme}]"}
        refusal = context_parallel_refusal(scheme)
        if refusal is not None and outcome.get(f"{CP_REFUSAL}[{scheme}]"):
            cells["context parallel"][scheme] = {"status": "refused", "reason": refusal,
                                                 "test": f"{CP_REFUSAL}[{scheme}]"}
        elif refusal is None and outcome.get(CP_PROBE):
            cells["context parallel"][scheme] = {"status": "not verifiable here", "reason": NO_CPU_CP,
                                                 "test": CP_PROBE}
    missing = [(e, s) for e in ENGINES for s in schemes if s not in cells[e]]
    if missing:
        print("cells without a deciding test:", missing)
        return 1
    versions = {name: md.version(name) for name in ("torch", "accelerate", "deepspeed", "transformers", "peft")}
    table = {"versions": versions, "cells": cells, "resume": RESUME}
    ENGINE_TABLE_PATH.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {ENGINE_TABLE_PATH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
