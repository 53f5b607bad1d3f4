"""Communicator: distgemm's view of a torch.distributed process group, one process per GPU.

Built from the group the program already has (``torchrun`` + ``init_process_group``): it checks
that every rank runs on one host, on its own Hopper GPU, with peer access to the others; it
allocates its one symmetric workspace (receive slots, flags, entry barrier, epoch word; how plans
share it, how it grows and what happens across streams: ``distgemm.runtime.workspace``),
exchanges its CUDA IPC handles through the group and opens the peers' mappings. Everything is
freed on ``close()``, on context-manager exit and at interpreter exit.

The layers above hang their per-communicator state on it as *attachments* (the entry cache of
the ops, the fused path's buffers, the collective path's scratch, the all-reduce's buffers):
objects that the communicator calls back when its workspace grows, when it looks for launch
errors, when it reports memory and when it closes (``Attachment``). The communicator never
imports them.

Control traffic (host names, IPC handles, plan signatures) never goes through NCCL: no CUDA
stream, no extra sockets, and a rank that does not arrive makes the others raise RuntimeError
naming it after ``timeout_s``. The setup's exchange goes through the job's key-value store
(``runtime.control``), the rest through a file every rank on this host maps
(``runtime.control_shm``: no round trip per first call). Every check is computed from the
all-gathered data, so all ranks raise the same exception.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .. import _core
from .capture import refuse_during_capture, stream_capturing
from .control import ControlExchange, ExchangeMismatch, ExchangeTimeout, default_store
from .control_shm import shared_memory_exchange
from .workspace import Workspace, WorkspacePool, control_bytes

__all__ = [
    "Attachment",
    "Communicator",
    "get_communicator",
    "find_communicator",
    "close_all",
]

# Set to 1 to let several ranks share one GPU: a functional test of the multi-rank paths on a
# one-GPU machine (the kernels time-slice the GPU while they spin: correct, never for timing).
SHARED_GPU_ENV = "DISTGEMM_ALLOW_SHARED_GPU"


def _torch():
    """torch and torch.distributed, imported at a communicator's first use: the plan layer and
    the CPU tests of this module's pure parts run without them."""
    import torch
    import torch.distributed as dist

    return torch, dist


class Attachment(Protocol):
    """Per-communicator state of a layer above (``Communicator.attach``), called back by the
    communicator. Every method runs on every rank at the same point of the program."""

    def workspace_grown(self, ws: Workspace, capturing: bool) -> None:
        """The workspace was replaced by ``ws`` (the device was synchronised unless
        ``capturing``): re-point what was placed in the old one."""

    def launch_error(self) -> str:
        """'' or the first timeout report of this state's launches (read after synchronising)."""

    def memory_stats(self) -> dict[str, int]:
        """This state's keys of ``distgemm.memory_stats``."""

    def close(self) -> list[Workspace]:
        """Drop everything; return the symmetric regions this state allocated itself, which the
        communicator releases with its own (collective-safely)."""


# ---------------------------------------------------------------------------------------------
# Checks on all-gathered data: pure functions (no torch.distributed), so that every rank computes
# the same verdict and the CPU tests can exercise every message.


def group_problem(infos: Sequence[dict[str, Any]], allow_shared_gpu: bool = False) -> str | None:
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
        call on this communicator or at ``raise_launch_errors()``.
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
        if not getattr(_core, "cuda_runtime", False):
            raise RuntimeError(
                f"distgemm was built without the CUDA runtime ({_core.cuda_runtime_reason}): "
                "reinstall on a machine with a GPU and nvcc, or with DISTGEMM_CUDA=ON bash "
                "scripts/install.sh"
            )
        if not (0 < timeout_s <= 3600) or not (0 < wait_timeout_s <= 3600):
            raise ValueError(
                f"timeouts must be in (0, 3600] s, got timeout_s={timeout_s} "
                f"wait_timeout_s={wait_timeout_s}"
            )
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
        self.broken: str | None = None
        # The layers above's per-communicator state, by name (see Attachment).
        self._attachments: dict[str, Attachment] = {}
        self._ipc_workspace = _core.IpcWorkspace  # what allocate_symmetric allocates
        ranks = dist.get_process_group_ranks(self.group)
        self._ctl = ControlExchange(default_store(), ranks, self.rank, self.timeout_s)
        infos = self.all_gather(self._local_info(torch), "setup (host, GPU and peer-access check)")
        problem = group_problem(infos, os.environ.get(SHARED_GPU_ENV) == "1")
        if problem:
            raise RuntimeError(problem)
        self._ctl = shared_memory_exchange(self._ctl)  # every rank is on this host
        # Orders this device's launches across streams; shared by every graph and kernel.
        self.order = _core.LaunchOrder(self.device.index)
        self._pool = self.new_pool(self._workspace_grown, control=control_bytes())
        _LIVE.add(self)

    # -- attachments ---------------------------------------------------------------------------
    def attach(self, name: str, state: Attachment) -> Attachment:
        """Hang ``state`` on this communicator under ``name`` (see Attachment); returns it."""
        self._require_open()
        self._attachments[name] = state
        return state

    def attachment(self, name: str) -> Attachment | None:
        """The state attached under ``name``, or None."""
        return self._attachments.get(name)

    # -- control plane -------------------------------------------------------------------------
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
        self.broken = (
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

    # -- symmetric memory (distgemm.runtime.workspace) -----------------------------------------
    def new_pool(self, repoint: Callable[[Workspace], None], *, control: int) -> WorkspacePool:
        """A pool of symmetric regions on this communicator (the workspace is one; the fused
        path's receive region another) whose growth calls ``repoint(new)``; ``control`` bytes end
        every region (0: none)."""
        return WorkspacePool(
            self.allocate_symmetric,
            repoint,
            self._release,
            control=control,
            align=int(_core.WORKSPACE_SLOT_ALIGN),
            order=self.order,
            # Inside a CUDA graph capture (no synchronisation, no cudaFree) a replaced region is
            # kept until close().
            keep_replaced=stream_capturing,
        )

    def workspace_for(self, layout: dict[str, int]) -> tuple[Workspace, list[int]]:
        """The communicator's workspace for a plan with this ``_core.workspace_layout``, and the
        plan's bases (one per rank, shifted so that its control region is the workspace's).
        Collective when the workspace has to grow (see ``distgemm.runtime.workspace``)."""
        self._require_open()
        return self._pool.place(layout)

    @property
    def workspace_control_bytes(self) -> int:
        """Bytes of the control region that ends every layout placed in the workspace."""
        return self._pool.control

    def allocate_symmetric(self, nbytes: int) -> tuple[Any, list[int]]:
        """This rank's new zeroed region of ``nbytes``, exchanged with the peers (collective):
        (the _core.IpcWorkspace, every rank's base as seen from this device)."""
        self._require_open()
        core = None
        err = None
        try:
            core = self._ipc_workspace(self.device.index, nbytes)
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

    def synchronize(self) -> None:
        torch, _ = _torch()
        torch.cuda.synchronize(self.device)

    def _workspace_grown(self, ws: Workspace) -> None:
        """The workspace was replaced by ``ws``: every attachment re-points what it placed in the
        old one. Outside a capture the device is synchronised first (graphs on the old one may
        still run); inside one (which forbids it) the attachments keep what may still run."""
        capturing = stream_capturing()
        if not capturing:
            self.synchronize()
        for state in list(self._attachments.values()):
            state.workspace_grown(ws, capturing)

    def _release(self, workspaces: list[Workspace]) -> None:
        """Free replaced regions on every rank (collective, also with none to free): each rank
        synchronises its device (only when it frees) and unmaps its peers' regions, the ranks
        meet, and only then does each rank free its own, which no peer maps any more."""
        if workspaces:
            self.synchronize()
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
        stats = self.memory_stats()
        return sum(v for k, v in stats.items() if k in _REGION_KEYS)

    def memory_stats(self) -> dict[str, int]:
        """What this communicator holds on this rank: the workspace's keys, then every
        attachment's (``distgemm.memory_stats``)."""
        stats = self._pool.memory_stats()
        for state in self._attachments.values():
            stats.update(state.memory_stats())
        return stats

    # -- errors --------------------------------------------------------------------------------
    def raise_if_broken(self) -> None:
        if self.broken:
            raise RuntimeError(self.broken)

    def mark_broken(self, message: str) -> None:
        self.broken = (
            f"rank {self.rank}: {message}. This communicator can no longer launch "
            "(the ranks' launch generations are out of step); close it and create a "
            "new one after fixing the cause"
        )

    def raise_launch_errors(self) -> None:
        """Synchronise this rank's device and raise RuntimeError if any launch timed out (a rank
        did not arrive at the entry barrier, or a flag did not arrive), replays of CUDA graphs
        that captured an op included. RuntimeError inside a CUDA graph capture (it synchronises,
        which a capture forbids): call it after the replays."""
        refuse_during_capture("Communicator.raise_launch_errors() synchronises the device")
        self.raise_if_broken()
        self._require_open()
        self.synchronize()
        e = (
            next((err for s in self._attachments.values() if (err := s.launch_error())), "")
            or self.order.capture_error()
        )  # captured launches report there
        if e:
            self.mark_broken(e)
            self.raise_if_broken()

    # -- lifetime ------------------------------------------------------------------------------
    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError("this distgemm Communicator was closed; create a new one")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Free every graph and symmetric region of this rank. Collective: call it on every rank
        (the peers' mappings of this rank's memory are closed before it is freed). CUDA graphs
        that captured an op of this communicator use that memory: replaying one after close() is
        invalid (reset or drop them first). RuntimeError inside a CUDA graph capture."""
        if self._closed:
            return
        torch, dist = _torch()
        refuse_during_capture("Communicator.close() frees memory the capture may use")
        self._closed = True
        _LIVE.discard(self)
        try:
            torch.cuda.synchronize(self.device)
        except Exception:
            pass  # a broken context: still release what can be released
        held: list[Workspace] = []
        for state in self._attachments.values():
            held.extend(state.close())
        self._attachments.clear()
        held.extend(self._pool.close())
        for w in held:
            try:
                w.core.close_peers()
            except Exception:
                pass
        # Every rank has unmapped its peers before anyone frees: a barrier (skipped without
        # torch.distributed at exit), bounded: a dead rank must not hold the others' exit.
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
        self._ctl.close()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.workspace_bytes} workspace bytes"
        return f"Communicator(rank={self.rank}, tp={self.tp}, device={self.device}, {state})"


# The memory_stats keys that count device memory held in symmetric regions.
_REGION_KEYS = ("workspace_bytes", "kept_bytes", "fused_control_bytes", "fused_receive_bytes",
                "allreduce_control_bytes", "allreduce_receive_bytes")  # fmt: skip


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
