"""Write the family support table (hf_posenc/data/families.json) from the family matrix's checks.

    .venv/bin/python scripts/families_table.py [--only TYPE ...] [--import MODULE ...] [--out PATH] [--gguf-only]

Every rotary causal-LM type of the installed Transformers goes through tests/family_matrix.py's checks (tiny random
config, every scheme); each cell becomes verified / refused (patch_model's reason) / untested (why no tiny model
could be built). The GGUF column is tests/gguf_matrix.py's check (export_gguf's verdict on CoPE and its rope_freqs;
--gguf-only recomputes that column alone, seconds, e.g. after hf_posenc/data/llama_cpp.json changed). A check that fails is not a table entry: the script lists the failures and exits 1 without writing,
so the committed table only ever holds what the checks found. tests/test_families.py re-runs the checks per family
and compares them with the committed row. About 2 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", help="re-check these model types and update their rows only")
    ap.add_argument("--import", dest="imports", nargs="+", default=[], metavar="MODULE",
                    help="import these modules first: schemes they register get a column of their own")
    ap.add_argument("--out", type=Path, help="write the table here instead of hf_posenc/data/families.json")
    ap.add_argument("--gguf-only", action="store_true",
                    help="recompute the GGUF column only, keeping the scheme columns of the written table")
    args = ap.parse_args(argv)

    import transformers
    from tqdm.auto import tqdm

    import importlib

    import family_matrix
    from gguf_matrix import check_gguf
    from hf_posenc.families.table import GGUF, TABLE_PATH, table_schemes

    for module in args.imports:
        importlib.import_module(module)
    schemes, out_path = table_schemes(), args.out or TABLE_PATH

    transformers.logging.set_verbosity_error()
    types = args.only or family_matrix.universe()
    keep = (args.only or args.gguf_only) and out_path.is_file()
    table = json.loads(out_path.read_text()) if keep else {}
    families = dict(table.get("families", {}))
    failures = []
    for model_type in tqdm(types, desc="families", unit="type"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if args.gguf_only:
                row = {k: v for k, v in families[model_type].items() if k != GGUF}
            else:
                row = family_matrix.check_family(model_type, schemes, triage=True)
            try:
                row[GGUF] = check_gguf(model_type)
            except Exception as exc:  # a failed check: listed below, nothing written
                row[GGUF] = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"[:300]}
        failures += [f"{model_type} {s}: {e['reason']}" for s, e in row.items() if e["status"] == "error"]
        families[model_type] = row
    if failures:
        print("checks failed (fix them, or refuse the scheme with its reason in hf_posenc.families.OVERRIDES):")
        print("\n".join(f"  {f}" for f in failures))
        return 1
    if args.gguf_only:
        schemes = tuple(table["schemes"])
    out = {"transformers_version": transformers.__version__, "schemes": list(schemes),
           "families": dict(sorted(families.items()))}
    out_path.write_text(json.dumps(out, indent=1) + "\n")
    counts = {s: sum(r[s]["status"] == "verified" for r in families.values()) for s in schemes}
    print(f"wrote {out_path}: {len(families)} model types; verified per scheme {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
