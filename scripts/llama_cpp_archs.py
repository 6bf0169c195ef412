"""Write which Transformers architectures llama.cpp can carry a frequency scheme for (hf_posenc/data/llama_cpp.json),
read from the llama.cpp source the project builds (llama-cpp-python's source distribution, which vendors it).

    .venv/bin/python scripts/llama_cpp_archs.py [--sdist PATH] [--out PATH]

Two facts of that source, combined:

* the converter's model-class registry (``convert_hf_to_gguf.py``'s ``conversion`` package: every
  ``@ModelBase.register("XForCausalLM", ...)`` class and its ``model_arch``): which llama.cpp architecture a
  checkpoint whose ``config.json`` names ``XForCausalLM`` is converted to;
* the loader's per-architecture tensors (``src/llama-arch.cpp`` names each ``LLM_ARCH_*``, ``src/llama-model.cpp``'s
  ``llama_model_mapping`` gives its model class, ``src/models/models.h`` the class's base, ``src/models/*.cpp`` its
  ``load_arch_tensors``): the architectures whose loader reads a per-dimension ``rope_freqs`` tensor
  (``LLM_TENSOR_ROPE_FREQS``), which is what ``hf_posenc.export_gguf`` writes a scheme's frequencies into.

``hf_posenc.gguf_export`` reads the written file; tests/test_gguf_export.py regenerates it when the source is cached
(``bash scripts/serving/setup_llamacpp.sh --converter`` downloads it to build/llama-cpp-python/) and compares.
Seconds; nothing is compiled.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import logging
import re
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "build" / "llama-cpp-python"
OUT = ROOT / "hf_posenc" / "data" / "llama_cpp.json"
VENDOR = "vendor/llama.cpp"


def default_sdist() -> Path | None:
    """The cached llama-cpp-python source distribution (the newest version there), or None."""
    found = sorted(CACHE.glob("llama_cpp_python-*.tar.gz"))
    return found[-1] if found else None


def _unpack(sdist: Path, into: Path) -> Path:
    """The vendored llama.cpp's converter, gguf-py and C++ sources, unpacked under ``into``; returns its root."""
    with tarfile.open(sdist) as tar:
        top = tar.getmembers()[0].name.split("/")[0]
        prefix = f"{top}/{VENDOR}/"
        wanted = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "src/")
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)
                   and m.name[len(prefix):].startswith(wanted) and (m.isfile() or m.isdir())]
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python 3.10.12+, 3.11.4+
        tar.extractall(into, members=members, **safe)
    return into / top / VENDOR


def converter_architectures(llama_cpp: Path) -> dict[str, str]:
    """Transformers architecture (``config.json``'s ``architectures[0]``) -> the llama.cpp architecture the
    converter writes for it (its registered class's ``model_arch``)."""
    sys.path[:0] = [str(llama_cpp / "gguf-py"), str(llama_cpp)]
    for name in [m for m in sys.modules if m == "gguf" or m.startswith(("gguf.", "conversion"))]:
        del sys.modules[name]  # the vendored gguf-py, not an installed one
    logging.disable(logging.WARNING)
    with contextlib.redirect_stdout(io.StringIO()):
        conversion = importlib.import_module("conversion")
        gguf = importlib.import_module("gguf")
        if hasattr(conversion, "load_all_models"):
            conversion.load_all_models()
        else:  # older converters register every class when convert_hf_to_gguf.py is imported
            importlib.import_module("convert_hf_to_gguf")
    text = conversion.ModelBase._model_classes[conversion.ModelType.TEXT]
    return {name: gguf.MODEL_ARCH_NAMES[cls.model_arch] for name, cls in sorted(text.items())}


def _body(source: str, start: int) -> str:
    """The brace-balanced block that opens at the first ``{`` after ``start``."""
    open_at = source.index("{", start)
    depth = 0
    for i in range(open_at, len(source)):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return source[open_at:i + 1]
    raise ValueError("unbalanced braces")


def rope_freqs_architectures(llama_cpp: Path) -> list[str]:
    """The llama.cpp architectures whose loader reads a ``rope_freqs`` tensor, by name (``"llama"``, ...)."""
    src = llama_cpp / "src"
    names = dict(re.findall(r'\{\s*(LLM_ARCH_\w+)\s*,\s*"([^"]+)"\s*\}', (src / "llama-arch.cpp").read_text()))
    model_cpp = (src / "llama-model.cpp").read_text()
    mapping = _body(model_cpp, model_cpp.index("llama_model_mapping("))
    arch_class: dict[str, str] = {}
    pending: list[str] = []
    for case, cls in re.findall(r"case\s+(LLM_ARCH_\w+)\s*:|return\s+new\s+(llama_model_\w+)\s*\(", mapping):
        if case:
            pending.append(case)
        else:
            arch_class.update({arch: cls for arch in pending})
            pending = []
    header = (src / "models" / "models.h").read_text()
    base = dict(re.findall(r"struct\s+(llama_model_\w+)\s*:\s*public\s+(llama_model_\w+)", header))
    loads: dict[str, bool] = {}
    for path in sorted((src / "models").glob("*.cpp")):
        source = path.read_text()
        for found in re.finditer(r"void\s+(llama_model_\w+)::load_arch_tensors\s*\(", source):
            loads[found.group(1)] = "LLM_TENSOR_ROPE_FREQS" in _body(source, found.end())

    def reads(cls: str) -> bool:
        while cls not in loads and cls in base:  # a class without its own load_arch_tensors uses its base's
            cls = base[cls]
        return loads.get(cls, False)

    return sorted(names[arch] for arch, cls in arch_class.items() if arch in names and reads(cls))


def generate(sdist: Path) -> dict[str, Any]:
    """The data file's content for the llama-cpp-python source distribution ``sdist``."""
    version = sdist.name.removeprefix("llama_cpp_python-").removesuffix(".tar.gz")
    with tempfile.TemporaryDirectory() as tmp:
        llama_cpp = _unpack(sdist, Path(tmp))
        reading = rope_freqs_architectures(llama_cpp)
        converted = converter_architectures(llama_cpp)
    return {"llama_cpp_python": version, "rope_freqs_architectures": reading, "converter": converted}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdist", type=Path, default=default_sdist(),
                    help="llama-cpp-python's source distribution (default: the one cached in build/llama-cpp-python)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"where to write (default {OUT.relative_to(ROOT)})")
    args = ap.parse_args(argv)
    if args.sdist is None or not args.sdist.is_file():
        print("llama_cpp_archs: no llama-cpp-python source distribution; run bash scripts/serving/setup_llamacpp.sh "
              "--converter (downloads it to build/llama-cpp-python/) or pass --sdist PATH", file=sys.stderr)
        return 2
    data = generate(args.sdist)
    args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    carried = sorted(h for h, a in data["converter"].items() if a in data["rope_freqs_architectures"])
    print(f"wrote {args.out}: {len(data['converter'])} converter classes, {len(data['rope_freqs_architectures'])} "
          f"architectures read rope_freqs; {len(carried)} Transformers architectures convert to one of them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
