"""TRL's ``SFTTrainer`` as its docs show it, on a patched model: a hand-written ``peft.LoraConfig`` and
``trainer.save_model``. The scheme's own modules (TAPE's blocks) train although the config does not name them, the
saved adapter carries the adapter record, reloads with the trained logits, and is refused on a wrong base."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import hf_posenc
from tiny import random_ids, tiny_model

pytest.importorskip("trl")
pytest.importorskip("peft")

WORDS = ["<pad>", "<s>", "</s>", "<unk>", *(f"w{i}" for i in range(60))]
SCHEMES = {"cope": {"clip_low_n": 3}, "tape": {}}


def word_tokenizer():
    """A whitespace word-level tokenizer whose ids fit the tiny models' vocabulary (128)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def text_dataset(rows: int = 16, words: int = 24):
    """Sentences in which each word follows from the one before (w_i, w_{i+1}, ...), so a model can learn them."""
    from datasets import Dataset

    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, 60, (rows,), generator=g).tolist()
    return Dataset.from_dict({"text": [" ".join(f"w{(s + i) % 60}" for i in range(words)) for s in starts]})


def patched(scheme: str):
    return hf_posenc.patch_model(tiny_model("llama"), scheme, **SCHEMES[scheme])


def train_with_trl(scheme: str, out):
    """Train and save as TRL's quickstart does, with ``peft_config=LoraConfig(target_modules=[...])``; returns the
    trainer and the hf-posenc warnings it raised."""
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(output_dir=str(out), max_steps=4, per_device_train_batch_size=4, learning_rate=5e-2,
                     warmup_steps=0, max_length=32, report_to="none", save_strategy="no", logging_strategy="no",
                     use_cpu=True, bf16=False, dataloader_num_workers=0, seed=0)  # fp32: logits compared at 1e-5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = SFTTrainer(model=patched(scheme), args=args, train_dataset=text_dataset(),
                             processing_class=word_tokenizer(),
                             peft_config=LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    trainer.train()
    trainer.save_model()
    return trainer, [str(w.message) for w in caught if "hf-posenc:" in str(w.message)]


@pytest.fixture(scope="module", params=list(SCHEMES))
def trained(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"trl-{request.param}")
    trainer, said = train_with_trl(request.param, out)
    model = trainer.model.eval()
    with torch.no_grad():
        logits = model(random_ids(2, 20)).logits
    return request.param, out, trainer, said, logits


def test_the_schemes_own_modules_train_under_a_hand_written_lora_config(trained):
    scheme, out, trainer, said, _ = trained
    own = hf_posenc.get_scheme(trainer.model.get_base_model()).trainable_modules
    assert len(said) == (1 if own else 0), said  # heard once, and only where a module would have stayed frozen
    tensors = json.loads((out / "adapter_config.json").read_text())
    assert all(m in (tensors["modules_to_save"] or []) for m in own)
    if not own:
        return
    from safetensors.torch import load_file

    saved = load_file(out / "adapter_model.safetensors")
    initial = patched(scheme).state_dict()  # the same seed: TAPE's blocks at their (zero) initialisation
    tape = {k.removeprefix("base_model.model."): v for k, v in saved.items() if ".tape." in k}
    assert tape.keys() == {k for k in initial if ".tape." in k}  # every TAPE tensor saved
    moved = [k for k, v in tape.items() if not torch.equal(v, initial[k])]
    assert moved, "TAPE's blocks did not train: the run was plain LoRA"


def test_the_trainers_adapter_reloads_with_the_trained_logits(trained):
    from peft import PeftModel

    scheme, out, _, _, logits = trained
    record = json.loads((out / "hf_posenc_adapter.json").read_text())["hf_posenc"]
    assert record["scheme"] == scheme
    assert "import hf_posenc" in (out / "README.md").read_text()  # hf-posenc's card, not PEFT's boilerplate
    reloaded = PeftModel.from_pretrained(patched(scheme), out).eval()
    with torch.no_grad():
        got = reloaded(random_ids(2, 20)).logits
    # The trained weights require grad and the loaded ones do not: CPU matmul may take another path.
    torch.testing.assert_close(got, logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("wrong", ["unpatched", "another scheme"])
def test_the_trainers_adapter_is_refused_on_a_wrong_base(trained, wrong):
    from peft import PeftModel

    scheme, out, _, _, _ = trained
    other = next(s for s in SCHEMES if s != scheme)
    base = tiny_model("llama") if wrong == "unpatched" else patched(other)
    state = {k: v.clone() for k, v in base.state_dict().items()}
    expected = "base none" if wrong == "unpatched" else f"scheme: adapter '{scheme}', base '{other}'"
    with pytest.raises(ValueError, match=expected):
        PeftModel.from_pretrained(base, out)
    after = base.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(after[k], state[k]) for k in state)  # untouched
