"""Sharded training of every scheme for real, on two CPU processes (gloo): DeepSpeed ZeRO-3 and Ulysses sequence
parallelism with ZeRO-3 through ``accelerate launch`` and hf-posenc's Trainer, FSDP2 through
:func:`hf_posenc.training.distributed.shard_fsdp2` (accelerate turns FSDP on only for GPU launches), each against a
single-process run of the same global batch; the saved adapters load in one process; nothing trainable is missing
from what a sharded run saves."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import hf_posenc

from hf_posenc.training.trainer import load_trained, read_log
from test_training import REPO, _env, _recipe, workspace  # noqa: F401  (workspace: the shared fixture)
from tiny import random_ids

# TAPA on its CPU path (what a CPU without TRITON_INTERPRET runs): under the suite's interpreter the automatic backend
# would run every step of these runs through the Triton kernel in Python, minutes a test; how the sharding engines
# split TAPA's positions and gradients does not depend on the backend, and the kernel's training (with gradient
# checkpointing) is tested in test_tapa.py.
SCHEMES = {"cope": {"name": "cope", "clip_low_n": 4}, "prope": {"name": "prope", "p": 0.5},
           "tapa": {"name": "tapa", "backend": "chunked"}, "tape": {"name": "tape"}}
STEPS = 3
# fp32 on both sides; ZeRO-3 and FSDP2 reduce gradients in another order than one process: measured below 2e-6
LOSS_TOL = 1e-5
LOGITS_TOL = 1e-4


DDP_CONFIG = str(REPO / "recipes/accelerate/cpu-2proc.yaml")


def free_port() -> int:
    """A TCP port free now (the mutation check runs two copies of these tests at once: no fixed ports)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_cmd(ws: Path, name: str, scheme: str, config: str | None, port: int, batch: int, steps: int = STEPS,
                save_steps: int = STEPS, *extra: str, accumulate: int = 1) -> list[str]:
    """The command that trains ``scheme`` for ``steps`` steps: under ``accelerate launch --config_file config``
    (two processes of ``batch`` each, or, sequence-parallel, one sequence of ``batch`` split over both) or in one
    process (``config`` None) with the same global batch; ``accumulate`` micro-batches a step. DDP on CPU needs
    ``use_cpu`` (the Trainer's gloo path); DeepSpeed must not have it (it would fall back to DDP)."""
    recipe = _recipe(ws, name, scheme=SCHEMES[scheme], peft={"dropout": 0.0},
                     training={"max_steps": steps, "save_steps": save_steps,
                               "use_cpu": config in (None, DDP_CONFIG), "gradient_accumulation_steps": accumulate,
                               "per_device_train_batch_size": batch, "activation_checkpointing": True},
                     output={"merge": True})
    (ws / f"{name}.yaml").write_text(yaml.safe_dump(recipe))
    cli = ["-m", "hf_posenc.training.cli", str(ws / f"{name}.yaml"), *extra]
    if config is None:
        return [sys.executable, *cli]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, "--main_process_port",
            str(port), *cli]


def _run_recipe(*args: Any, **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run(_launch_cmd(*args, **kwargs), env=_env(), capture_output=True, timeout=600)


def _losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in read_log(run_dir / "log.jsonl") if "loss" in r]


def _partition_everything(workspace: Path, shipped_name: str) -> str:
    """recipes/accelerate/``shipped_name`` as DeepSpeed receives it (accelerate's own translation), with
    ``stage3_param_persistence_threshold: 0``: DeepSpeed keeps parameters below 10·hidden_size elements whole on
    every rank, which on a tiny model is every LoRA and TAPE weight (on a 7B model they are partitioned), so the
    test partitions everything, as a real model's sizes would."""
    from accelerate.utils import DeepSpeedPlugin

    shipped = yaml.safe_load((REPO / "recipes/accelerate" / shipped_name).read_text())
    ds = dict(shipped.pop("deepspeed_config"))
    assert shipped.pop("mixed_precision") == "no"  # fp32: the JSON config then sets no precision either
    init = ds.pop("zero3_init_flag")
    config = DeepSpeedPlugin(**ds).deepspeed_config
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    stem = Path(shipped_name).stem
    (workspace / f"{stem}.json").write_text(json.dumps(config))
    shipped["deepspeed_config"] = {"deepspeed_config_file": str(workspace / f"{stem}.json"), "zero3_init_flag": init}
    (workspace / shipped_name).write_text(yaml.safe_dump(shipped))
    return str(workspace / shipped_name)


@pytest.fixture(scope="module")
def zero3_config(workspace) -> str:  # noqa: F811
    """recipes/accelerate/deepspeed-zero3-cpu.yaml, every weight partitioned (:func:`_partition_everything`)."""
    return _partition_everything(workspace, "deepspeed-zero3-cpu.yaml")


@pytest.fixture(scope="module")
def sp_config(workspace) -> str:  # noqa: F811
    """recipes/accelerate/ulysses-sp-zero3-cpu.yaml (sequence-parallel size 2 with ZeRO-3), every weight
    partitioned (:func:`_partition_everything`)."""
    return _partition_everything(workspace, "ulysses-sp-zero3-cpu.yaml")


def _compare_with_one_process(ws: Path, engine: str, config: str, scheme: str, port: int,
                              sequence_parallel: bool = False) -> None:
    """Train ``scheme`` under ``config`` (two processes of batch 2; sequence-parallel: each sequence split over
    both, 4 micro-batches of one sequence a step) and in one process (batch 4): equal losses at every step; the
    saved adapter is complete and, loaded in one process, gives the single-process adapter's logits; the merged
    checkpoint gives the same logits."""
    from hf_posenc.training.distributed import missing_from_adapter

    shape = {"batch": 1, "accumulate": 4} if sequence_parallel else {"batch": 2}
    sharded = _run_recipe(ws, f"{engine}-{scheme}", scheme, config, port, **shape)
    assert sharded.returncode == 0, sharded.stderr.decode()[-4000:]
    if not (ws / f"single-{scheme}" / "log.jsonl").exists():
        single = _run_recipe(ws, f"single-{scheme}", scheme, None, port, batch=4)
        assert single.returncode == 0, single.stderr.decode()[-4000:]
    log = [r for r in read_log(ws / f"{engine}-{scheme}" / "log.jsonl") if "loss" in r]
    assert [r["world_size"] for r in log] == [2] * STEPS  # really two processes
    assert [r.get("sequence_parallel_size") for r in log] == [2 if sequence_parallel else None] * STEPS
    a, b = _losses(ws / f"{engine}-{scheme}"), _losses(ws / f"single-{scheme}")
    assert len(a) == len(b) == STEPS
    assert a == pytest.approx(b, rel=LOSS_TOL, abs=LOSS_TOL), (a, b)

    ids = random_ids(batch=2, length=24, seed=7, vocab=16)
    model, _ = load_trained(ws / f"{engine}-{scheme}")
    assert missing_from_adapter(model, ws / f"{engine}-{scheme}" / "adapter") == []
    reference, _ = load_trained(ws / f"single-{scheme}")
    with torch.no_grad():
        got, want = model(ids).logits, reference(ids).logits
        merged = load_merged(ws / f"{engine}-{scheme}" / "merged")(ids).logits
    torch.testing.assert_close(got, want, rtol=LOGITS_TOL, atol=LOGITS_TOL)
    torch.testing.assert_close(merged, got, rtol=LOGITS_TOL, atol=LOGITS_TOL)


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_ddp_matches_one_process(workspace, scheme):  # noqa: F811
    """DDP (recipes/accelerate/cpu-2proc.yaml) with LoRA, the scheme's modules and gradient checkpointing."""
    _compare_with_one_process(workspace, "ddp", DDP_CONFIG, scheme, free_port())


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_deepspeed_zero3_matches_one_process(workspace, zero3_config, scheme):  # noqa: F811
    """ZeRO-3 (the shipped config's settings, every weight partitioned) with LoRA, the scheme's modules in
    modules_to_save and gradient checkpointing (see _compare_with_one_process)."""
    _compare_with_one_process(workspace, "zero3", zero3_config, scheme, free_port())


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_sequence_parallel_matches_one_process(workspace, sp_config, scheme):  # noqa: F811
    """Ulysses sequence parallelism with ZeRO-3 (recipes/accelerate/ulysses-sp-zero3-cpu.yaml, every weight
    partitioned): each sequence split over the two processes, LoRA, the scheme's modules in modules_to_save and
    gradient checkpointing (see _compare_with_one_process). One process on the whole sequences gives the same loss
    at every step only if the two halves saw each other through DeepSpeed's all-to-all, with global positions."""
    _compare_with_one_process(workspace, "sp", sp_config, scheme, free_port(), sequence_parallel=True)


def load_merged(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).eval()


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL to a launcher and every process below it (torchrun starts its workers in sessions of their own)."""
    import psutil

    parent = psutil.Process(proc.pid)
    for child in parent.children(recursive=True) + [parent]:
        try:
            child.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait()


def test_sequence_parallel_zero3_resumes_after_a_kill(workspace, sp_config):  # noqa: F811
    """SIGKILL to the whole launch (launcher and both ranks) of a sequence-parallel ZeRO-3 run after its first
    checkpoint; ``--resume`` continues from the sharded DeepSpeed checkpoint, DeepSpeed's sequence-sharding data
    loader skipping what was trained, and repeats the uninterrupted run's loss at every step."""
    steps = 6
    killed = _launch_cmd(workspace, "sp-killed", "tape", sp_config, free_port(), 1, steps, 2)
    with open(workspace / "sp-killed.stderr", "wb") as err:
        proc = subprocess.Popen(killed, env=_env(), stdout=subprocess.DEVNULL, stderr=err)
        ckpt = workspace / "sp-killed" / "checkpoint-2" / "trainer_state.json"
        deadline = time.time() + 300
        while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        alive = proc.poll() is None
        _kill_tree(proc)
    time.sleep(1)  # nothing may still be writing to the run's directory
    assert alive, (workspace / "sp-killed.stderr").read_text()[-3000:]
    before = [r["step"] for r in read_log(workspace / "sp-killed" / "log.jsonl") if "loss" in r]
    assert 2 <= max(before) < steps, before

    resumed = subprocess.run(_launch_cmd(workspace, "sp-killed", "tape", sp_config, free_port(), 1, steps, 2,
                                         "--resume"), env=_env(), capture_output=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr.decode()[-4000:]
    full = _run_recipe(workspace, "sp-full", "tape", sp_config, free_port(), 1, steps, 2)
    assert full.returncode == 0, full.stderr.decode()[-4000:]
    a, b = _losses(workspace / "sp-killed"), _losses(workspace / "sp-full")
    assert len(a) == len(b) == steps
    assert a == pytest.approx(b, rel=LOSS_TOL, abs=LOSS_TOL), (a, b)


# -- FSDP2 ---------------------------------------------------------------------------------------------------------
WORKER = Path(__file__).parent / "fsdp2_worker.py"


def _fsdp2(out: Path, scheme: str, port: int | None, *extra: str) -> subprocess.CompletedProcess:
    """tests/fsdp2_worker.py under torchrun with two processes (``port``), or in one process (``port`` None)."""
    launch = [] if port is None else ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                                      str(port)]
    cmd = [sys.executable, *launch, str(WORKER), scheme, str(out), *extra]
    return subprocess.run(cmd, env=_env(), capture_output=True, timeout=600)


def _load_adapter(scheme: str, adapter: Path):
    from peft import PeftModel

    sys.path.insert(0, str(WORKER.parent))
    from fsdp2_worker import OPTIONS

    from tiny import tiny_model

    base = hf_posenc.patch_model(tiny_model("llama", attn_implementation="sdpa"), scheme, **OPTIONS[scheme])
    return PeftModel.from_pretrained(base, adapter).eval()


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_fsdp2_matches_one_process(tmp_path, scheme):
    """fully_shard on every decoder layer and the root (accelerate's FSDP2 policy) with LoRA, the scheme's modules
    in modules_to_save and gradient checkpointing: the loss of every step equals one process's on the same global
    batches; the gathered adapter is complete and, loaded in this process, gives the sharded model's logits."""
    from hf_posenc.training.distributed import missing_from_adapter

    sharded = _fsdp2(tmp_path / "sharded", scheme, free_port())
    assert sharded.returncode == 0, sharded.stderr.decode()[-4000:]
    single = _fsdp2(tmp_path / "single", scheme, None)
    assert single.returncode == 0, single.stderr.decode()[-4000:]
    a = json.loads((tmp_path / "sharded" / "losses.json").read_text())
    b = json.loads((tmp_path / "single" / "losses.json").read_text())
    assert len(a) == len(b) == STEPS
    assert a == pytest.approx(b, rel=LOSS_TOL, abs=LOSS_TOL), (a, b)
    model = _load_adapter(scheme, tmp_path / "sharded" / "adapter")
    assert missing_from_adapter(model, tmp_path / "sharded" / "adapter") == []
    with torch.no_grad():
        got = model(input_ids=random_ids(batch=2, length=24, seed=7)).logits
    torch.testing.assert_close(got, torch.load(tmp_path / "sharded" / "logits.pt"), rtol=LOGITS_TOL, atol=LOGITS_TOL)


def test_fsdp2_resumes_after_a_kill(tmp_path):
    """A sharded DCP checkpoint of model and optimizer after step 2, every rank gone at once; the resumed run
    repeats the uninterrupted run's loss at every step."""
    died = _fsdp2(tmp_path / "run", "tape", free_port(), "--steps", "4", "--checkpoint-at", "2", "--die")
    assert died.returncode != 0 and (tmp_path / "run" / "checkpoint-2" / "progress.json").exists()
    assert not (tmp_path / "run" / "losses.json").exists()
    resumed = _fsdp2(tmp_path / "run", "tape", free_port(), "--steps", "4", "--resume-from", str(tmp_path / "run" / "checkpoint-2"))
    assert resumed.returncode == 0, resumed.stderr.decode()[-4000:]
    full = _fsdp2(tmp_path / "full", "tape", free_port(), "--steps", "4")
    assert full.returncode == 0, full.stderr.decode()[-4000:]
    a = json.loads((tmp_path / "run" / "losses.json").read_text())
    b = json.loads((tmp_path / "full" / "losses.json").read_text())
    assert len(a) == len(b) == 4
    assert a == pytest.approx(b, rel=LOSS_TOL, abs=LOSS_TOL), (a, b)


# -- context parallelism ---------------------------------------------------------------------------------------------
CP_PROBE = """
import torch, torch.distributed as dist, torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
dist.init_process_group("gloo")
q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
try:
    with context_parallel(init_device_mesh("cpu", (2,)), buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    print("CP-RAN")
except NotImplementedError as exc:
    print("CP-REFUSED", exc)
dist.destroy_process_group()
"""


def test_context_parallel_has_no_cpu_path_in_this_pytorch(tmp_path):
    """Why no scheme is verified with context parallelism here: PyTorch's ring attention shards SDPA's CUDA
    kernels only (no sharding strategy for the CPU flash-attention op), and accelerate enables it only with FSDP2,
    which it turns on only for GPU launches. When this test fails, PyTorch gained a CPU path: verify the frequency
    schemes with it."""
    (tmp_path / "cp.py").write_text(CP_PROBE)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(free_port()), str(tmp_path / "cp.py")], env=_env(), capture_output=True, timeout=300)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert out.count("CP-REFUSED") == 2 and "CP-RAN" not in out, out
    assert "_scaled_dot_product_flash_attention_for_cpu" in out and "sharding strategy" in out, out


@pytest.mark.parametrize("scheme", ["tapa", "tape"])
def test_context_parallel_refuses_tapa_and_tape(workspace, monkeypatch, scheme):  # noqa: F811
    """TAPA and TAPE cannot run under ring attention: a launch asking for cp_size > 1 fails before any step,
    naming what would be needed. The frequency schemes pass the same check."""
    from hf_posenc.training.config import load_recipe
    from hf_posenc.training.distributed import context_parallel_refusal
    from hf_posenc.training.trainer import run_training

    monkeypatch.setenv("PARALLELISM_CONFIG_CP_SIZE", "2")
    recipe = _recipe(workspace, f"cp-{scheme}", scheme=SCHEMES[scheme], training={"max_steps": 1})
    (workspace / f"cp-{scheme}.yaml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(RuntimeError, match="context parallelism .* " + ("ring pass of K/V with their positions"
                                                                       if scheme == "tapa" else "riding with V")):
        run_training(load_recipe(workspace / f"cp-{scheme}.yaml"))
    assert not (workspace / f"cp-{scheme}" / "log.jsonl").exists() or not _losses(workspace / f"cp-{scheme}")
    assert context_parallel_refusal("cope") is None and context_parallel_refusal("prope") is None


# -- the shipped GPU configs ---------------------------------------------------------------------------------------
CONFIG_PROBE = """
import json, os, sys
sys.path.insert(0, {tests!r})
from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin
import hf_posenc
from tiny import tiny_model
out = {{}}
if os.environ.get("ACCELERATE_USE_FSDP") == "true":
    plugin = FullyShardedDataParallelPlugin()
    model = hf_posenc.patch_model(tiny_model("llama"), "tape")
    plugin.set_auto_wrap_policy(model)
    out = {{"version": plugin.fsdp_version, "wrap": sorted(plugin.transformer_cls_names_to_wrap or []),
           "tape_in": sorted({{type(m).__name__ for m in model.modules() if hasattr(m, "tape")}})}}
if os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true":
    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig
    plugin = DeepSpeedPlugin()
    plugin.set_mixed_precision(os.environ["ACCELERATE_MIXED_PRECISION"])  # as the Accelerator does
    config = plugin.deepspeed_config
    auto = {{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0}}
    config.update({{k: v for k, v in auto.items() if config.get(k) == "auto"}})
    config["train_batch_size"] = int(os.environ["WORLD_SIZE"])
    deepspeed.init_distributed(dist_backend="gloo")
    parsed = DeepSpeedConfig(config)
    out = {{"stage": parsed.zero_optimization_stage, "gather_on_save": parsed.zero_config.gather_16bit_weights_on_model_save,
           "bf16": parsed.bfloat16_config.enabled}}
if int(os.environ.get("RANK", "0")) == 0:
    print("CONFIG" + json.dumps(out))
sys.stdout.flush()
os._exit(0)  # as a launched `hf-posenc train` rank: the interpreter's shutdown can abort a DeepSpeed rank (SIGABRT)
"""


@pytest.mark.parametrize("name", ["fsdp2", "deepspeed-zero3"])
def test_shipped_gpu_configs_parse_as_the_engines_read_them(tmp_path, name):
    """recipes/accelerate/{fsdp2,deepspeed-zero3}.yaml (8 GPUs, bf16) through ``accelerate launch`` on two CPU
    processes: accelerate's FSDP2 plugin wraps the patched model's decoder layers (where TAPE's modules live);
    DeepSpeed itself parses the ZeRO-3 config (stage 3, 16-bit gathered save, bf16). The CPU ZeRO-3 config the
    tests run is the same config with the hardware keys changed."""
    (tmp_path / "probe.py").write_text(CONFIG_PROBE.format(tests=str(Path(__file__).parent)))
    done = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                           str(REPO / f"recipes/accelerate/{name}.yaml"), "--num_processes", "2", "--main_process_port",
                           str(free_port()), str(tmp_path / "probe.py")], env=_env(), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    line = next(l for l in done.stdout.decode().splitlines() if l.startswith("CONFIG"))
    found = json.loads(line.removeprefix("CONFIG"))
    if name == "fsdp2":
        assert found == {"version": 2, "wrap": ["TapeLlamaDecoderLayer"],
                         "tape_in": ["TapeLlamaDecoderLayer"]}, found
    else:
        assert found == {"stage": 3, "gather_on_save": True, "bf16": True}, found
        gpu = yaml.safe_load((REPO / "recipes/accelerate/deepspeed-zero3.yaml").read_text())
        cpu = yaml.safe_load((REPO / "recipes/accelerate/deepspeed-zero3-cpu.yaml").read_text())
        hardware = {"num_processes", "mixed_precision"}
        assert {k: v for k, v in gpu.items() if k not in hardware} == {k: v for k, v in cpu.items() if k not in hardware}


# -- the table -----------------------------------------------------------------------------------------------------
def test_engine_table_cells_name_tests_of_this_module_and_the_docs_embed_it():
    """Each cell of hf_posenc/data/engines.json (written by scripts/engines_table.py from a run of this module)
    names a test that exists here with that scheme; docs/training.md shows exactly the committed table."""
    from hf_posenc.training.engines import ENGINES, format_engine_table, load_engine_table

    table = load_engine_table()
    module = sys.modules[__name__]
    for engine in ENGINES:
        assert list(table["cells"][engine]) == sorted(SCHEMES), engine  # every scheme this module runs, a row each
        for scheme in SCHEMES:
            entry = table["cells"][engine][scheme]
            name, _, param = entry["test"].partition("[")
            assert callable(getattr(module, name, None)), entry
            assert param in ("", f"{scheme}]"), entry
            assert (entry["status"] == "verified") == ("reason" not in entry), entry
    page = (REPO / "docs" / "training.md").read_text()
    assert format_engine_table(table) in page, "docs/training.md's engine table is stale: run scripts/engines_table.py"
