"""Communicator: distgemm's view of a torch.distributed process group, one process per GPU.

Built from the group the program already has (``torchrun`` + ``init_process_group``): it checks
that every rank runs on one host, on its own Hopper GPU, with peer access to the others; it
allocates the symmetric workspaces (receive slots, flags, entry barrier, epoch word), exchanges
their CUDA IPC handles through the group and opens the peers' mappings; it owns the plan cache of
the ops (``distgemm.entries.PlanCache``). Everything is freed on ``close()``, on context-manager
exit and at interpreter exit.

Control traffic (host names, IPC handles, plan signatures) goes through the job's key-value
store (``distgemm.control.ControlExchange``), never through NCCL: it needs no CUDA stream and no
extra sockets, and a rank that does not arrive makes the others raise ``RuntimeError`` naming it
after ``timeout_s`` instead of hanging. Every check is computed from the all-gathered data, so
all ranks raise the same exception.

Workspace sharing. Plans share workspaces: a plan uses the biggest existing workspace whose
control region (flags, barrier slots, epoch word) has its layout, and a new one is allocated
only when none is big enough. The Plan places the control region right after the slots
(``Plan::layout``), so a plan with fewer slot bytes than the workspace gets a base shifted by
the difference: its control region then lands on the same addresses as every other plan's. That
matters: the epoch word and the barrier slots carry the launch generation from one launch to the
next, and a flag of one plan must never sit inside another plan's slots. Launches on one device
never overlap (same stream, or ``LaunchOrder`` makes a new stream wait), and each launch's entry
barrier waits until every peer has finished its previous launch, so plans can reuse each other's
slots.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .control import ControlExchange, ExchangeMismatch, ExchangeTimeout, _default_store

__all__ = ["Communicator", "get_communicator", "find_communicator", "close_all"]

# Set to 1 to let several ranks share one GPU: a functional test of the multi-rank paths (CUDA
# IPC, flags, entry barrier, cross-rank errors) on a one-GPU machine. The ranks' kernels then
# time-slice the GPU while they spin on each other's flags: correct but slow, never for timing.
SHARED_GPU_ENV = "DISTGEMM_ALLOW_SHARED_GPU"


def _torch():
    import torch
    import torch.distributed as dist

    return torch, dist


# ---------------------------------------------------------------------------------------------
# Checks on all-gathered data: pure functions (no torch.distributed), so that every rank computes
# the same verdict and the CPU tests can exercise every message.


def check_group_info(infos: Sequence[dict[str, Any]], allow_shared_gpu: bool = False) -> str | None:
    """The setup problem of a group, or None. ``infos[r]`` is what rank r reported: host name,
    GPU uuid, compute capability, CUDA ordinal, and ``peer_ok`` (uuid -> bool or None).
    ``allow_shared_gpu`` lets several ranks use one GPU (functional tests only, see
    ``SHARED_GPU_ENV``)."""
    tp = len(infos)
    if tp < 1 or tp > 8:
        return f"distgemm supports groups of 1 to 8 ranks (TP), this group has {tp}"
    hosts = [i["host"] for i in infos]
    if len(set(hosts)) > 1:
        where = ", ".join(f"rank {r} on '{h}'" for r, h in enumerate(hosts))
        return (
            "distgemm needs every rank of the group on one host (CUDA IPC and NVLink peer "
            f"access): {where}"
        )
    seen: dict[str, int] = {}
    for r, i in enumerate(infos):
        if i.get("error"):
            return f"rank {r}: {i['error']}"
        if i["uuid"] in seen and not allow_shared_gpu:
            return (
                f"ranks {seen[i['uuid']]} and {r} use the same GPU (cuda:{i['device']}): each "
                "rank needs its own GPU; call torch.cuda.set_device(local_rank) before "
                "creating the Communicator or calling an op"
            )
        seen[i["uuid"]] = r
    for r, i in enumerate(infos):
        cap = tuple(i["capability"])
        if cap[0] != 9:
            return (
                f"rank {r}: GPU '{i['name']}' has compute capability {cap[0]}.{cap[1]}; the "
                "distgemm kernels are built for Hopper (sm_90a)"
            )
    for r, i in enumerate(infos):
        for q, j in enumerate(infos):
            if q == r:
                continue
            ok = i["peer_ok"].get(j["uuid"])
            if ok is False:
                return (
                    f"rank {r} (cuda:{i['device']}) has no peer access to rank {q}'s GPU: "
                    "distgemm needs NVLink/PCIe peer access between every pair of ranks"
                )
    return None


@dataclass
class _Workspace:
    core: Any  # _core.IpcWorkspace
    slot_capacity: int  # bytes before the control region
    control: tuple[int, int, int]  # (flags_bytes, barrier_bytes, control bytes)
    bases: list[int] = field(default_factory=list)  # every rank's base, as seen from this device
    order: Any = None  # _core.LaunchOrder shared by every graph on this workspace
    # A plan on this workspace was recorded into a caller's CUDA graph, whose replays read and
    # write it: it must not be freed (nor shrunk, nor replaced) before Communicator.close().
    pinned: bool = False


class Communicator:
    """distgemm's state for one torch.distributed process group (default: the world group).

    Create it on every rank of the group at the same point of the program (it is a collective),
    after ``torch.distributed.init_process_group`` and ``torch.cuda.set_device(local_rank)``.
    The ops (``distgemm.all_gather_gemm`` ...) create one per group on first use; create one
    yourself to choose the timeouts or to free its memory early (``close()`` or ``with``).

    timeout_s: bound of every control exchange (setup, plan creation, close): a rank that does
        not arrive makes the others raise RuntimeError naming the exchange.
    wait_timeout_s: bound of every in-kernel wait (entry barrier, data flags) of a launch; a
        timeout is reported as RuntimeError naming the rank and the iteration, at the next op
        call on this communicator or at ``check()``.
    """

    def __init__(self, group=None, *, timeout_s: float = 60.0, wait_timeout_s: float = 5.0):
        torch, dist = _torch()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "distgemm.Communicator needs torch.distributed: call "
                "torch.distributed.init_process_group() first (e.g. under torchrun)"
            )
        if not torch.cuda.is_available():
            raise RuntimeError("distgemm.Communicator needs CUDA GPUs; torch sees none")
        from . import _core
        from .entries import PlanCache

        if not getattr(_core, "cuda_runtime", False):
            raise RuntimeError(
                "distgemm was built without the CUDA runtime (no nvcc at build time "
                "or DISTGEMM_CUDA=OFF): reinstall with nvcc on PATH"
            )
        if not (0 < timeout_s <= 3600) or not (0 < wait_timeout_s <= 3600):
            raise ValueError(
                f"timeouts must be in (0, 3600] s, got timeout_s={timeout_s} "
                f"wait_timeout_s={wait_timeout_s}"
            )
        self._core = _core
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.tp = dist.get_world_size(self.group)
        if self.rank < 0:
            raise RuntimeError("this process is not a member of the group passed to Communicator")
        self.timeout_s = float(timeout_s)
        self.wait_timeout_s = float(wait_timeout_s)
        self.device = torch.device("cuda", torch.cuda.current_device())
        self._closed = False
        self._lock = threading.RLock()
        self._workspaces: list[_Workspace] = []
        self.plans = PlanCache()  # the ops' entries (distgemm.entries)
        self._broken: str | None = None
        ranks = dist.get_process_group_ranks(self.group)
        # Bounded, CPU-only control exchanges through the job's key-value store (see the module
        # docstring).
        self._ctl = ControlExchange(_default_store(), ranks, self.rank, self.timeout_s)
        infos = self.all_gather(self._local_info(torch), "setup (host, GPU and peer-access check)")
        problem = check_group_info(infos, os.environ.get(SHARED_GPU_ENV) == "1")
        if problem:
            raise RuntimeError(problem)
        _LIVE.add(self)

    # -- control plane ---------------------------------------------------------------------
    def all_gather(self, obj: Any, what: str) -> list[Any]:
        """All-gather a picklable object over the control group; RuntimeError (naming ``what``)
        when a rank does not arrive within timeout_s."""
        try:
            return self._ctl.all_gather(obj, what)
        except ExchangeTimeout as e:
            who = (
                f"rank(s) {e.missing} did not arrive"
                if e.missing
                else "this rank arrived after another rank had given up waiting"
            )
            msg = (
                f"rank {self.rank}: control exchange #{self._ctl.seq} ({what}) did not complete "
                f"within {self.timeout_s:g} s: {who} (another rank raised an error, exited, "
                "called a different op, or the ranks created a different number of "
                "Communicators for this group)"
            )
        except ExchangeMismatch as e:
            msg = (
                f"rank {self.rank}: control exchange #{self._ctl.seq}: the ranks are out of step: "
                + ", ".join(f"rank {r} at '{w}'" for r, w in enumerate(e.whats))
                + "; every rank must make the same distgemm calls in the same order"
            )
        # The ranks' exchange sequences no longer match: nothing later could pair up.
        self._broken = (
            msg + ". This communicator can no longer be used; create a new one on every rank"
        )
        raise RuntimeError(msg)

    def _local_info(self, torch) -> dict[str, Any]:
        info: dict[str, Any] = {"host": socket.gethostname(), "device": self.device.index}
        try:
            props = torch.cuda.get_device_properties(self.device)
            info.update(
                uuid=str(props.uuid), name=props.name, capability=(props.major, props.minor)
            )
            peer_ok: dict[str, bool | None] = {}
            for d in range(torch.cuda.device_count()):
                if d == self.device.index:
                    continue
                uuid = str(torch.cuda.get_device_properties(d).uuid)
                peer_ok[uuid] = bool(torch.cuda.can_device_access_peer(self.device.index, d))
            info["peer_ok"] = peer_ok
        except Exception as e:  # reported through the exchange so that every rank raises
            info.update(
                error=f"querying cuda:{self.device.index} failed: {e}",
                uuid="?",
                name="?",
                capability=(0, 0),
                peer_ok={},
            )
        return info

    # -- workspaces --------------------------------------------------------------------------
    def workspace_for(self, layout: dict[str, int]) -> tuple[_Workspace, list[int]]:
        """A workspace for a plan with this ``_core.workspace_layout``, and the plan's bases (one
        per rank, shifted so that its control region is the workspace's). Collective when a new
        workspace has to be allocated."""
        self._require_open()
        slots = int(layout["slots_bytes"])
        control = (
            int(layout["flags_bytes"]),
            int(layout["barrier_bytes"]),
            int(layout["total_bytes"]) - slots,
        )
        fits = [w for w in self._workspaces if w.control == control and w.slot_capacity >= slots]
        if fits:
            ws = max(fits, key=lambda w: w.slot_capacity)
        else:
            ws = self._allocate(slots, control)
        shift = ws.slot_capacity - slots
        return ws, [b + shift for b in ws.bases]

    def _allocate(self, slots: int, control: tuple[int, int, int]) -> _Workspace:
        core = None
        err = None
        try:
            core = self._core.IpcWorkspace(self.device.index, slots + control[2])
            handle = core.handle()
        except Exception as e:
            handle, err = b"", f"allocating {slots + control[2]} bytes on {self.device}: {e}"
        handles = self.all_gather((handle, err), "workspace IPC handle exchange")
        failed = [(r, h[1]) for r, h in enumerate(handles) if h[1]]
        if not failed:
            try:
                core.open_peers([h[0] for h in handles], self.rank)
            except Exception as e:
                err = str(e)
            opened = self.all_gather(err, "workspace IPC open")
            failed = [(r, e) for r, e in enumerate(opened) if e]
        if failed:
            if core is not None:
                core.free()
            r, e = failed[0]
            raise RuntimeError(f"distgemm workspace setup failed on rank {r}: {e}")
        ws = _Workspace(
            core=core,
            slot_capacity=slots,
            control=control,
            bases=core.bases(),
            order=self._core.LaunchOrder(self.device.index),
        )
        self._workspaces.append(ws)
        return ws

    @property
    def workspace_bytes(self) -> int:
        """Device memory held by this rank's workspaces."""
        return sum(w.core.nbytes for w in self._workspaces)

    # -- errors ------------------------------------------------------------------------------
    def raise_if_broken(self) -> None:
        if self._broken:
            raise RuntimeError(self._broken)

    def mark_broken(self, message: str) -> None:
        self._broken = (
            f"rank {self.rank}: {message}. This communicator can no longer launch "
            "(the ranks' launch generations are out of step); close it and create a "
            "new one after fixing the cause"
        )

    def check(self) -> None:
        """Synchronise this rank's device and raise RuntimeError if any launch timed out (a rank
        did not arrive at the entry barrier, or a flag did not arrive), replays of CUDA graphs
        that captured an op included. RuntimeError inside a CUDA graph capture (it synchronises,
        which a capture forbids): call it after the replays."""
        torch, _ = _torch()
        _refuse_during_capture("Communicator.check() synchronises the device")
        self.raise_if_broken()
        self._require_open()
        torch.cuda.synchronize(self.device)
        e = self.plans.graph_error()
        if e:
            self.mark_broken(e)
            self.raise_if_broken()

    # -- lifetime ----------------------------------------------------------------------------
    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError("this distgemm Communicator was closed; create a new one")

    @property
    def closed(self) -> bool:
        return self._closed

    def drop_plan(self, key) -> None:
        torch, _ = _torch()
        self.plans.drop(key, lambda: torch.cuda.synchronize(self.device))

    def close(self) -> None:
        """Free every graph and workspace of this rank. Collective: call it on every rank (the
        peers' mappings of this rank's memory are closed before it is freed). CUDA graphs that
        captured an op of this communicator use that memory: replaying one after close() is
        invalid (reset or drop them first). RuntimeError inside a CUDA graph capture."""
        if self._closed:
            return
        torch, dist = _torch()
        _refuse_during_capture("Communicator.close() frees memory the capture may use")
        self._closed = True
        _LIVE.discard(self)
        try:
            torch.cuda.synchronize(self.device)
        except Exception:
            pass  # a broken context: still release what can be released
        self.plans.release()
        for w in self._workspaces:
            try:
                w.core.close_peers()
            except Exception:
                pass
        # Every rank has unmapped its peers before anyone frees: a barrier on the control store
        # (skipped when torch.distributed is already gone at interpreter exit). Bounded: a rank
        # that died must not hold the others' exit for the whole control timeout.
        try:
            if dist.is_initialized():
                self._ctl.all_gather(None, timeout_s=min(self.timeout_s, 10.0))
        except Exception:
            pass
        for w in self._workspaces:
            try:
                w.core.free()
            except Exception:
                pass
        self._workspaces.clear()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = (
            "closed"
            if self._closed
            else f"{len(self.plans)} plans, {self.workspace_bytes} workspace bytes"
        )
        return f"Communicator(rank={self.rank}, tp={self.tp}, device={self.device}, {state})"


def _refuse_during_capture(what: str) -> None:
    """RuntimeError naming `what` when the current CUDA stream is being captured; raised before
    any CUDA call, so the caller's capture stays valid."""
    from .entries import stream_capturing

    if stream_capturing():
        raise RuntimeError(
            f"{what}: not allowed inside a CUDA graph capture; call it outside "
            "torch.cuda.graph(...)"
        )


_LIVE: weakref.WeakSet[Communicator] = weakref.WeakSet()
_DEFAULT: dict[Any, Communicator] = {}


def find_communicator(group=None) -> Communicator | None:
    """The open communicator the ops use for ``group`` if one exists, else None (never creates
    one: creating is a collective)."""
    if isinstance(group, Communicator):
        return None if group._closed else group
    comm = _DEFAULT.get(group)  # group None: the world group's, found without asking torch
    if comm is None and group is None:
        _, dist = _torch()
        comm = _DEFAULT.get(dist.group.WORLD) if dist.is_initialized() else None
    return None if comm is None or comm._closed else comm


def get_communicator(group=None) -> Communicator:
    """The communicator the ops use for ``group``: a Communicator passes through; a process group
    (default: the world group) gets one, created on first use (a collective)."""
    comm = _DEFAULT.get(group)  # the per-call case: a known group (None: the world's), one lookup
    if comm is not None and not comm._closed:
        return comm
    if isinstance(group, Communicator):
        group._require_open()
        return group
    comm = find_communicator(group)
    if comm is None:
        _, dist = _torch()
        key = group if group is not None else (dist.group.WORLD if dist.is_initialized() else None)
        comm = _DEFAULT[key] = Communicator(group)
        if group is None:
            _DEFAULT[None] = comm
    return comm


def close_all() -> None:
    """Close every live communicator (also run at interpreter exit)."""
    for comm in list(_LIVE):
        comm.close()
    _DEFAULT.clear()


atexit.register(close_all)
