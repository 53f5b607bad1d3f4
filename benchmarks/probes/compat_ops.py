"""Probe of the symm_mem fused ops as torch's micro-pipeline TP pass emits them for torchtitan's
Llama-3-8B layers: distgemm's drop-ins against what torch runs there, TP = world size, eager
(torchtitan compiles per block, without CUDA graphs), one table plus JSON.

    torchrun --nproc-per-node N -m benchmarks.probes.compat_ops [--tokens 8192] [--layers 4]
        [--profile-calls 50] --out DIR

All-gather ops, ``A_shard [tokens/TP, 4096]``, ``return_A=True`` (QKV: ``Bs`` ``[4096, 4096/TP]``,
``[4096, 1024/TP]`` twice; FC1/FC3: ``[4096, 14336/TP]`` twice; each B the ``.t()`` view of an
nn.Linear weight):

- ``unfused``: NCCL ``all_gather_into_tensor``, then ``torch.matmul`` per B (what runs where
  torch's pass leaves the all-gather unfused, as it does for torchtitan's batch-1 sequence
  all-gather);
- ``torch_fused``: ``torch.ops.symm_mem.fused_all_gather_matmul``, torch's own op;
- ``dg``: ``distgemm.compat.symm_mem.fused_all_gather_matmul`` (the gather under the widest B's
  GEMM, torch.matmul for the others);
- ``dg_concat``: the Bs concatenated along N into one N-contiguous weight, one
  ``all_gather_gemm``, each result copied out contiguous (the drop-in's earlier form).

Reduce-scatter ops, ``A [tokens, K/TP]``, ``B [K/TP, 4096]`` (O: K 4096; FC2: K 14336):
``unfused`` (``torch.matmul``, then NCCL ``reduce_scatter_tensor``), ``torch_fused``
(``torch.ops.symm_mem.fused_matmul_reduce_scatter``) and ``dg`` (distgemm's drop-in).

Each call takes the next of ``--layers`` operand sets (the pointers a model's layers give), so
that nothing is timed on one set of addresses. Per variant: its output checked against
``unfused`` once, then benchmarks/common/timing.py's steady-state window (CUDA events around each
call: the GPU's time per call, host gaps included), variants in order and the first again at the
end (A B .. A); ``host_us``: the host's time to enqueue one call, over a window of calls;
``host_profile`` (distgemm's variants): where that host time goes, cProfile over
``--profile-calls`` calls on rank 0 (every rank makes the calls), the functions of the largest
cumulative time, in us per call.
"""

from __future__ import annotations

import argparse
import os
import time

from benchmarks.common import report as out
from benchmarks.common.timing import (
    REWARM_S,
    WARMUP_S,
    RankContext,
    enable_symm_mem,
    rel_err,
    short_error,
    time_variant,
)

HIDDEN, KV_DIM, FFN = 4096, 1024, 14336  # Llama-3-8B
HOST_CALLS = 50
PROFILE_ROWS = 25  # functions kept per profile
ERR_TOL = 2e-2  # bf16 outputs of a K=4096..14336 GEMM: a relative Frobenius error well below it


def gather_cases(tp: int) -> dict[str, list[int]]:
    """The all-gather ops' B widths per rank."""
    return {"QKV": [HIDDEN // tp, KV_DIM // tp, KV_DIM // tp], "FC1+FC3": [FFN // tp] * 2}


def scatter_cases(tp: int) -> dict[str, int]:
    """The reduce-scatter ops' K per rank."""
    return {"O": HIDDEN // tp, "FC2": FFN // tp}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=4, help="operand sets cycled through")
    ap.add_argument("--profile-calls", type=int, default=50, help="0: no host profile")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    ctx = RankContext.from_torchrun()
    torch, dist = ctx.torch, ctx.dist

    from distgemm.compat import symm_mem as dg

    group_name = dist.group.WORLD.group_name
    symm_problem = enable_symm_mem(group_name)
    tp, m = ctx.tp, args.tokens
    gen = torch.Generator(device=ctx.dev).manual_seed(1234 + ctx.rank)

    def rand(*shape):
        return (torch.rand(shape, device=ctx.dev, generator=gen) * 2 - 1).to(torch.bfloat16)

    t_start = time.perf_counter()
    records = []
    for name, ns in gather_cases(tp).items():
        sets = [
            (rand(m // tp, HIDDEN), [rand(n, HIDDEN).t() for n in ns]) for _ in range(args.layers)
        ]
        gathered = torch.empty(m, HIDDEN, device=ctx.dev, dtype=torch.bfloat16)

        def unfused(a, bs):
            dist.all_gather_into_tensor(gathered, a)
            return gathered, [torch.matmul(gathered, b) for b in bs]

        def torch_fused(a, bs):
            return torch.ops.symm_mem.fused_all_gather_matmul(a, bs, 0, group_name, return_A=True)

        def dg_fused(a, bs):
            return dg.fused_all_gather_matmul(a, bs, 0, group_name, return_A=True)

        def dg_concat(a, bs):
            from distgemm import ops

            w = torch.cat(bs, dim=1).t()
            y, ga = ops.all_gather_gemm(a, w, return_gathered=True)
            return ga, [o.contiguous() for o in y.split([b.shape[1] for b in bs], dim=1)]

        fns = {
            "unfused": unfused,
            "torch_fused": torch_fused,
            "dg": dg_fused,
            "dg_concat": dg_concat,
        }
        records.append(run_case(ctx, "all_gather", name, sets, fns, symm_problem, args))
    for name, k in scatter_cases(tp).items():
        sets = [(rand(m, k), rand(HIDDEN, k).t()) for _ in range(args.layers)]
        partial = torch.empty(m, HIDDEN, device=ctx.dev, dtype=torch.bfloat16)

        def rs_unfused(a, b):
            torch.matmul(a, b, out=partial)
            y = torch.empty(m // tp, HIDDEN, device=ctx.dev, dtype=torch.bfloat16)
            dist.reduce_scatter_tensor(y, partial)
            return y

        def rs_torch(a, b):
            return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, group_name)

        def rs_dg(a, b):
            return dg.fused_matmul_reduce_scatter(a, b, "sum", 0, group_name)

        fns = {"unfused": rs_unfused, "torch_fused": rs_torch, "dg": rs_dg}
        records.append(run_case(ctx, "reduce_scatter", name, sets, fns, symm_problem, args))

    if ctx.rank == 0:
        write(torch, ctx, records, args, time.perf_counter() - t_start)
    ctx.close()


def flat(result) -> list:
    """An op's outputs as a list of tensors (A first for the all-gather ops)."""
    if isinstance(result, tuple):
        a, ys = result
        return [a, *ys]
    return [result]


def run_case(ctx, kind, name, sets, fns, symm_problem, args) -> dict:
    """One op: each variant checked against the first, then timed (A B .. A); distgemm's
    variants' host time profiled."""
    torch = ctx.torch
    ref = [t.clone() for t in flat(fns["unfused"](*sets[0]))]
    rec = {"kind": kind, "op": name, "tokens": args.tokens, "tp": ctx.tp, "layers": len(sets)}
    rec.update(ms={}, host_us={}, retargets_per_call={}, direct_per_call={}, err={}, not_run={})
    rec["host_profile"] = {}
    usable = {}
    for v, fn in fns.items():
        why = symm_problem if v == "torch_fused" else None
        err = None
        if why is None:
            try:
                got = flat(fn(*sets[0]))
                torch.cuda.synchronize()
                err = max(rel_err(torch, g, r) for g, r in zip(got, ref, strict=True))
            except Exception as e:  # noqa: BLE001 - a variant that fails is recorded, not fatal
                why = short_error(e)
        if ctx.agree_max([1.0 if why else 0.0])[0]:
            rec["not_run"][v] = why or "failed on another rank"
            continue
        rec["err"][v] = ctx.agree_max([err])[0]
        usable[v] = cycled(fn, sets)
    order = list(usable) + ["unfused"]
    for i, v in enumerate(order):
        ms = time_variant(ctx, usable[v], WARMUP_S if i == 0 else REWARM_S)
        key = v if i < len(order) - 1 else "unfused_again"
        rec["ms"][key] = ms
        per_call = host_us(ctx, usable[v])
        for field, value in zip(("host_us", "retargets_per_call", "direct_per_call"), per_call):
            rec[field][key] = value
        if ctx.rank == 0:
            print(
                f"{kind} {name} {key}: {ms:.4f} ms, host {rec['host_us'][key]:.1f} us", flush=True
            )
    for v in usable:
        if v.startswith("dg") and args.profile_calls > 0:
            rec["host_profile"][v] = host_profile(ctx, usable[v], args.profile_calls)
    return rec


def host_profile(ctx, fn, calls: int) -> list[dict]:
    """cProfile of ``calls`` calls of ``fn`` on rank 0 (every rank makes them): the PROFILE_ROWS
    functions of the largest cumulative time, us per call (rank 0's; [] on the others)."""
    import cProfile
    import pstats

    torch = ctx.torch
    torch.cuda.synchronize()
    prof = cProfile.Profile() if ctx.rank == 0 else None
    if prof:
        prof.enable()
    for _ in range(calls):
        fn()
    if prof:
        prof.disable()
    torch.cuda.synchronize()
    if not prof:
        return []
    stats = pstats.Stats(prof).stats  # (file, line, function) -> (cc, nc, tottime, cumtime, ...)
    rows = sorted(stats.items(), key=lambda kv: kv[1][3], reverse=True)[:PROFILE_ROWS]
    return [
        dict(
            function=f"{name} ({file.rsplit('/', 2)[-1]}:{line})",
            ncalls_per_call=nc / calls,
            cum_us_per_call=cum / calls * 1e6,
            own_us_per_call=tot / calls * 1e6,
        )
        for (file, line, name), (_cc, nc, tot, cum, _callers) in rows
    ]


def cycled(fn, sets):
    """``fn`` on the next operand set at each call."""
    state = {"i": 0}

    def call():
        state["i"] = (state["i"] + 1) % len(sets)
        return fn(*sets[state["i"]])

    return call


def host_us(ctx, fn) -> tuple[float, float, float]:
    """The host's time per call to enqueue HOST_CALLS calls (the slowest rank's), in us, and the
    graph retargets and the launches without a graph per call (distgemm.memory_stats'
    graph_retargets and direct_launches; 0 for torch's variants)."""
    import distgemm

    torch = ctx.torch
    torch.cuda.synchronize()
    before = distgemm.memory_stats()
    t0 = time.perf_counter()
    for _ in range(HOST_CALLS):
        fn()
    t = (time.perf_counter() - t0) / HOST_CALLS * 1e6
    torch.cuda.synchronize()
    after = distgemm.memory_stats()
    per_call = [(after[k] - before[k]) / HOST_CALLS for k in ("graph_retargets", "direct_launches")]
    return ctx.agree_max([t])[0], *per_call


def write(torch, ctx, records, args, seconds) -> None:
    meta = out.run_meta(torch, ctx.dev, ctx.tp, seconds)
    variants = ["unfused", "torch_fused", "dg", "dg_concat", "unfused_again"]
    lines = out.header_lines("symm_mem fused ops of torchtitan's Llama-3-8B layers, eager", meta)
    header = ["op", "kind", *[f"{v} ms" for v in variants], "dg vs unfused", "dg host us"]
    header += ["dg retargets/call", "dg direct/call"]
    rows = []
    for r in records:
        ms = r["ms"]
        base = (ms["unfused"] + ms["unfused_again"]) / 2
        cells = [out.number_cell(ms.get(v)) if v in ms else "-" for v in variants]
        ratio = f"{base / ms['dg']:.3f}x" if "dg" in ms else "-"
        host = f"{r['host_us'].get('dg', 0):.0f}"
        counts = [f"{r[c].get('dg', 0):.2f}" for c in ("retargets_per_call", "direct_per_call")]
        rows.append([r["op"], r["kind"], *cells, ratio, host, *counts])
        for v, why in r["not_run"].items():
            lines.append(f"not run: {r['op']} {v}: {why}")
        for v, e in r["err"].items():
            if e >= ERR_TOL:
                lines.append(f"WRONG: {r['op']} {v}: relative error {e:.3g} >= {ERR_TOL}")
    lines += out.text_table(header, rows)
    lines.append(
        "dg vs unfused: the mean of unfused's two windows over dg's time (above 1: faster)"
    )
    for r in records:
        for v, prof in r["host_profile"].items():
            lines.append(f"host profile, {r['op']} {v} (us per call: cumulative, own; calls):")
            lines += [
                f"  {p['cum_us_per_call']:8.1f} {p['own_us_per_call']:8.1f} "
                f"{p['ncalls_per_call']:5.1f}  {p['function']}"
                for p in prof[:12]
            ]
    fields = ("op", "kind", "variant", "ms", "host_us", "rel_err")
    csv_rows = [
        dict(op=r["op"], kind=r["kind"], variant=v, ms=out.number_cell(ms),
             host_us=out.number_cell(r["host_us"].get(v)),
             rel_err=out.number_cell(r["err"].get(v.removesuffix("_again"))))
        for r in records
        for v, ms in r["ms"].items()
    ]  # fmt: skip
    stem = os.path.join(args.out, out.output_stem("compat-ops", ctx.tp))
    doc = {"meta": meta, "records": records}
    out.write_files(stem, doc, {"": out.csv_text(fields, csv_rows)}, "\n".join(lines))


if __name__ == "__main__":
    main()
