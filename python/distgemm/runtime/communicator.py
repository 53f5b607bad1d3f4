"""Communicator: distgemm's view of a torch.distributed process group, one process per GPU.

Built from the group the program already has (``torchrun`` + ``init_process_group``): it checks
that every rank runs on one host, on its own Hopper GPU, with peer access to the others; it
allocates its one symmetric workspace (receive slots, flags, entry barrier, epoch word; how plans
share it, how it grows and what happens across streams: ``distgemm.workspace``), exchanges its
CUDA IPC handles through the group and opens the peers' mappings; it owns the plan cache of the
ops (``distgemm.entries.PlanCache``). Everything is freed on ``close()``, on context-manager exit
and at interpreter exit; ``memory_stats()`` says what is held.

Control traffic (host names, IPC handles, plan signatures) goes through the job's key-value
store (``distgemm.control.ControlExchange``), never through NCCL: it needs no CUDA stream and no
extra sockets, and a rank that does not arrive makes the others raise ``RuntimeError`` naming it
after ``timeout_s`` instead of hanging. Every check is computed from the all-gathered data, so
all ranks raise the same exception.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from .control import ControlExchange, ExchangeMismatch, ExchangeTimeout, _default_store
from .workspace import WorkspacePool, _Workspace, control_bytes, held_memory

__all__ = ["Communicator", "get_communicator", "find_communicator", "close_all", "memory_stats"]

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
        self._pool = self._new_pool(_core.LaunchOrder(self.device.index))
        # Capture-only graphs of plans re-pointed by a growth (callers' graphs replay them:
        # kept until close) and eager graphs dropped by a growth inside a capture (destroyed
        # after the next synchronisation).
        self._kept_capturers: list[Any] = []
        self._retired_graphs: list[Any] = []
        # The fused path's control region (made at the first fused entry: a collective) and
        # launcher (distgemm.fused).
        self._fused_control: _Workspace | None = None
        self._fused_launcher: Any = None
        self._fused_receive: WorkspacePool | None = None  # the decode kernel's (fused_receive_for)
        _LIVE.add(self)

    def _new_pool(self, order, *, receive: bool = False) -> WorkspacePool:
        return WorkspacePool(
            self._allocate,
            self._repoint_receive if receive else self._repoint,
            self._release,
            # The receive region ends in no plan control region: no plan is placed there.
            control=0 if receive else control_bytes(),
            align=int(self._core.WORKSPACE_SLOT_ALIGN),
            order=order,
            # Inside a CUDA graph capture (no synchronisation, no cudaFree) a replaced workspace
            # is kept until close().
            keep_replaced=_stream_capturing,
        )

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

    # -- workspace (distgemm.workspace) ------------------------------------------------------
    def workspace_for(self, layout: dict[str, int]) -> tuple[_Workspace, list[int]]:
        """The communicator's workspace for a plan with this ``_core.workspace_layout``, and the
        plan's bases (one per rank, shifted so that its control region is the workspace's).
        Collective when the workspace has to grow (see ``distgemm.workspace``)."""
        self._require_open()
        return self._pool.place(layout)

    @property
    def workspace_control_bytes(self) -> int:
        """Bytes of the control region that ends every layout placed in the workspace."""
        return self._pool.control

    def fused_control(self) -> list[int]:
        """Every rank's fused control region (launch generation and tile flags) as seen from
        this device; allocated zeroed and exchanged at the first call (collective: called at
        the first fused entry, which every rank creates at the same call)."""
        self._require_open()
        if self._fused_control is None:
            core, bases = self._allocate(int(self._core.FUSED_CONTROL_BYTES))
            self._fused_control = _Workspace(core, 0, int(self._core.FUSED_CONTROL_BYTES), bases)
        return list(self._fused_control.bases)

    def fused_receive_for(self, layout: dict[str, int]) -> tuple[_Workspace, list[int]]:
        """The region of the decode kernel's receive buffers (``distgemm.fused``) for a fused
        entry with this layout, grown first when it does not fit (collective then, like the
        workspace's growth). Only the decode kernel writes it: its peers push their partials
        into it whenever their launch runs, which no plan's slots could allow."""
        self._require_open()
        if self._fused_receive is None:
            self._fused_receive = self._new_pool(self._pool.order, receive=True)
        return self._fused_receive.place(layout)

    @property
    def fused_launcher(self) -> Any:
        """This rank's _core.FusedLauncher (ordered by the workspace's LaunchOrder)."""
        if self._fused_launcher is None:
            self._fused_launcher = self._core.FusedLauncher(
                self.device.index, self._pool.order, self.wait_timeout_s
            )
        return self._fused_launcher

    def _allocate(self, nbytes: int) -> tuple[Any, list[int]]:
        """This rank's new workspace of ``nbytes``, exchanged with the peers (collective)."""
        core = None
        err = None
        try:
            core = self._core.IpcWorkspace(self.device.index, nbytes)
            handle = core.handle()
        except Exception as e:
            handle, err = b"", f"allocating {nbytes} bytes on {self.device}: {e}"
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
        return core, core.bases()

    def _synchronize(self) -> None:
        torch, _ = _torch()
        torch.cuda.synchronize(self.device)

    def _repoint(self, ws: _Workspace) -> None:
        """Point every cached plan at the grown workspace ``ws``. Their graphs may still run:
        outside a capture the device is synchronised before they are dropped; inside one (which
        forbids synchronising) they are kept until the next growth outside a capture or
        close(). A plan's capture-only graph, which callers' graphs replay, is kept until
        close(); the plan gets a new one on the new workspace at its next capture. A fused
        entry has no graphs: it only takes its bases in ``ws``."""
        from .entries import attach_workspace, stream_capturing
        from .fused import place_fused

        capturing = stream_capturing()
        if not capturing:
            self._synchronize()
            self._retired_graphs.clear()
        for entry in list(self.plans.values()):
            if entry.ws is None or entry.ws is ws:
                continue  # no workspace, or already on it
            if entry.fused is not None:
                if not entry.fused["receive"]:
                    # ws is the pool's current workspace and holds every layout placed before.
                    place_fused(self, entry)
                continue
            if capturing:
                self._retired_graphs.extend(entry.graphs.values())
            if entry.capturer is not None:
                self._kept_capturers.append(entry.capturer)
                entry.capturer = None
            attach_workspace(self, entry, entry.want_gathered)

    def _repoint_receive(self, ws: _Workspace) -> None:
        """Point every decode fused entry at the grown receive region ``ws`` (they have no
        graphs; a caller's graph that captured one pinned the old region, which is kept)."""
        from .fused import place_fused

        for entry in list(self.plans.values()):
            if entry.fused is not None and entry.fused["receive"] and entry.ws is not ws:
                place_fused(self, entry)

    def _release(self, workspaces: list[_Workspace]) -> None:
        """Free replaced workspaces on every rank (collective, also with none to free): each
        rank synchronises its device (only when it frees) and unmaps its peers' workspaces, the
        ranks meet, and only then does each rank free its own, which no peer maps any more."""
        if workspaces:
            self._synchronize()
        errors = []
        for w in workspaces:
            try:
                w.core.close_peers()
            except Exception as e:
                errors.append(str(e))
        self.all_gather(None, "workspace release")
        for w in workspaces:
            try:
                w.core.free()
            except Exception as e:
                errors.append(str(e))
        if errors:
            raise RuntimeError(
                f"rank {self.rank}: releasing a replaced workspace failed: {errors[0]}"
            )

    @property
    def workspace_bytes(self) -> int:
        """Device memory held by this rank's workspaces (the current one and the kept ones)."""
        return sum(w.nbytes for w in self._pool.live) + sum(self._fused_bytes())

    def memory_stats(self) -> dict[str, int]:
        """What this communicator holds on this rank (``distgemm.memory_stats``)."""
        control, receive = self._fused_bytes()
        return held_memory(
            self._pool, list(self.plans.values()), len(self._kept_capturers), control, receive
        )

    def _fused_bytes(self) -> tuple[int, int]:
        """Bytes of the fused path's control region and of its receive regions (current and
        kept)."""
        control = self._fused_control.nbytes if self._fused_control is not None else 0
        pool = self._fused_receive
        return control, sum(w.nbytes for w in pool.live) if pool is not None else 0

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
        e = (
            self.plans.graph_error()
            or next((err for g in self._kept_capturers if (err := g.error())), "")
            or (self._fused_launcher.error() if self._fused_launcher is not None else "")
            or self._pool.order.capture_error()  # captured fused launches report there
        )
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
        self._kept_capturers.clear()
        self._retired_graphs.clear()
        held = self._pool.close()
        if self._fused_receive is not None:
            held.extend(self._fused_receive.close())
            self._fused_receive = None
        if self._fused_control is not None:
            held.append(self._fused_control)
            self._fused_control, self._fused_launcher = None, None
        for w in held:
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
        for w in held:
            try:
                w.core.free()
            except Exception:
                pass

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


def _stream_capturing() -> bool:
    from .entries import stream_capturing  # entries imports this module's users: import late

    return stream_capturing()


def _refuse_during_capture(what: str) -> None:
    """RuntimeError naming `what` when the current CUDA stream is being captured; raised before
    any CUDA call, so the caller's capture stays valid."""
    if _stream_capturing():
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


def memory_stats(group=None) -> dict[str, int]:
    """What distgemm holds on this rank for ``group`` (a process group, default the world
    group, or a Communicator); never creates a communicator (all zeros where none is open):

    workspace_bytes       the symmetric workspace shared by every plan (device memory)
    kept_bytes            replaced workspaces kept because captured graphs reference them
    largest_plan_bytes    the largest plan layout placed in the workspace (total bytes); the
                          workspace is at most ``distgemm.workspace.GROWTH_HEADROOM`` above it
    workspace_allocations workspaces allocated so far (the first one and every growth)
    plans                 cached plans, at most ``max_plans`` (least recently used ones go)
    eager_graphs          instantiated graphs of the eager calls, at most ``graphs_per_plan``
                          per plan
    captured_graphs       graphs recorded into callers' CUDA graphs
    fused_control_bytes   the fused path's control region (launch generation, tile flags;
                          the CUTLASS kernel's partial buffers are placed in the workspace)
    fused_receive_bytes   the decode kernel's receive regions (the current one and those kept
                          for captured graphs): every rank's partials of the entries up to
                          ``_core.FUSED_DECODE_MAX_TOKENS`` tokens
    max_plans, graphs_per_plan  the bounds (``entries.MAX_PLANS``, ``entries.GRAPHS_PER_PLAN``)
    """
    comm = find_communicator(group)
    return comm.memory_stats() if comm is not None else held_memory(None, [])


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
