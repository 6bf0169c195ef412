"""Ulysses sequence parallelism: every scheme's gradients with the sequence split over two CPU processes through
DeepSpeed's own wrapper and data loader (tests/sp_worker.py), and the launches that cannot train that way refused
before any weight loads. The Trainer runs through ``accelerate launch`` are in tests/test_distributed.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_distributed import SCHEMES, free_port
from test_training import _env, _recipe, workspace  # noqa: F401  (workspace: the shared fixture)
from tiny import tiny_config

WORKER = Path(__file__).parent / "sp_worker.py"
GRAD_TOL = 1e-6  # fp32; measured at most 3e-8 (the all-to-all reorders no sum; the attention kernels see other shapes)
CONTROL_MIN = 1e-3  # local positions move some gradient by 4e-3 (p-RoPE) to 0.24 (TAPA): far above GRAD_TOL


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("sp")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(free_port()), str(WORKER), str(out)], env=_env(), capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    return json.loads((out / "sp.json").read_text())


@pytest.mark.upstream  # DeepSpeed's wrapper around Transformers' attention functions, on the newest releases too
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_gradients_match_one_process(probe, scheme):
    """Split over two processes (each holding 16 of 32 tokens), the loss and the gradient of every trainable weight
    (LoRA, and TAPE's blocks with nonzero maps) equal one process's on the whole sequence; the same run with local
    positions (0..15 on both halves) does not: the test sees the positions DeepSpeed gathers."""
    case = probe[scheme]["unpacked"]
    assert case["weights"] >= 16
    assert case["loss"] == pytest.approx(case["single_loss"], rel=1e-6)
    assert case["max_grad_diff"] <= GRAD_TOL * max(1.0, case["max_grad"]), case
    control = probe[scheme]["local_positions"]
    assert control["max_grad_diff"] > CONTROL_MIN, control


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_packed_documents_are_kept_apart_or_refused(probe, scheme):
    """Two documents packed into one sequence (positions restart across the shard boundary): TAPA separates them
    from the gathered position ids, so the split run equals one process; SDPA under DeepSpeed's wrapper sees one
    causal sequence (the measured loss differs), so a restart-packed recipe on SDPA is refused for the others."""
    from hf_posenc.schemes import make_scheme
    from hf_posenc.training.sequence_parallel import sequence_parallel_refusal

    case = probe[scheme]["packed"]
    scheme_config = make_scheme(SCHEMES[scheme]["name"], **{k: v for k, v in SCHEMES[scheme].items() if k != "name"})
    refusal = sequence_parallel_refusal(tiny_config("llama"), scheme_config, scheme_config.attention_name() or "sdpa",
                                        2, world_size=2, deepspeed=True, sequences_per_device=1, packed_documents=True)
    if scheme_config.separates_packed_documents:
        assert refusal is None
        assert case["loss"] == pytest.approx(case["single_loss"], rel=1e-6)
        assert case["max_grad_diff"] <= GRAD_TOL * max(1.0, case["max_grad"]), case
    else:
        assert refusal is not None and "data.packing is 'restart'" in refusal and "flash_attention_2" in refusal
        assert abs(case["loss"] - case["single_loss"]) > 1e-3, case  # what the refusal prevents


def _refusal(**changes):
    from hf_posenc.schemes import make_scheme
    from hf_posenc.training.sequence_parallel import sequence_parallel_refusal

    args = {"config": tiny_config("llama"), "scheme": make_scheme("cope"), "attention": "sdpa", "size": 2,
            "world_size": 2, "deepspeed": True, "sequences_per_device": 1, "packed_documents": False, **changes}
    return sequence_parallel_refusal(args.pop("config"), args.pop("scheme"), args.pop("attention"), args.pop("size"),
                                     **args)


@pytest.mark.parametrize(("global_step", "accumulate", "micro_batches", "first"), [
    (2, 1, 6, 2),  # mid-epoch: the two trained micro-batches are skipped
    (7, 1, 6, 1),  # one step into the second epoch
    (3, 2, 10, 6),  # with accumulation: three steps of two micro-batches each
    (5, 2, 9, 0),  # an epoch of five steps (its last of one micro-batch) just ended: nothing to skip
], ids=["mid-epoch", "second-epoch", "accumulated", "epoch-end"])
def test_a_resume_advances_deepspeeds_loader_past_the_trained_micro_batches(tmp_path, global_step, accumulate,
                                                                            micro_batches, first):
    """:func:`resume_past_trained_shards` on a stand-in for the Trainer: the loader adapter accelerate builds
    (DeepSpeed's, a sized iterator of micro-batches) comes back advanced by (global step mod steps per epoch) ×
    accumulation, and the Trainer's own skip, which fails on that adapter, is off. The launched run's losses after a
    kill are checked by test_distributed.py::test_sequence_parallel_zero3_resumes_after_a_kill."""
    from types import SimpleNamespace

    from hf_posenc.training.sequence_parallel import resume_past_trained_shards

    class Adapter:  # as DeepSpeed's UlyssesSPDataLoaderAdapter: len() micro-batches, handed out by next()
        def __init__(self, n: int):
            self.n, self.items = n, iter(range(n))

        def __len__(self) -> int:
            return self.n

        def __iter__(self):
            return self

        def __next__(self) -> int:
            return next(self.items)

    built = []

    def build(dataloader, model):
        built.append((dataloader, model))
        return Adapter(dataloader)

    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "trainer_state.json").write_text(json.dumps({"global_step": global_step}))
    trainer = SimpleNamespace(args=SimpleNamespace(gradient_accumulation_steps=accumulate, ignore_data_skip=False),
                              accelerator=SimpleNamespace(deepspeed_ulysses_dl_adapter=build))
    resume_past_trained_shards(trainer, tmp_path / "checkpoint")
    adapted = trainer.accelerator.deepspeed_ulysses_dl_adapter(micro_batches, "model")
    assert built == [(micro_batches, "model")] and trainer.args.ignore_data_skip
    assert list(adapted) == list(range(first, micro_batches))


def test_what_cannot_split_is_refused_with_the_fix():
    """Each launch that cannot train with the sequence split names why and what to change; the tiny model's
    4/2 heads split over 2 (and 4: its key/value heads are replicated, as DeepSpeed does)."""
    from hf_posenc.schemes import make_scheme

    assert _refusal() is None and _refusal(size=4, world_size=4) is None
    cases = [
        ({"deepspeed": False}, "ulysses-sp-zero3"),
        ({"world_size": 3}, "3 processes"),
        ({"size": 3, "world_size": 3}, "4 attention heads cannot be split over 3"),
        ({"config": tiny_config("llama", hidden_size=96, num_attention_heads=6, num_key_value_heads=3, head_dim=16),
          "size": 2}, "3 key/value heads"),
        ({"attention": "eager"}, "attn_implementation='sdpa'"),
        ({"sequences_per_device": 2}, "per_device_train_batch_size: 1"),
        ({"packed_documents": True}, "data.packing: concat"),
        ({"scheme": make_scheme("tape", backend="triton")}, "backend='auto'"),
        ({"scheme": make_scheme("tape"), "config": tiny_config("llama", attention_dropout=0.1)}, "attention_dropout"),
    ]
    for changes, fix in cases:
        reason = _refusal(**changes)
        assert reason is not None and fix in reason, (changes, reason)
    assert _refusal(scheme=make_scheme("tapa"), attention="hf_posenc_tapa", packed_documents=True) is None
    assert _refusal(packed_documents=True, attention="flash_attention_2") is None


@pytest.mark.parametrize("scheme", ["tapa", "tape"])
def test_a_refused_launch_fails_before_any_weight_loads(workspace, monkeypatch, scheme):  # noqa: F811
    """A sequence-parallel launch that cannot run (here: two sequences per device) fails in run_training before
    the model loads, naming the fix; nothing is trained or written."""
    from hf_posenc.training.config import load_recipe
    from hf_posenc.training.trainer import run_training

    def no_load(*a, **k):
        raise AssertionError("a model was loaded for a refused launch")

    monkeypatch.setattr("hf_posenc.training.trainer.load_base_model", no_load)
    for var, value in (("PARALLELISM_CONFIG_SP_SIZE", "2"), ("ACCELERATE_USE_DEEPSPEED", "true"), ("WORLD_SIZE", "2")):
        monkeypatch.setenv(var, value)
    recipe = _recipe(workspace, f"sp-refused-{scheme}", scheme=SCHEMES[scheme],
                     training={"max_steps": 1, "per_device_train_batch_size": 2})
    (workspace / f"sp-refused-{scheme}.yaml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(Exception, match=r"sequence parallelism \(sp_size=2\).*per_device_train_batch_size: 1"):
        run_training(load_recipe(workspace / f"sp-refused-{scheme}.yaml"))
    assert not (workspace / f"sp-refused-{scheme}" / "log.jsonl").exists()


# -- memory ----------------------------------------------------------------------------------------------------------
MEMORY_WORKER = Path(__file__).parent / "sp_memory_worker.py"


@pytest.mark.parametrize("scheme,vocab,dominant", [("tape", 512, "backward"), ("cope", 4096, "logits")])
def test_memory_arithmetic_matches_the_measured_peak(tmp_path, scheme, vocab, dominant):
    """hf_posenc.training.memory against two CPU processes training with the sequence split and ZeRO-3: what ZeRO-3
    holds (parameter partitions and optimizer tensors, counted) within 5% of the weight and state terms, and the
    peak (that plus the resident high-water mark over one step) within 25% of the estimate (measured: 0.91x and
    1.09x), once where a layer's backward sets the peak and once where the logits do."""
    env = dict(_env(), MALLOC_MMAP_THRESHOLD_="65536")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(free_port()), str(MEMORY_WORKER), scheme, str(vocab), str(tmp_path)],
                          env=env, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    found = json.loads((tmp_path / "memory.json").read_text())
    estimate = found["estimate"]
    held = estimate["weights"] + estimate["trainable_states"]
    assert all(abs(h - held) <= 0.05 * held for h in found["held"]), (found["held"], held)
    backward = estimate["layer_recompute"] + estimate["attention_exchange"]
    assert (backward > estimate["logits"]) == (dominant == "backward")
    measured = max(h + p for h, p in zip(found["held"], found["step_peak"]))
    assert 0.75 <= measured / found["estimated_peak"] <= 1.25, (measured, found)


def test_the_memory_table_in_the_docs_is_current():
    """docs/training.md shows exactly what scripts/memory_table.py computes for the 8B recipe."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from memory_table import memory_table

    page = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    assert memory_table() in page, "docs/training.md's memory table is stale: run scripts/memory_table.py"
