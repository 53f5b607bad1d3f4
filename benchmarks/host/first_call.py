"""First calls of new token counts under torchrun: what a server sees when a batch of a new size
arrives. Per token count (default 96 counts, 64..6144 in steps of 64) one all-gather op and one
reduce-scatter op (Llama-70B-like, K=4096) on the path --path names (default: the library's,
DISTGEMM_PATH else "auto"), each a first call; prints the median and maximum first-call ms, the
steady-call ms, where a first call's host time goes, per phase, and the memory distgemm holds
afterwards (the workspace, the collective path's scratch); writes it all as JSON to --out.

    torchrun --nproc-per-node 2 -m benchmarks.host.first_call --out first_call.json
    torchrun --nproc-per-node 4 -m benchmarks.host.first_call --path collective

A first call's ms: host wall time from the call until its result is ready (the call, then a
device synchronisation), the maximum over ranks. Host ms: until the call returns. With
``--phases``, the phases of each call (host ms, wrapped around the library's functions where
they exist; the wrappers add host time of their own; "other" is the remainder):
validation and plan (make_spec), the signature exchange, the S and path decisions, the path's
state (make_state, without what follows), the workspace lookup (workspace_for) and, when it
grows, its allocation and IPC exchange, the re-pointing of the cached plans and the freeing of
the old one, graph setup (the rest of OverlappedState.place), the entry's insertion (with an
eviction beyond the cache's bound), the graph (graph_for: creation of the GraphLauncher), the
overlapped path's call without it (the launch), the collective path's call and, inside it, the
growth of its scratch. With ``--phases`` also the host ms of cuBLASLt's own work in each call
(``_core.cublaslt_host_ms``: heuristic queries, algorithm checks, preload graphs, enqueues and
captures), inside the phases above, on rank 0. The control exchange is the shared-memory one
unless DISTGEMM_CONTROL is "store" (runtime.control_shm); ``meta.control`` says which ran.
Steady ms: CUDA events around ``--steady-calls`` calls of an already created entry, per call,
maximum over ranks.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import statistics
import time
from collections import defaultdict

from distgemm import cli

TOKENS = tuple(range(64, 6144 + 1, 64))  # 96 token counts


def summarize(values: list[float]) -> dict[str, float]:
    """median, p90, max and total of a list of ms."""
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "max": ordered[-1],
        "total": sum(ordered),
    }


class PhaseTimer:
    """Host time per phase of the current call: ``wrap`` replaces a module attribute by a timed
    wrapper (an attribute that does not exist is left out and reported in ``missing``). A phase
    entered again from inside itself (a growing workspace re-points the cached plans through
    the same functions) is timed once, by its outermost call."""

    def __init__(self):
        self.current: dict[str, float] = defaultdict(float)
        self.missing: list[str] = []
        self._restore: list[tuple] = []
        self._active: dict[str, int] = defaultdict(int)

    def wrap(self, owner, name: str, phase: str, when=None) -> None:
        fn = getattr(owner, name, None)
        if fn is None:
            self.missing.append(f"{getattr(owner, '__name__', type(owner).__name__)}.{name}")
            return

        def timed(*args, **kwargs):
            if self._active[phase] or (when is not None and not when(*args, **kwargs)):
                return fn(*args, **kwargs)
            self._active[phase] += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.current[phase] += (time.perf_counter() - t0) * 1e3
                self._active[phase] -= 1

        self._restore.append((owner, name, fn))
        setattr(owner, name, timed)

    def inside(self, phase: str) -> bool:
        """Whether a call of ``phase`` is running now (for ``wrap``'s ``when``)."""
        return self._active[phase] > 0

    def take(self) -> dict[str, float]:
        out, self.current = dict(self.current), defaultdict(float)
        return out

    def restore(self) -> None:
        for owner, name, fn in reversed(self._restore):
            setattr(owner, name, fn)


def wrap_library(timer: PhaseTimer, comm) -> None:
    """The phases of a first call, wrapped around the library's functions."""
    from distgemm import ops
    from distgemm.runtime import entry_cache
    from distgemm.runtime.paths import collective
    from distgemm.runtime.paths.overlapped import OverlappedState

    timer.wrap(ops, "make_spec", "validate+plan")
    timer.wrap(entry_cache, "choose_steps", "S decision")
    timer.wrap(entry_cache, "choose_path", "path decision")
    timer.wrap(entry_cache, "make_state", "path state")
    timer.wrap(entry_cache.EntryCache, "insert", "entry insert")  # with an eviction
    timer.wrap(type(comm), "workspace_for", "workspace")
    # Growth of the shared workspace, inside workspace_for.
    timer.wrap(type(comm), "allocate_symmetric", "workspace: allocate + IPC")
    timer.wrap(type(comm), "_workspace_grown", "workspace: re-point plans")
    timer.wrap(type(comm), "_release", "workspace: free the old one")
    timer.wrap(OverlappedState, "place", "workspace+setup")
    timer.wrap(OverlappedState, "graph_for", "graph")  # a first call: its GraphLauncher made
    timer.wrap(OverlappedState, "run", "overlap call")
    timer.wrap(collective, "run_collective", "collective call")
    # Growth of the communicator's collective scratch, and torch's GEMM (its heuristic and kernel
    # loads for a new shape), inside the collective call; the rest of it is the collective.
    timer.wrap(collective.CollectiveScratch, "_grow", "collective: scratch growth")
    for name in ("mm", "addmm"):
        timer.wrap(collective.torch, name, "collective: torch GEMM",
                   when=lambda *args, **kwargs: timer.inside("collective call"))  # fmt: skip
    timer.wrap(
        type(comm), "all_gather", "signature exchange", when=lambda s, o, what: "signature" in what
    )


def phases_of(raw: dict[str, float], total: float) -> dict[str, float]:
    """Nested phases made disjoint: the path state is make_state without OverlappedState.place,
    the graph setup is OverlappedState.place without workspace_for, the workspace's own lookup is
    workspace_for without its growth parts, the overlap call is OverlappedState.run without
    graph_for, the collective call is run_collective without its scratch's growth and torch's
    GEMM, and "other" is what no phase covers."""
    out = dict(raw)
    if "path state" in out:
        out["path state"] -= out.get("workspace+setup", 0.0)
    if "overlap call" in out:
        out["overlap call"] -= out.get("graph", 0.0)
    if "workspace+setup" in out:
        out["graph setup"] = out.pop("workspace+setup") - out.get("workspace", 0.0)
    if "workspace" in out:
        growth = sum(v for k, v in out.items() if k.startswith("workspace: "))
        out["workspace"] -= growth
    if "collective call" in out:
        out["collective call"] -= out.get("collective: scratch growth", 0.0)
        out["collective call"] -= out.get("collective: torch GEMM", 0.0)
    out["other"] = total - sum(out.values())
    return out


def main(argv=None) -> None:
    ap = cli.ArgumentParser("python3 -m benchmarks.host.first_call", __doc__)
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="comma-separated M")
    # --global-k / --global-n: torchrun reads an abbreviation like "--n" as its own option.
    ap.add_argument("--global-k", type=int, default=4096, help="K (default: issue 41's loop)")
    ap.add_argument("--global-n", type=int, default=3072, help="N (default: issue 41's loop)")
    ap.add_argument(
        "--path",
        choices=("auto", "collective", "overlap"),  # both ops' paths ("fused" is all-reduce's)
        help="the ops' path (default: the library's)",
    )
    ap.add_argument(
        "--impl",
        choices=("distgemm", "torch"),
        default="distgemm",
        help="distgemm's ops, or the unfused torch + NCCL baseline (default: distgemm)",
    )
    ap.add_argument(
        "--phases",
        action="store_true",
        help="time the phases of each first call (wrappers around the library's functions: "
        "they cost host time of their own, so the headline runs without them)",
    )
    ap.add_argument("--steady-calls", type=int, default=50)
    ap.add_argument("--steady-every", type=int, default=8, help="steady timing every n-th M")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the first calls; rank 0 prints the top and, with --out, writes the "
        "profile beside it (.prof)",
    )
    ap.add_argument("--out", help="JSON file (rank 0); with --plot, the PNG")
    ap.add_argument(
        "--plot",
        help="comma-separated JSON files of earlier runs: plot their first-call ms per token "
        "count into --out (PNG) instead of running",
    )
    args = ap.parse_args(argv)
    if args.plot:
        if not args.out:
            ap.error("--plot needs --out (the PNG)")
        return plot(args.plot.split(","), args.out)
    tokens = [int(t) for t in args.tokens.split(",") if t]

    import torch
    import torch.distributed as dist

    import distgemm
    from distgemm import _core
    from distgemm.runtime import communicator as dcomm

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    rank, tp = dist.get_rank(), dist.get_world_size()
    comm = dcomm.get_communicator(None)
    gen = torch.Generator(device=dev).manual_seed(7 + rank)
    bf = torch.bfloat16
    w_ag = torch.randn(args.global_n // tp, args.global_k, device=dev, dtype=bf, generator=gen) / 64
    w_rs = torch.randn(args.global_n, args.global_k // tp, device=dev, dtype=bf, generator=gen) / 64

    def ops_for(m: int, path: str | None = None):
        a_ag = torch.randn(m // tp, args.global_k, device=dev, dtype=bf, generator=gen)
        a_rs = torch.randn(m, args.global_k // tp, device=dev, dtype=bf, generator=gen)
        if args.impl == "torch":
            return unfused_ops(torch, dist, a_ag, w_ag, a_rs, w_rs, tp)
        return {
            "all_gather_gemm": lambda: distgemm.all_gather_gemm(a_ag, w_ag, path=path),
            "gemm_reduce_scatter": lambda: distgemm.gemm_reduce_scatter(a_rs, w_rs, path=path),
        }

    # Warm-up on a token count that is not measured: the communicator, NCCL's lazy setup and
    # both paths' one-time costs (kernel modules, the first workspace), so that what the
    # measured first calls cost is what every new token count costs.
    warm = next(m for m in range(1056, 1 << 20, 32) if m not in set(tokens))  # 32 | 4 * TP
    with torch.no_grad():
        for path in ("collective", "overlap") if args.impl == "distgemm" else (None,):
            for fn in ops_for(warm, path).values():
                fn()
    torch.cuda.synchronize()
    mem0 = torch.cuda.memory_allocated(dev)
    timer = PhaseTimer()
    if args.phases:
        wrap_library(timer, comm)
    records = []
    steady = []
    profiler = cProfile.Profile() if args.profile else None
    try:
        with torch.no_grad():
            for i, m in enumerate(tokens):
                for op, fn in ops_for(m, args.path).items():
                    torch.cuda.synchronize()
                    comm.all_gather(None, "first_call settle")
                    timer.take()
                    lt0 = _core.cublaslt_host_ms() if args.phases else {}
                    t0 = time.perf_counter()
                    if profiler is not None:
                        profiler.runcall(fn)
                    else:
                        fn()
                    host = (time.perf_counter() - t0) * 1e3
                    torch.cuda.synchronize()
                    ready = (time.perf_counter() - t0) * 1e3
                    phases = phases_of(timer.take(), host) if args.phases else {}
                    lt = {k: v - lt0[k] for k, v in _core.cublaslt_host_ms().items()} if lt0 else {}
                    # The entry just created (LRU order); the baseline has none.
                    chosen = distgemm.path_choices()[-1] if args.impl == "distgemm" else {}
                    records.append(
                        dict(op=op, m=m, host_ms=host, ms=ready, phases=phases, cublaslt_ms=lt)
                        | dict(path=chosen.get("path", "torch"), source=chosen.get("source"))
                    )
                    if i % args.steady_every == 0:
                        steady.append(dict(op=op, m=m, ms=_steady_ms(torch, fn, args.steady_calls)))
    finally:
        timer.restore()
    mem1 = torch.cuda.memory_allocated(dev)
    # The maximum over ranks of every timing.
    mine = [[r["host_ms"], r["ms"]] for r in records] + [[s["ms"], 0.0] for s in steady]
    everyone = comm.all_gather(mine, "first_call results")
    for j, r in enumerate(records):
        r["host_ms"], r["ms"] = (max(e[j][c] for e in everyone) for c in (0, 1))
    for j, s in enumerate(steady):
        s["ms"] = max(e[len(records) + j][0] for e in everyone)
    if rank == 0:
        meta = dict(tp=tp, k=args.global_k, n=args.global_n, device=torch.cuda.get_device_name(dev))
        meta["path"] = args.path or "default"
        meta["impl"] = args.impl
        meta["control"] = type(comm._ctl).__name__
        meta["phases"] = bool(args.phases)
        memory = dict(torch_grown=mem1 - mem0, distgemm=distgemm.memory_stats(comm))
        report(records, steady, timer.missing, meta, memory, args.out)
        if profiler is not None:
            print("host profile of the first calls (top 30 by own time, whole loop):")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
            if args.out:  # the whole profile, for pstats (python3 -m pstats FILE)
                profiler.dump_stats(os.path.splitext(args.out)[0] + ".prof")
    dist.barrier()
    dcomm.close_all()
    dist.destroy_process_group()


def unfused_ops(torch, dist, a_ag, w_ag, a_rs, w_rs, tp: int) -> dict:
    """The two ops as a user writes them without distgemm: NCCL all-gather of the activations,
    then torch.mm; torch.mm, then NCCL reduce-scatter of the partial result."""

    def all_gather_gemm():
        gathered = a_ag.new_empty((a_ag.shape[0] * tp, a_ag.shape[1]))
        dist.all_gather_into_tensor(gathered, a_ag)
        return torch.mm(gathered, w_ag.t())

    def gemm_reduce_scatter():
        partial = torch.mm(a_rs, w_rs.t())
        out = partial.new_empty((partial.shape[0] // tp, partial.shape[1]))
        dist.reduce_scatter_tensor(out, partial)
        return out

    return {"all_gather_gemm": all_gather_gemm, "gemm_reduce_scatter": gemm_reduce_scatter}


def _steady_ms(torch, fn, calls: int) -> float:
    for _ in range(3):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / calls


def plot(paths: list[str], png: str) -> None:
    """First-call ms per token count of each run in ``paths`` (their JSON), one panel per op, log
    scale, labelled by TP, implementation and control exchange, with each run's median."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [json.load(open(p)) for p in paths]
    ops = sorted({c["op"] for d in runs for c in d["calls"]})
    fig, axes = plt.subplots(1, len(ops), figsize=(6.5 * len(ops), 4.8), sharey=True, squeeze=False)
    for ax, op in zip(axes[0], ops):
        for d in runs:
            meta, calls = d["meta"], [c for c in d["calls"] if c["op"] == op]
            who = meta["impl"] if meta["impl"] == "torch" else f"distgemm ({meta.get('control')})"
            label = f"TP={meta['tp']} {who}, median {statistics.median(c['ms'] for c in calls):.3f}"
            ax.plot([c["m"] for c in calls], [c["ms"] for c in calls], ".-", lw=0.8, label=label)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set(title=op, xlabel="tokens (M)", yscale="log")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("first call, ms until ready (max over ranks)")
    fig.suptitle(f"First calls of new token counts, {runs[0]['meta']['device']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    print(f"wrote {png}")


def report(records, steady, missing, meta, memory, out_path) -> None:
    """Print the summary; write everything to ``out_path`` (JSON) when given."""
    first = summarize([r["ms"] for r in records])
    host = summarize([r["host_ms"] for r in records])
    phases = defaultdict(list)
    for r in records:
        for name, v in r["phases"].items():
            phases[name].append(v)
    cublaslt = defaultdict(list)
    for r in records:
        for name, v in r.get("cublaslt_ms", {}).items():
            cublaslt[name].append(v)
    paths = defaultdict(int)
    for r in records:
        paths[f"{r['op']} {r['path']} ({r['source']})"] += 1
    steady_median = statistics.median(s["ms"] for s in steady)
    print(
        f"{len(records)} first calls, TP={meta['tp']}, K={meta['k']}, N={meta['n']}, "
        f"{meta['impl']}, path {meta['path']}"
    )
    print(
        f"first call ms (until ready): median {first['median']:.3f}, p90 {first['p90']:.3f}, "
        f"max {first['max']:.3f}"
    )
    print(f"first call host ms (until return): median {host['median']:.3f}, max {host['max']:.3f}")
    print(f"steady call ms: median {steady_median:.4f} over {len(steady)} entries")
    if phases:
        print("host ms per phase of a first call: median / max / total")
    for name, v in sorted(phases.items(), key=lambda kv: -sum(kv[1])):
        s = summarize(v)
        print(f"  {name:20s} {s['median']:8.3f} {s['max']:8.3f} {s['total']:9.1f}")
    if cublaslt:
        print("cuBLASLt host ms per first call, inside the phases above: median / max / total")
    for name, v in cublaslt.items():
        s = summarize(v)
        print(f"  {name:20s} {s['median']:8.3f} {s['max']:8.3f} {s['total']:9.1f}")
    print("paths: " + ", ".join(f"{k}: {v}" for k, v in sorted(paths.items())))
    held = memory["distgemm"]
    print(
        f"device memory: torch grew by {memory['torch_grown'] / 2**20:.1f} MiB; distgemm holds a "
        f"{held['workspace_bytes'] / 2**20:.1f} MiB workspace after "
        f"{held['workspace_allocations']} allocations (largest plan "
        f"{held['largest_plan_bytes'] / 2**20:.1f} MiB)"
    )
    print(
        f"collective scratch: {held['collective_bytes'] / 2**20:.1f} MiB in "
        f"{held['collective_buffers']} buffer(s) after {held['collective_allocations']} "
        "allocations"
    )
    if missing:
        print("not wrapped (absent): " + ", ".join(missing))
    if out_path:
        out = dict(
            meta=meta,
            first_call_ms=first,
            first_call_host_ms=host,
            steady_ms_median=steady_median,
            steady=steady,
            phases={k: summarize(v) for k, v in phases.items()},
            cublaslt_ms={k: summarize(v) for k, v in cublaslt.items()},
            paths=dict(paths),
            memory_bytes=memory,
            not_wrapped=missing,
            calls=records,
        )
        with open(out_path, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
