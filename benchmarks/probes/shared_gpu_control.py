"""Probe: why the first overlapped launch after a workspace growth times out on one of 2 ranks
sharing one GPU. Variants on fresh communicators; each rank dumps the control regions (own and
as mapped from the peer) after every call, and a marker test checks the peer mappings."""

import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torchrun_worker import init_rank, rank, reduce_scatter0, rel_err

from distgemm import _core, ops
from distgemm.runtime import communicator as dcomm

dev = init_rank()
R = rank()
TP = dist.get_world_size()
K, N = 4096, 8192
CTL = _core.workspace_control_layout()
out = []
path = sys.argv[1].replace(".json", f"-r{R}.json")


def flush():
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


class _Ptr:
    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {
            "shape": (n,),
            "typestr": "<i4",
            "data": (ptr, False),
            "version": 3,
        }


def words(ptr, n):
    return torch.as_tensor(_Ptr(ptr, n), device=dev)


def control(ws, j):
    """Rank j's control region in workspace ws, as mapped here: flags[0:6], barrier, epoch."""
    base = ws.bases[j] + ws.slot_capacity
    w = words(base, CTL["total_bytes"] // 4).cpu().tolist()
    return dict(
        flags=w[CTL["flags_offset"] // 4 : CTL["flags_offset"] // 4 + 6],
        barrier=w[CTL["barrier_offset"] // 4 : CTL["barrier_offset"] // 4 + TP],
        epoch=w[CTL["epoch_offset"] // 4],
        base=hex(ws.bases[j]),
        cap=ws.slot_capacity,
    )


def dump(c):
    ws = c._pool.current
    return {f"ctl{j}": control(ws, j) for j in range(TP)} if ws is not None else {}


def agree(ok):
    t = torch.tensor([1 if ok else 0])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def marker(c, tag):
    """Each rank writes 7000+rank+100*seq into flag 200 of every peer (as mapped here); every rank
    then reads its own flag 200 (control region of the current workspace)."""
    ws = c._pool.current
    val = 7000 + R + 100 * len(out)
    for j in range(TP):
        if j != R:
            words(ws.bases[j] + ws.slot_capacity + CTL["flags_offset"] + 200 * 4, 1).fill_(val)
    torch.cuda.synchronize()
    dist.barrier()
    got = words(ws.bases[R] + ws.slot_capacity + CTL["flags_offset"] + 200 * 4, 1).item()
    # reset for later
    torch.cuda.synchronize()
    dist.barrier()
    words(ws.bases[R] + ws.slot_capacity + CTL["flags_offset"] + 200 * 4, 1).fill_(0)
    torch.cuda.synchronize()
    dist.barrier()
    out.append(dict(case=tag + "/marker", got=got, wrote=val))
    flush()


def rs(c, m, seed, tag):
    gen = torch.Generator(device=dev).manual_seed(seed * 8 + R)
    a = torch.randn(m, K // TP, device=dev, generator=gen).bfloat16()
    w = (torch.randn(N, K // TP, device=dev, generator=gen) / 64).bfloat16()
    allocs = c.memory_stats()["workspace_allocations"]
    rec = dict(case=tag, m=m)
    t0 = time.perf_counter()
    try:
        z = ops.gemm_reduce_scatter(a, w, path="overlap", group=c)
        torch.cuda.synchronize()
        c.raise_launch_errors()
        ok = True
    except Exception:
        ok, rec["exc"] = False, traceback.format_exc()[-600:]
    rec["s"] = round(time.perf_counter() - t0, 3)
    rec["allocs"] = [allocs, c.memory_stats()["workspace_allocations"]]
    try:
        torch.cuda.synchronize()
        rec.update(dump(c))
    except Exception:
        rec["dump_exc"] = traceback.format_exc()[-300:]
    both = agree(ok)
    if both:
        rec["err"] = rel_err(z, reduce_scatter0(a.float() @ w.float().t()))
    rec["ok_here"], rec["ok_both"] = ok, both
    out.append(rec)
    flush()
    return both


def layout(m):
    steps = _core.default_steps("rs_tile_a", TP, m, N, K)
    return _core.build_plan("rs_tile_a", TP, steps, m, N, K, 1).layout(2)


def variant(name, seq, setup=None, pregrow=None, markers=False):
    c = dcomm.Communicator(timeout_s=120.0, wait_timeout_s=20.0)
    if setup:
        setup(c)
    for i, m in enumerate(seq):
        if pregrow and i == pregrow[0]:
            c.workspace_for(layout(pregrow[1]))
            torch.cuda.synchronize()
            out.append(
                dict(
                    case=f"{name}/pregrow",
                    allocs=c.memory_stats()["workspace_allocations"],
                    **dump(c),
                )
            )
            flush()
            if markers:
                marker(c, f"{name}/after-pregrow")
        if markers and i == 0:
            pass
        if not rs(c, m, 10 + i, f"{name}/{i}-m{m}"):
            break
        if markers:
            marker(c, f"{name}/{i}")
    try:
        c.close()
    except Exception:
        out.append(dict(case=name + "/close", exc=traceback.format_exc()[-400:]))
    flush()
    dist.barrier()
    if R == 0:
        print(name, "done", flush=True)


def keep_old(c):
    c._pool._keep_replaced = lambda: True


def no_free(c):
    # Keep every replaced workspace mapped and allocated (no close_peers, no free).
    c._pool._release = lambda workspaces: dist.barrier()


SEQ = [2048, 8192, 2048]
variant("markers", SEQ, markers=True)
variant("normal", SEQ)
variant("pregrow", SEQ, pregrow=(1, 8192), markers=True)
variant("keep_old", SEQ, setup=keep_old)
variant("no_free", SEQ, setup=no_free)
variant("big_first", [8192, 2048, 16384, 2048])
dist.barrier()
os._exit(0)
