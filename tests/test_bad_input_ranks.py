"""Bad input to gemm_all_reduce across ranks, on CPU gloo ranks at TP 2, 3, 4 and 8: a token
count of 0, a non-contiguous input and shapes that differ between ranks are refused at the
entry's first call with the same ValueError on every rank, naming the constraint and the values;
where the other ranks hold the call's entry already (they do not come to the exchange), the rank
with the bad call raises its own error once the bounded exchange gives up. No rank hangs: every
exchange is bounded by the communicator's timeout and every spawn by the harness's.

The op's first-call path runs as on a GPU (``ops._entry``: the extent and placement checks, the
signature exchange through the job's store, the path choice and the collective path's state) on
a Communicator whose device is the CPU; the per-call checks that come before it and need no other
rank (CUDA tensors, dtypes: tests/test_validation.py) are left out."""

import threading
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from ranks import run_ranks  # noqa: E402

from distgemm import ops  # noqa: E402
from distgemm.runtime import control  # noqa: E402
from distgemm.runtime.communicator import Communicator  # noqa: E402
from distgemm.runtime.precision import Precision  # noqa: E402

K, N = 64, 48  # per rank: a [M, K], w [N, K]
SHORT_S = 2.0  # the control timeout of the scenario whose exchange is left alone
RUN_S = 240.0  # the harness's bound on one TP's ranks


class _CpuCommunicator(Communicator):
    """A Communicator of the gloo world group with the CPU as its device: its control exchange
    through the job's store (bounded by ``timeout_s``) and its attachments; nothing on a GPU."""

    def __init__(self, timeout_s: float):  # no super().__init__: it needs CUDA GPUs
        from torch.distributed import distributed_c10d

        self.group = dist.group.WORLD
        self.rank, self.tp = dist.get_rank(), dist.get_world_size()
        self.timeout_s, self.wait_timeout_s = timeout_s, 5.0
        self.device = torch.device("cpu")
        self._closed, self._lock, self.broken, self._attachments = (
            False,
            threading.RLock(),
            None,
            {},
        )
        store = distributed_c10d._get_default_store()
        self._ctl = control.ControlExchange(store, list(range(self.tp)), self.rank, timeout_s)


def _call(comm, a, w):
    """gemm_all_reduce's entry for ``a``, ``w`` on ``comm`` (path="collective"): ("ok", its
    path), or (the exception's type, its message)."""
    op = "gemm_all_reduce"
    tensors = {"a": a, "w": w, "bias": None, "c": None, "scale_a": None, "scale_b": None}
    prec = Precision(torch.bfloat16)
    key, make = ops._reduce_entry(op, "ar_tile_a", tensors, 0.0, None, None, prec, "collective")
    try:
        return ("ok", ops._entry(op, comm, key, make, tensors, None, False)[1].path)
    except (ValueError, RuntimeError) as e:
        return (type(e).__name__, str(e))


def _scenarios(rank: int, tp: int) -> dict:
    gen = torch.Generator().manual_seed(1000 + rank)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(torch.bfloat16)

    last = rank == tp - 1
    comm = _CpuCommunicator(60.0)
    res = {"agree": _call(comm, rand(8, K), rand(N, K))}
    res["zero_tokens_everywhere"] = _call(comm, rand(0, K), rand(N, K))
    res["zero_tokens_on_last"] = _call(comm, rand(0 if last else 4, K), rand(N, K))
    a = rand(K, 4).t() if rank == 1 else rand(4, K)  # [4, K], strides (1, 4) on rank 1
    res["non_contiguous_on_rank_1"] = _call(comm, a, rand(N, K))
    k = K + 8 if last else K
    res["k_differs_on_last"] = _call(comm, rand(2, k), rand(N, k))
    res["tokens_differ"] = _call(comm, rand(9 + rank, K), rand(N, K))  # no shape called before
    res["n_differs_on_last"] = _call(comm, rand(3, K), rand(N + 8 if last else N, K))
    # Every rank holds the entry of [6, K]; then the last rank alone calls with 0 tokens: the
    # others find their entry (no exchange), the last rank's exchange gives up after SHORT_S.
    short = _CpuCommunicator(SHORT_S)
    res["cached"] = _call(short, rand(6, K), rand(N, K))
    t0 = time.monotonic()
    res["zero_tokens_against_cached"] = _call(short, rand(0 if last else 6, K), rand(N, K))
    res["seconds"] = time.monotonic() - t0
    res["after"] = _call(short, rand(6, K), rand(N, K))
    return res


def _same_everywhere(got, name):
    """The one result every rank has for scenario ``name``."""
    results = {g[name] for g in got}
    assert len(results) == 1, (name, results)
    return results.pop()


@pytest.fixture(scope="module", params=[2, 3, 4, 8], ids=lambda tp: f"tp{tp}")
def outcomes(request, tmp_path_factory):
    """(TP, every rank's scenario results): one spawn of TP ranks per TP."""
    tp = request.param
    return tp, run_ranks(_scenarios, tmp_path_factory.mktemp(f"tp{tp}"), tp=tp, timeout_s=RUN_S)


def test_bad_input_is_the_same_error_on_every_rank(outcomes):
    tp, got = outcomes
    last = tp - 1
    assert _same_everywhere(got, "agree") == ("ok", "collective")
    empty = (
        "gemm_all_reduce: a [0, 64] has 0 rows (M=0 tokens); every rank must call it with M, N "
        "and K of at least 1: skip the call on every rank when the batch is empty"
    )
    assert _same_everywhere(got, "zero_tokens_everywhere") == ("ValueError", empty)
    assert _same_everywhere(got, "zero_tokens_on_last") == (
        "ValueError",
        f"gemm_all_reduce: rank {last} rejected its inputs: ValueError: {empty}",
    )
    kind, message = _same_everywhere(got, "non_contiguous_on_rank_1")
    assert kind == "ValueError" and message.startswith(
        "gemm_all_reduce: rank 1 rejected its inputs: ValueError: gemm_all_reduce: a is not "
        "contiguous (shape [4, 64], strides [1, 4]); distgemm takes dense row-major tensors"
    )
    fix = "every rank must call the op with the same shapes, dtype, schedule, steps and path"
    for name, field in (
        ("k_differs_on_last", f"rank {last} has a.shape=[2, 72] where rank 0 has a.shape=[2, 64]"),
        ("tokens_differ", "rank 1 has a.shape=[10, 64] where rank 0 has a.shape=[9, 64]"),
        (
            "n_differs_on_last",
            f"rank {last} has w.shape=[56, 64] where rank 0 has w.shape=[48, 64]",
        ),
    ):
        assert _same_everywhere(got, name) == (
            "ValueError",
            f"gemm_all_reduce: ranks disagree at plan creation: {field}; {fix}",
        ), name


def test_a_bad_call_against_cached_entries_raises_its_own_error_in_bounded_time(outcomes):
    tp, got = outcomes
    *others, bad = got
    assert _same_everywhere(got, "cached") == ("ok", "collective")
    for r in others:  # they hold the [6, K] entry: no exchange (on a GPU they launch)
        assert r["zero_tokens_against_cached"] == ("ok", "collective")
        assert r["after"] == ("ok", "collective")
    kind, message = bad["zero_tokens_against_cached"]
    assert kind == "ValueError"
    assert message.startswith("gemm_all_reduce: a [0, 64] has 0 rows (M=0 tokens)")
    missing = list(range(tp - 1))
    assert (
        f"(and the ranks could not compare: rank {tp - 1}: control exchange #2 (gemm_all_reduce "
        f"plan signature) did not complete within 2 s: rank(s) {missing} did not arrive"
    ) in message
    assert SHORT_S <= bad["seconds"] < SHORT_S + 10.0
    kind, message = bad["after"]  # its exchanges are out of step with the others' now
    assert kind == "RuntimeError" and "This communicator can no longer be used" in message
