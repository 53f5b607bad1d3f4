"""GPU checks of tuning tables, one process per GPU (started by tests/gpu/test_tuning_gpu.py):

    torchrun --nproc-per-node 2 tests/gpu/tuning_worker.py --table T.json --out results.json

For every entry of the table (read from DISTGEMM_TUNING_TABLE, as a deployment would) and of a
hand-written table that forces each GEMM tile, the op with steps=None and path="auto" at a token
count in the entry's bucket: the plan takes the entry's S, the path is the entry's (source
"table"), an overlapped plan's graph runs the entry's tile (GraphLauncher.stats), and the result
matches torch in fp32 (NCCL collective + mm; relative Frobenius error < 1e-2).
"""

import argparse
import json
import os
import traceback

import torch
import torch.distributed as dist

from distgemm import ops
from distgemm.runtime import communicator as dcomm
from distgemm.runtime import entry_cache, tuning_table

TOL = 1e-2


def reference(op: str, a, w):
    """fp32 torch result of the op on this rank."""
    tp = dist.get_world_size()
    if op == "all_gather_gemm":
        full = torch.empty(a.shape[0] * tp, a.shape[1], device=a.device, dtype=torch.float32)
        dist.all_gather_into_tensor(full, a.float())
        return full @ w.float().t()
    partial = a.float() @ w.float().t()
    out = torch.empty(partial.shape[0] // tp, partial.shape[1], device=a.device)
    dist.reduce_scatter_tensor(out, partial)
    return out


def check_entry(e: tuning_table.TableEntry, tokens: int, comm, dev) -> dict:
    tp = comm.tp
    g = torch.Generator(device="cpu").manual_seed(tokens + comm.rank)
    if e.op == "all_gather_gemm":
        a_shape, w_shape = (tokens // tp, e.k), (e.n // tp, e.k)
        fn = ops.all_gather_gemm
    else:
        a_shape, w_shape = (tokens, e.k // tp), (e.n, e.k // tp)
        fn = ops.gemm_reduce_scatter
    a = torch.randn(a_shape, generator=g).to(torch.bfloat16).to(dev)
    w = (torch.randn(w_shape, generator=g) / w_shape[1] ** 0.5).to(torch.bfloat16).to(dev)
    y = fn(a, w, schedule=e.schedule, group=comm)
    torch.cuda.synchronize()
    choice = ops.path_choices(comm)[-1]  # the entry just created (LRU order)
    ref = reference(e.op, a, w)
    err = float((y.float() - ref).norm() / ref.norm())
    plan = list(entry_cache.entry_cache(comm).values())[-1]
    n128 = None
    if plan.path == "overlap":  # this one call went without a graph: the direct launcher's
        n128 = (next(iter(plan.state.graphs.values()), None) or plan.state.direct).stats()[
            "gemm_n128"
        ]
    want_n128 = {128: plan.spec.steps, 256: 0}.get(e.tile_n)
    ok = (
        choice["source"] == "table"
        and choice["path"] == e.path
        and plan.spec.steps == e.steps
        and err < TOL
        and (plan.path != "overlap" or want_n128 is None or n128 == want_n128)
    )
    return dict(
        name=f"{e.describe()} M={tokens}",
        ok=ok,
        path=choice["path"],
        source=choice["source"],
        steps=plan.spec.steps,
        want_steps=e.steps,
        tile_n=e.tile_n,
        gemm_n128=n128,
        rel_err=err,
    )


def forced_table(tp: int) -> dict:
    """Overlapped entries for Llama-8B QKV, one per tile, S = 2TP, at token counts the measured
    table does not have (plans already created keep the choice of the table they were made
    with)."""
    rows = []
    for tokens, tile in ((8192, 128), (16384, 256)):
        rows.append(
            dict(
                op="all_gather_gemm",
                schedule="ag_rotate_a",
                tp=tp,
                dtype="bf16",
                n=6144,
                k=4096,
                tokens=tokens,
                path="overlap",
                steps=2 * tp,
                tile_n=tile,
            )
        )
    return {"format": "distgemm-tuning-table", "version": 1, "entries": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--forced", required=True, help="where to write the hand-written table")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    results, sizes = [], []
    with dcomm.Communicator() as comm, torch.no_grad():
        if comm.rank == 0:
            with open(args.forced, "w") as f:
                json.dump(forced_table(comm.tp), f)
        comm.all_gather(None, "forced table written")
        # The deployment's table first, from the environment; then the hand-written one.
        for path in (None, args.forced):
            table = (
                tuning_table.active_table()
                if path is None
                else tuning_table.load_tuning_table(path)
            )
            sizes.append(len(table.entries))
            for e in sorted(table.entries.values(), key=lambda x: x.key):
                for tokens in (e.tokens, e.tokens + e.tokens // 2):  # both ends of the bucket
                    try:
                        results.append(check_entry(e, tokens, comm, dev))
                    except Exception as ex:  # noqa: BLE001
                        traceback.print_exc()
                        results.append(dict(name=e.describe(), ok=False, error=str(ex)))
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"results": results, "entries": sizes}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
