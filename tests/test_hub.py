"""Publishing: real save_pretrained output, real commit operations and model card; only the network call is
replaced, by a local folder that receives the commit (this machine cannot reach the Hub). A test against a real
Hub endpoint runs when HF_POSENC_HUB_REPO (and a token) are configured in the environment."""

import json
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi

import hf_posenc
from fresh import jobs_for, load_in_fresh_process
from tiny import random_ids, tiny_model


class LocalHub(HfApi):
    """HfApi whose two network calls write into a local folder: ``create_commit`` receives the real
    ``CommitOperationAdd`` objects and copies their files to ``root/repo_id``."""

    def __init__(self, root: Path):
        super().__init__(token="hf_local_test_token")
        self.root, self.commits = Path(root), []

    def create_repo(self, repo_id, **kwargs):
        (self.root / repo_id).mkdir(parents=True, exist_ok=True)
        return f"local://{repo_id}"

    def create_commit(self, repo_id, operations, *, commit_message, **kwargs):
        target = self.root / repo_id
        for op in operations:
            dest = target / op.path_in_repo
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(op.path_or_fileobj, dest)
        self.commits.append({"repo": repo_id, "message": commit_message, "files": [o.path_in_repo for o in operations]})
        return self.commits[-1]


def front_matter(readme: str) -> dict:
    yaml = pytest.importorskip("yaml")
    head, sep, _ = readme.removeprefix("---\n").partition("\n---\n")
    assert sep, "model card has no YAML front matter"
    return yaml.safe_load(head)


SCHEMES = [("cope", {"clip_low_n": 3}), ("hardclip", {"clip_low_n": 2}), ("prope", {"p": 0.5}),
           ("rope", {"scaling": "yarn", "factor": 2.0}), ("tapa", {"backend": "reference"}), ("tape", {})]


def patched(scheme, options, arch="llama"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TAPA's "needs training" warning
        model = hf_posenc.patch_model(tiny_model(arch), scheme, **options)
    for name, p in model.named_parameters():
        if ".tape." in name:
            p.data = torch.randn_like(p) * 0.3
    return model


def test_every_scheme_publishes_and_loads_back_three_ways(tmp_path):
    hub = LocalHub(tmp_path / "hub")
    ids = random_ids(2, 24)
    expected, jobs = {}, {"plugin": [], "remote": [], "stock": []}
    for scheme, options in SCHEMES:
        model = patched(scheme, options)
        with torch.no_grad():
            expected[scheme] = model(ids).logits
        model.push_to_hub(f"me/{scheme}", api=hub)  # Transformers' method, routed to hf-posenc's publisher
        repo = tmp_path / "hub" / "me" / scheme
        for mode in ("plugin", "remote"):
            jobs[mode] += jobs_for([repo], mode, [scheme])
        card = (repo / "README.md").read_text()
        meta = front_matter(card)
        assert meta["library_name"] == "transformers" and "hf-posenc" in meta["tags"] and scheme in meta["tags"]
        assert meta["hf_posenc"]["scheme"] == scheme and meta["hf_posenc"]["options"] == hf_posenc.get_scheme(model).to_dict()
        assert 'from_pretrained("me/' + scheme + '")' in card and "trust_remote_code=True" in card
        assert not [f for f in os.listdir(repo) if f.endswith((".bin", ".pt", ".pkl"))]
        if scheme in ("cope", "hardclip", "prope", "rope"):
            hf_posenc.push_to_hub(model, f"me/{scheme}-stock", api=hub, stock=True)
            jobs["stock"] += jobs_for([tmp_path / "hub" / "me" / f"{scheme}-stock"], "stock", [scheme])
    assert len(hub.commits) == len(SCHEMES) + 4
    for mode, mode_jobs in jobs.items():
        results = load_in_fresh_process(mode_jobs, ids, tmp_path, mode)
        for job in mode_jobs:
            scheme = Path(job["dir"]).name.removesuffix("-stock")
            assert "error" not in results[job["out"]], results[job["out"]]
            assert torch.equal(torch.load(job["out"]), expected[scheme]), (scheme, mode)


def test_adapters_of_every_scheme_publish_and_restore_on_a_base_loaded_each_way(tmp_path):
    """A LoRA adapter (plus TAPE's own weights) on each patched base, pushed next to its base, restores on the base
    loaded with the plugin and through remote code: within float32 tolerance of the trained model (whose weights
    require grad, so CPU matmul may take another path), and bit for bit like a reload in this process (the same
    computation)."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from hf_posenc.adapters import lora_config

    hub = LocalHub(tmp_path / "hub")
    ids = random_ids(2, 24)
    expected, jobs = {}, {"plugin": [], "remote": []}
    for scheme, options in SCHEMES:
        base = patched(scheme, options, arch="qwen3")
        base.push_to_hub(f"me/{scheme}-base", api=hub)
        wrapped = peft.get_peft_model(base, lora_config(base, r=2))
        for p in wrapped.parameters():
            if p.requires_grad:
                p.data.add_(torch.randn_like(p) * 0.2)
        hf_posenc.push_to_hub(wrapped, f"me/{scheme}-adapter", api=hub, base_repo=f"me/{scheme}-base")
        repo = tmp_path / "hub" / "me" / f"{scheme}-adapter"
        card = (repo / "README.md").read_text()
        assert front_matter(card)["library_name"] == "peft"
        assert f'load_adapter(AutoModelForCausalLM.from_pretrained("me/{scheme}-base")' in card
        warning = card.index("**Run `import hf_posenc` before loading this adapter**")
        assert warning < card.index("```python\nimport hf_posenc\nfrom hf_posenc.adapters")  # read before the code
        assert ("silently drops its TAPE weights" in card) == (scheme == "tape")
        with torch.no_grad():
            trained = wrapped(ids).logits
            attn = None if scheme == "tapa" else "eager"
            reload = AutoModelForCausalLM.from_pretrained(tmp_path / "hub" / "me" / f"{scheme}-base",
                                                          attn_implementation=attn).eval()
            expected[scheme] = peft.PeftModel.from_pretrained(reload, repo)(ids).logits
        torch.testing.assert_close(expected[scheme], trained, rtol=1e-5, atol=1e-5)  # float32; dropped TAPE weights: > 1e-2
        for mode in jobs:
            jobs[mode] += jobs_for([tmp_path / "hub" / "me" / f"{scheme}-base"], f"adapter-{mode}", [scheme],
                                   adapter=str(repo))
    for mode, mode_jobs in jobs.items():
        results = load_in_fresh_process(mode_jobs, ids, tmp_path, mode)
        for job in mode_jobs:
            scheme = Path(job["dir"]).name.removesuffix("-base")
            assert "error" not in results[job["out"]], results[job["out"]]
            assert torch.equal(torch.load(job["out"]), expected[scheme]), (scheme, mode)


def test_card_carries_the_evaluation_table_and_plot(tmp_path):
    from hf_posenc.evaluation import evaluate, write_report
    from hf_posenc.models import load_tokenizer, smollm2_gguf

    tokenizer = load_tokenizer(*smollm2_gguf())
    model = patched("cope", {"clip_low_n": 3})
    model.resize_token_embeddings(len(tokenizer))
    result = evaluate({"cope": model}, tokenizer, tasks=["ppl"], lengths=[16, 32], text="The river runs. " * 60)
    write_report(result, tmp_path / "eval")
    hub = LocalHub(tmp_path / "hub")
    hf_posenc.push_to_hub(model, "me/evaluated", api=hub, tokenizer=tokenizer, eval_dir=tmp_path / "eval")
    repo = tmp_path / "hub" / "me" / "evaluated"
    card = (repo / "README.md").read_text()
    assert "## Evaluation" in card and "![perplexity](perplexity.png)" in card
    assert (repo / "perplexity.png").stat().st_size > 0 and (repo / "tokenizer_config.json").exists()
    assert_card_is_well_formed(card)


def assert_card_is_well_formed(card: str) -> None:
    """What the Hub checks of a card's metadata (huggingface_hub's parser; base_model a valid repo id), one title,
    the evaluation report's headings nested under its section, and no reference link without a target."""
    import re

    from huggingface_hub import ModelCard
    from huggingface_hub.utils import validate_repo_id

    data = ModelCard(card).data.to_dict()
    if data.get("base_model") is not None:
        validate_repo_id(data["base_model"])
    body = card.split("\n---\n", 1)[1]
    outside_code = re.sub(r"```.*?```", "", body, flags=re.S)
    assert len(re.findall(r"^# ", outside_code, flags=re.M)) == 1, "one H1 title"
    assert not re.findall(r"\[[^\]]+\](?![(:\[])", re.sub(r"`[^`]*`", "", outside_code)), "reference link without target"


@pytest.mark.parametrize("base_repo, expected", [(None, None), ("me/smollm2", "me/smollm2")])
def test_card_base_model_is_a_hub_id_never_a_local_folder(tmp_path, base_repo, expected):
    """A model loaded from a local folder (`cli-cope`) gets no base_model the Hub would reject; base_repo sets it."""
    from transformers import AutoModelForCausalLM

    patched("cope", {"clip_low_n": 3}).save_pretrained(tmp_path / "cli-cope")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "cli-cope")
    hub = LocalHub(tmp_path / "hub")
    hf_posenc.push_to_hub(model, "me/cope", api=hub, base_repo=base_repo)
    card = (tmp_path / "hub" / "me" / "cope" / "README.md").read_text()
    assert front_matter(card).get("base_model") == expected
    assert "cli-cope" not in card
    assert_card_is_well_formed(card)


def test_a_saved_adapter_names_a_loadable_base_and_its_card_says_how_to_load_it(tmp_path, monkeypatch):
    """save_adapter (what `hf-posenc train` writes): adapter_config.json names the base as a user loads it (a
    relative folder as given, `@smollm2` for the embedded model, never a folder inside this environment or the temp
    dir), and README.md (no longer PEFT's boilerplate) gives the scheme, the warning and code that loads it."""
    peft = pytest.importorskip("peft")
    import sys

    from hf_posenc.adapters import lora_config, save_adapter
    from hf_posenc.models import smollm2_gguf

    monkeypatch.chdir(tmp_path)
    tiny_model("llama").save_pretrained("base")  # unpatched, loaded back from a relative folder
    base = hf_posenc.patch_model(hf_posenc.load_model("base"), "cope", clip_low_n=3)
    model = peft.get_peft_model(base, lora_config(base, r=2))
    for p in model.parameters():
        if p.requires_grad:
            p.data.add_(torch.randn_like(p) * 0.2)
    save_adapter(model, "adapter")
    config = json.loads(Path("adapter/adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "base"
    card = Path("adapter/README.md").read_text()
    assert_card_is_well_formed(card)
    assert front_matter(card)["hf_posenc"]["options"]["clip_low_n"] == 3 and "| `clip_low_n` | `3` |" in card
    code = card.split("```python\n", 1)[1].split("```", 1)[0]
    assert code.index("import hf_posenc") < code.index("PeftModel.from_pretrained")
    assert "hf_posenc.patch_model(hf_posenc.load_model(\"base\"), 'cope', clip_low_n=3)" in code
    assert card.index("**Run `import hf_posenc` before loading this adapter**") < card.index("```python")
    scope: dict = {}
    exec(code, scope)  # the card's code, as a user pastes it, restores the trained model
    ids = random_ids()
    with torch.no_grad():
        torch.testing.assert_close(scope["model"].eval()(ids).logits, model.eval()(ids).logits)

    embedded = smollm2_gguf()[0]  # what "@smollm2" loads from, inside this environment
    for loaded_from, named in [(embedded, "@smollm2"), (str(tmp_path / "base"), None),
                               (str(Path(sys.prefix) / "models" / "x"), None), ("me/base", "me/base")]:
        base.config.name_or_path = loaded_from
        save_adapter(model, tmp_path / "again")
        config = json.loads((tmp_path / "again" / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == named, loaded_from
        card = (tmp_path / "again" / "README.md").read_text()
        assert tmp_path.as_posix() not in card.replace((tmp_path / "again").as_posix(), "") and sys.prefix not in card
        assert_card_is_well_formed(card)
    save_adapter(model, tmp_path / "given", base_name="me/patched-base")
    assert json.loads((tmp_path / "given" / "adapter_config.json").read_text())["base_model_name_or_path"] == (
        "me/patched-base")


def test_bad_pushes_are_refused_before_any_upload(tmp_path):
    hub = LocalHub(tmp_path / "hub")
    with pytest.raises(ValueError, match="carries no hf-posenc scheme"):
        hf_posenc.push_to_hub(tiny_model("llama"), "me/plain", api=hub)
    with pytest.raises(ValueError, match="no stock Transformers equivalent"):
        hf_posenc.push_to_hub(patched("tape", {}), "me/tape-stock", api=hub, stock=True)
    with pytest.raises(FileNotFoundError, match="report.md not found"):
        hf_posenc.push_to_hub(patched("cope", {}), "me/x", api=hub, eval_dir=tmp_path)
    with pytest.raises(ValueError, match="repo_id must be"):
        hf_posenc.push_to_hub(patched("cope", {}), "", api=hub)
    assert hub.commits == [] and not (tmp_path / "hub").exists()


@pytest.mark.skipif(not os.environ.get("HF_POSENC_HUB_REPO"), reason="set HF_POSENC_HUB_REPO (and HF_TOKEN, "
                    "optionally HF_ENDPOINT) to test against a real Hub endpoint")
def test_against_a_real_hub_endpoint():
    from transformers import AutoModelForCausalLM

    repo = os.environ["HF_POSENC_HUB_REPO"]
    model = patched("cope", {"clip_low_n": 3})
    hf_posenc.push_to_hub(model, repo, private=True)
    loaded = AutoModelForCausalLM.from_pretrained(repo, attn_implementation="eager")
    ids = random_ids()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
