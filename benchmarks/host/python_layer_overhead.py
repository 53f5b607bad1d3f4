"""Host time of distgemm's Python layer alone, on any machine (no GPU needed):

    python3 -m benchmarks.host.python_layer_overhead

Runs ``distgemm.ops.all_gather_gemm`` with a cached plan, TP=2, on CPU tensors, with the four
things that need a GPU replaced: the communicator (a two-rank stand-in that agrees with itself),
the CUDA device check, the capture check and the graph (its launches and update do nothing). What is
left is exactly the per-call Python path: plan and graph lookup, tensor checks, pointers. On the
GPU the extension adds the graph launch (cudaGraphLaunch plus one event record) and torch's
capture/stream queries; tests/gpu/torchrun_worker.py (section overhead) measures the whole.
"""

import statistics
import time
import types

import torch

from distgemm import ops
from distgemm.runtime import capture, precision
from distgemm.runtime.paths import overlapped


class _Graph:
    def launch(self, stream):
        pass

    def launch_direct(self, stream, *ptrs):
        pass

    def update(self, *ptrs):
        pass

    def error(self):
        return ""


class _Comm:
    """Two ranks that always agree: enough for plan creation without torch.distributed."""

    rank, tp, device, wait_timeout_s, group = 0, 2, torch.device("cpu"), 5.0, None
    broken = None

    def __init__(self):
        self._attachments = {}

    def attachment(self, name):
        return self._attachments.get(name)

    def attach(self, name, state):
        self._attachments[name] = state
        return state

    def synchronize(self):
        pass

    def all_gather(self, obj, what):
        return [obj, obj]

    def workspace_for(self, layout):
        return types.SimpleNamespace(order=None, pinned=False), [1 << 20, 2 << 20]


def _cpu_check_types(op, tensors):
    # runtime.validate.validate_types minus the CUDA test: the same attribute reads.
    dtype = None
    for t in tensors.values():
        if t is not None:
            dtype = dtype or t.dtype
            _ = t.is_cuda
    return dtype


def main(n=20000):
    comm = _Comm()
    ops.get_communicator = lambda group: comm
    precision.validate_types = _cpu_check_types  # where the ops' precision check looks it up
    capture._raw_stream = lambda index: 0
    core = types.SimpleNamespace(
        **{k: getattr(overlapped._core, k) for k in dir(overlapped._core) if not k.startswith("__")}
    )
    core.GraphLauncher = lambda *args, **kwargs: _Graph()
    core.GraphSetup = lambda *args, **kwargs: None  # the graph stand-in takes no setup
    overlapped._core = core
    torch.cuda.is_current_stream_capturing = lambda: False

    a = torch.randn(256, 512).bfloat16()
    w = torch.randn(256, 512).bfloat16()
    out = torch.empty(512, 256).bfloat16()

    def timed(fn):
        for _ in range(200):
            fn()
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e6

    # path="overlap": the cached-plan path of the plan itself ("auto" may choose the collective
    # path, which needs NCCL; once chosen it adds no per-call work).
    same = timed(lambda: ops.all_gather_gemm(a, w, out=out, path="overlap"))
    fresh = timed(lambda: ops.all_gather_gemm(a, w, path="overlap"))
    print(f"python layer per call, cached plan, same pointers, out given: {same:.2f} us")
    print(
        f"python layer per call, cached plan, fresh output tensor (CPU allocator): {fresh:.2f} us"
    )


if __name__ == "__main__":
    main()
