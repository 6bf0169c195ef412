"""Greedy generation of a ~1B Llama per positional-encoding scheme, eager and compiled, side by side in one run
(issue #31 §4, "the whole job, not just the kernel").

Measured: the wall time of ``model.generate`` — greedy, 8 sequences, a 1,024-token prompt, 256 new tokens (no
early stop: ``eos_token_id=None``) — and from it tokens/s = batch x new tokens / time (the prefill included, as
a user sees it). Two modes:

* ``eager``: the model as loaded, Transformers' default dynamic cache;
* ``static``: ``generate(..., cache_implementation="static", compile_config=CompileConfig(...))``, Transformers 5's
  documented automatic compilation: it ``torch.compile``s the model's forward for the decoding steps (the prefill
  runs uncompiled) with ``CompileConfig``'s defaults (Inductor, mode "reduce-overhead", i.e. CUDA graphs where the
  graph allows them; TAPA's and TAPE's attention is one opaque op there, which in a decoding step reads nothing on
  the host and is left inside the CUDA graphs: `cudagraph_skips` 0 says they captured it). On CPU
  Transformers compiles only when asked (``CompileConfig._compile_all_devices``, its testing switch), which the
  smoke run sets.

The model is Llama-3.2-1B's shape with random weights, bf16 on the GPU (see `model_bench.SHAPES`). Rows:
unpatched (RoPE + SDPA), CoPE (SDPA), TAPA and TAPE through their Triton kernels (``backend="triton"``). In each
mode every row first runs one untimed generate (its time is ``first_call_s``: Triton JIT, and for ``static`` the
compilation, with the number of graphs, graph breaks and CUDA-graph skips it caused), then the timed calls run
round-robin (`common.time_interleaved`); a recompilation during them is recorded. The greedy tokens of the two
modes are compared per scheme (fraction of equal new tokens; bf16 may part at near ties, so this is recorded,
not enforced; fp32 on the toy model must agree exactly, which the tests check).

Target (issue #31): TAPA and TAPE reach at least 0.8x the unpatched tokens/s, in both modes. Only a full-size
CUDA run measures it; CPU results say "cpu: not a measurement of the targets".

A row that fails records its error (type, message, traceback) per mode and the others still run; the exit code
is then 1. The JSON is rewritten after each mode, so a run cut short keeps what it finished.

Usage:
  python benchmarks/generate.py [--modes eager,static] [--schemes unpatched,cope,tapa,tape] [--new-tokens 256]
  python benchmarks/generate.py --smoke --json /tmp/generate.json   # toy Llama on CPU, fp32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

import model_bench  # noqa: E402  (imports torch only)

if __name__ == "__main__":
    model_bench.interpret_if_cpu(sys.argv[1:])  # before anything imports Triton

STEM = "generate"
MODES = ("eager", "static")
TARGETS = {"tapa": 0.8, "tape": 0.8}  # min tokens/s ratio to unpatched, in every mode
RECOMPILE_LIMIT = 64  # four models compiled in one process; torch's default (8 per code object) could be reached


def dynamo_counts() -> dict[str, int]:
    """Graphs compiled, graph breaks and CUDA-graph skips so far in this process (torch._dynamo's counters)."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "cudagraph_skips": int(counters["inductor"].get("cudagraph_skips", 0))}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


class Row:
    """One scheme's model; per mode its generate call, last output, first-call info and error."""

    def __init__(self, scheme: str, device: torch.device):
        self.scheme = scheme
        self.device = device
        self.model: torch.nn.Module | None = None
        self.build_error: dict[str, str] | None = None
        self.errors: dict[str, dict[str, str]] = {}
        self.outputs: dict[str, torch.Tensor] = {}
        self.first: dict[str, dict[str, Any]] = {}
        self.peaks: dict[str, list[int]] = {}

    def call(self, mode: str, ids: torch.Tensor, kwargs: dict[str, Any]) -> None:
        """One generate in ``mode``; a failure is recorded for (row, mode), not raised."""
        if self.model is None or mode in self.errors:
            return
        try:
            cuda = self.device.type == "cuda"
            if cuda:
                torch.cuda.reset_peak_memory_stats(self.device)
            out = self.model.generate(ids, **kwargs)  # generate runs without gradients itself
            self.outputs[mode] = out[:, ids.shape[1]:].cpu()
            if cuda:
                self.peaks.setdefault(mode, []).append(torch.cuda.max_memory_allocated(self.device))
        except Exception as exc:  # noqa: BLE001 -- recorded in the row and the exit code
            self.errors[mode] = model_bench.error_record(exc)
            model_bench.free_device_memory(self.device)


def mode_kwargs(mode: str, args: argparse.Namespace, device: torch.device, mask: torch.Tensor) -> dict[str, Any]:
    kw: dict[str, Any] = dict(attention_mask=mask, max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0,
                              eos_token_id=None)  # no end-of-sequence token (the model has none): every token made
    if mode == "static":
        from transformers import CompileConfig

        config = CompileConfig(fullgraph=args.fullgraph, mode=args.compile_mode, backend=args.compile_backend)
        if device.type != "cuda":
            config._compile_all_devices = True  # Transformers compiles on CPU only when asked (its testing switch)
        kw.update(cache_implementation="static", compile_config=config)
    return kw


def run_mode(mode: str, rows: list[Row], ids: torch.Tensor, kwargs: dict[str, Any], repeats: int,
             device: torch.device) -> dict[str, Any]:
    """Cold call per row, then round-robin timed calls; {scheme: entry} for this mode."""
    from common import sync, time_interleaved

    for row in rows:
        before = dynamo_counts()
        sync(device)
        start = time.perf_counter()
        row.call(mode, ids, kwargs)
        sync(device)
        if mode not in row.errors and row.model is not None:
            row.first[mode] = {"first_call_s": time.perf_counter() - start,
                               **({"compile": delta(dynamo_counts(), before)} if mode == "static" else {})}
            print(f"  {mode} {row.scheme}: first call {row.first[mode]['first_call_s']:.2f} s", flush=True)
        row.peaks.pop(mode, None)  # peak memory of the timed calls only
    live = {r.scheme: (lambda r=r: r.call(mode, ids, kwargs)) for r in rows
            if r.model is not None and mode not in r.errors}
    before = dynamo_counts()
    samples: dict[str, list[float]] = {}
    if live:
        _, samples = time_interleaved(live, device, repeats, warmup=0)
    recompiled = delta(dynamo_counts(), before)
    tokens = ids.shape[0] * kwargs["max_new_tokens"]
    medians = {r.scheme: statistics.median(samples[r.scheme]) for r in rows
               if r.scheme in samples and mode not in r.errors}
    base = medians.get("unpatched")
    out: dict[str, Any] = {}
    for r in rows:
        entry: dict[str, Any] = dict(r.first.get(mode, {}))
        error = r.build_error or r.errors.get(mode)
        if error is not None or r.scheme not in medians:
            entry["error"] = error or {"type": "NoSamples", "message": "no timed call"}
            out[r.scheme] = entry
            continue
        s, med = samples[r.scheme], medians[r.scheme]
        entry.update(generate_s=med, min_s=min(s), max_s=max(s), spread=(max(s) - min(s)) / med, samples_s=s,
                     tokens_per_s=tokens / med, ratio_vs_unpatched=None if base is None else base / med,
                     new_tokens_made=int(r.outputs[mode].shape[1]),
                     peak_mem_mib=max(r.peaks[mode]) / 2**20 if r.peaks.get(mode) else None)
        out[r.scheme] = entry
    return {"rows": out, "during_timing": recompiled if mode == "static" else None}


def agreement(rows: list[Row]) -> dict[str, Any]:
    """Per scheme: how far the greedy new tokens of the static (compiled) mode match the eager mode's."""
    out: dict[str, Any] = {}
    for r in rows:
        if "eager" not in r.outputs or "static" not in r.outputs:
            continue
        a, b = r.outputs["eager"], r.outputs["static"]
        if a.shape != b.shape:
            out[r.scheme] = {"error": f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}"}
            continue
        same = a == b
        first = [int(row.logical_not().nonzero()[0]) if not bool(row.all()) else None for row in same]
        out[r.scheme] = {"token_fraction": float(same.float().mean()),
                         "sequences_identical": float(same.all(dim=1).float().mean()),
                         "first_divergence": first}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_bench.add_common_arguments(ap)
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated: eager (dynamic cache), static "
                                                             "(static cache, compiled forward)")
    ap.add_argument("--batch", type=int, default=None, help="sequences (default 8; 2 under --smoke)")
    ap.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 1024; 8 under --smoke)")
    ap.add_argument("--new-tokens", type=int, default=None, help="new tokens (default 256; 4 under --smoke)")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls per row and mode (default 2; 1 under "
                                                              "--smoke)")
    ap.add_argument("--compile-mode", default="reduce-overhead", help="CompileConfig.mode (Transformers' default "
                                                                      "reduce-overhead)")
    ap.add_argument("--compile-backend", default="inductor", help="CompileConfig.backend")
    ap.add_argument("--fullgraph", action="store_true", help="CompileConfig.fullgraph: a graph break is an error")
    args = ap.parse_args(argv)
    args.argv = argv
    schemes = model_bench.parse_schemes(args.schemes)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise SystemExit(f"--modes: pick from {','.join(MODES)}, got {args.modes!r}")
    device, dtype = model_bench.resolve_device_dtype(args)
    args.batch = args.batch or (2 if args.smoke else 8)
    args.prompt = args.prompt or (8 if args.smoke else 1024)
    args.new_tokens = args.new_tokens or (4 if args.smoke else 256)
    repeats = args.repeats or (1 if args.smoke else 2)
    shape_name, shape = model_bench.model_shape(args)
    shape["max_position_embeddings"] = max(shape["max_position_embeddings"], args.prompt + args.new_tokens)
    out_path = model_bench.output_path(STEM, device, args)
    import torch._dynamo.config
    import torch._inductor.config

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)

    t0 = time.perf_counter()
    base = model_bench.build_base(shape, device, dtype, args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(3, shape["vocab_size"], (args.batch, args.prompt), generator=g).to(device)
    mask = torch.ones_like(ids)
    payload: dict[str, Any] = {
        **model_bench.header(device, dtype, args, shape_name, shape),
        "measured": "greedy model.generate wall time; tokens_per_s = batch x new_tokens / median time (prefill "
                    "included); ratio_vs_unpatched = unpatched time / row time (a tokens/s ratio)",
        "batch": args.batch, "prompt_tokens": args.prompt, "new_tokens": args.new_tokens, "repeats": repeats,
        "modes": {"eager": "dynamic cache, no compilation",
                  "static": "cache_implementation='static' + CompileConfig(mode=%r, backend=%r, fullgraph=%s): "
                            "Transformers compiles the decoding steps' forward" % (
                                args.compile_mode, args.compile_backend, args.fullgraph)},
        "peak_memory": ("torch.cuda.max_memory_allocated over a timed call, absolute (every row's model is "
                        "resident)") if device.type == "cuda" else "null on CPU",
        "modes_run": modes, "recompile_limit": torch._dynamo.config.recompile_limit,
        "inductor_graph_partition": bool(getattr(torch._inductor.config, "graph_partition", False)),
        "timing": "one untimed call per row and mode (first_call_s), then round-robin medians "
                  "(common.time_interleaved)",
        "targets_spec": {k: f"tokens/s >= {v}x unpatched in every mode" for k, v in TARGETS.items()},
        "model_info": {"params": model_bench.parameter_count(base), "build_s": time.perf_counter() - t0},
        "results": {},
    }
    print(f"{STEM}: {shape_name} ({payload['model_info']['params'] / 1e9:.3f}B params), batch {args.batch}, "
          f"prompt {args.prompt}, {args.new_tokens} new tokens, {str(dtype).removeprefix('torch.')} on "
          f"{payload['device']}, modes {modes}", flush=True)

    rows = [Row(s, device) for s in schemes]
    for row in rows:
        try:
            row.model = model_bench.patched_copy(base, row.scheme, device).eval()
        except Exception as exc:  # noqa: BLE001 -- recorded in the row and the exit code
            row.build_error = model_bench.error_record(exc)
    del base
    model_bench.free_device_memory(device)
    implementations = {r.scheme: model_bench.implementation(r.scheme, device) for r in rows}
    payload["implementations"] = implementations

    for mode in modes:
        start = time.perf_counter()
        result = run_mode(mode, rows, ids, mode_kwargs(mode, args, device, mask), repeats, device)
        result["wall_s"] = time.perf_counter() - start
        for scheme, entry in result["rows"].items():
            entry["implementation"] = implementations[scheme]
        payload["results"][mode] = result
        payload["agreement_static_vs_eager"] = agreement(rows)
        targets = {}
        for m, res in payload["results"].items():
            ratios = {k: v.get("ratio_vs_unpatched") for k, v in res["rows"].items()}
            targets[m] = model_bench.target_verdicts(ratios, {k: v for k, v in TARGETS.items() if k in ratios},
                                                     True, device, args.smoke)
        done = modes[: modes.index(mode) + 1]
        payload.update(status="complete" if done == modes else f"modes done: {done}", targets=targets,
                       peak_rss_mib=model_bench.peak_rss_mib(), wall_s=time.perf_counter() - t0)
        model_bench.write_json(out_path, payload)  # after every mode: a run cut short keeps what it finished
        print(f"\n{mode} ({result['wall_s']:.1f} s)"
              + (f", graphs compiled while timing: {result['during_timing']['graphs']}" if mode == "static" else ""))
        print(f"  {'row':<10} {'first s':>8} {'median s':>9} {'min':>8} {'max':>8} {'tok/s':>9} {'ratio':>6}  impl")
        for name, r in result["rows"].items():
            if "error" in r:
                print(f"  {name:<10} ERROR {r['error']['type']}: {r['error']['message'][:200]}")
                continue
            ratio = "-" if r["ratio_vs_unpatched"] is None else f"{r['ratio_vs_unpatched']:.3f}"
            comp = f"  compile {r['compile']}" if "compile" in r else ""
            print(f"  {name:<10} {r['first_call_s']:8.2f} {r['generate_s']:9.4f} {r['min_s']:8.4f} {r['max_s']:8.4f} "
                  f"{r['tokens_per_s']:9.1f} {ratio:>6}  {r['implementation']}{comp}", flush=True)

    for scheme, a in payload.get("agreement_static_vs_eager", {}).items():
        print(f"agreement static vs eager, {scheme}: {a}")
    for mode, ts in payload.get("targets", {}).items():
        for name, t in ts.items():
            verdict = t.get("note") or ("met" if t["met"] else "NOT met" if t["met"] is False else "no ratio")
            print(f"target {name} ({mode}): tokens/s ratio >= {t['min_ratio']}: {verdict}")
    print(f"wrote {out_path}")
    failed = any("error" in e for res in payload["results"].values() for e in res["rows"].values())
    failed |= any("error" in a for a in payload.get("agreement_static_vs_eager", {}).values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
