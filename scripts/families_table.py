"""Write the family support table (hf_posenc/data/families.json) from the family matrix's checks.

    .venv/bin/python scripts/families_table.py [--only TYPE ...] [--import MODULE ...] [--out PATH]

Every rotary causal-LM type of the installed Transformers goes through tests/family_matrix.py's checks (tiny random
config, every scheme); each cell becomes verified / refused (patch_model's reason) / untested (why no tiny model
could be built). A check that fails is not a table entry: the script lists the failures and exits 1 without writing,
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
    args = ap.parse_args(argv)

    import transformers
    from tqdm.auto import tqdm

    import importlib

    import family_matrix
    from hf_posenc.families.table import TABLE_PATH, table_schemes

    for module in args.imports:
        importlib.import_module(module)
    schemes, out_path = table_schemes(), args.out or TABLE_PATH

    transformers.logging.set_verbosity_error()
    types = args.only or family_matrix.universe()
    table = json.loads(out_path.read_text()) if args.only and out_path.is_file() else {}
    families = dict(table.get("families", {}))
    failures = []
    for model_type in tqdm(types, desc="families", unit="type"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            row = family_matrix.check_family(model_type, schemes, triage=True)
        failures += [f"{model_type} {s}: {e['reason']}" for s, e in row.items() if e["status"] == "error"]
        families[model_type] = row
    if failures:
        print("checks failed (fix them, or refuse the scheme with its reason in hf_posenc.families.OVERRIDES):")
        print("\n".join(f"  {f}" for f in failures))
        return 1
    out = {"transformers_version": transformers.__version__, "schemes": list(schemes),
           "families": dict(sorted(families.items()))}
    out_path.write_text(json.dumps(out, indent=1) + "\n")
    counts = {s: sum(r[s]["status"] == "verified" for r in families.values()) for s in schemes}
    print(f"wrote {out_path}: {len(families)} model types; verified per scheme {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
