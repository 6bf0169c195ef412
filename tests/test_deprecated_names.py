"""Module names kept for one release after a rename: ``hf_posenc.patches`` (now ``hf_posenc.families``) and
``hf_posenc.layers`` (now ``hf_posenc.decoder_layers``). The old import paths warn and yield the very same modules;
hf-posenc's own modules importing an old name do not make users see the warning."""

from __future__ import annotations

import importlib
import importlib.machinery
import sys

import pytest

import hf_posenc
import hf_posenc.decoder_layers
import hf_posenc.families
import hf_posenc.families.base
import hf_posenc.families.derive
import hf_posenc.families.table

MOVED = {"hf_posenc.patches": "hf_posenc.families", "hf_posenc.patches.base": "hf_posenc.families.base",
         "hf_posenc.patches.derive": "hf_posenc.families.derive", "hf_posenc.patches.table": "hf_posenc.families.table",
         "hf_posenc.layers": "hf_posenc.decoder_layers"}


def _forget_old_names(monkeypatch) -> None:
    """Drop the old names from sys.modules and the package (restored after the test), so they import afresh."""
    for name in [n for n in sys.modules if n in MOVED]:
        monkeypatch.delitem(sys.modules, name)
    for attribute in ("patches", "layers"):
        if attribute in vars(hf_posenc):  # not hasattr: the package's __getattr__ answers the old names, warning
            monkeypatch.delattr(hf_posenc, attribute)


def _message(old: str) -> str:
    package = "hf_posenc.patches" if old.startswith("hf_posenc.patches") else old
    return rf"{package} is now {MOVED[package]}; the old name will be removed"


@pytest.mark.parametrize("old", list(MOVED))
def test_the_old_module_path_warns_and_yields_the_new_module(monkeypatch, old):
    _forget_old_names(monkeypatch)
    with pytest.warns(FutureWarning, match=_message(old)) as caught:
        module = importlib.import_module(old)
    assert module is sys.modules[MOVED[old]]
    assert caught[0].filename == __file__


def test_old_from_imports_warn_at_the_importing_line_and_yield_the_same_objects(monkeypatch):
    _forget_old_names(monkeypatch)
    with pytest.warns(FutureWarning, match=_message("hf_posenc.patches")) as caught:
        from hf_posenc.patches.table import load_table
    assert caught[0].filename == __file__
    from hf_posenc.patches import FAMILIES, family_for
    from hf_posenc.patches.base import make_family
    from hf_posenc.patches.derive import FamilyRefused

    assert load_table is hf_posenc.families.table.load_table and FAMILIES is hf_posenc.FAMILIES
    assert family_for is hf_posenc.families.family_for and make_family is hf_posenc.families.base.make_family
    assert FamilyRefused is sys.modules["hf_posenc.families.derive"].FamilyRefused  # .derive: the function
    assert hf_posenc.patches is hf_posenc.families

    with pytest.warns(FutureWarning, match=_message("hf_posenc.layers")) as caught:
        from hf_posenc.layers import decoder_layers, output_logit_transform, transform_logits
    assert caught[0].filename == __file__
    assert (decoder_layers, output_logit_transform, transform_logits) == (
        hf_posenc.decoder_layers.decoder_layers, hf_posenc.decoder_layers.output_logit_transform,
        hf_posenc.decoder_layers.transform_logits)


@pytest.mark.parametrize("old", ["patches", "layers"])
def test_the_old_attribute_of_the_package_warns_and_yields_the_new_module(monkeypatch, old):
    _forget_old_names(monkeypatch)
    with pytest.warns(FutureWarning, match=_message(f"hf_posenc.{old}")) as caught:
        module = getattr(hf_posenc, old)
    assert module is sys.modules[MOVED[f"hf_posenc.{old}"]]
    assert caught[0].filename == __file__


def test_the_warning_names_a_script_run_with_python_c(monkeypatch):
    """`python -c "import hf_posenc.layers"`: the importer's globals have a loader without its source (the builtin
    importer of __main__); the warning still names the line, it does not fail the import."""
    _forget_old_names(monkeypatch)
    with pytest.warns(FutureWarning, match=_message("hf_posenc.layers")) as caught:
        exec(compile("import hf_posenc.layers", "<string>", "exec"),
             {"__name__": "__main__", "__loader__": importlib.machinery.BuiltinImporter})
    assert (caught[0].filename, caught[0].lineno) == ("<string>", 1)
