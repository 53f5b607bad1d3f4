"""The control exchange through shared memory (runtime.control_shm): the store exchange's contract
(rank order, timeouts naming the absent rank, one verdict for every rank, mismatches), large
objects through the store, the fallback to the store, and ranks as real processes."""

import os
import pathlib
import random
import sys
import threading
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from ranks import CPU_TPS, run_ranks  # noqa: E402

from distgemm.runtime import control, control_shm  # noqa: E402


def _made(store, tp, timeout_s=5.0, ranks=None):
    """Each member's exchange as ``shared_memory_exchange`` makes it (collective: one thread per
    rank)."""
    ranks = ranks or list(range(tp))
    stores = []
    for member in range(tp):
        control._EXCHANGES_PER_RANKS.clear()  # every "process" counts from 1: the same prefix
        stores.append(control.ControlExchange(store, ranks, member, timeout_s))
    out = [None] * tp
    _threads(lambda r: out.__setitem__(r, control_shm.shared_memory_exchange(stores[r])), tp)
    return out


def _threads(fn, tp, timeout_s=30.0):
    ts = [threading.Thread(target=fn, args=(r,)) for r in range(tp)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout_s)
    assert not any(t.is_alive() for t in ts), "a rank did not finish"


@pytest.mark.parametrize("tp", CPU_TPS)
def test_all_gathers_in_rank_order_large_objects_through_the_store(tp):
    import torch.distributed as dist

    store = dist.HashStore()
    ex = _made(store, tp, ranks=list(range(1, 2 * tp, 2)))
    assert all(isinstance(e, control_shm.SharedMemoryExchange) for e in ex)
    rng = random.Random(tp)
    # Exchange 2 carries one rank's object larger than a slot (through the store).
    big = "x" * (control_shm.SLOT_PAYLOAD_BYTES + 100)
    payloads = [
        [{"r": r, "i": i, "x": rng.random(), "big": big if (i, r) == (2, tp - 1) else ""}
         for i in range(5)]
        for r in range(tp)
    ]  # fmt: skip
    got = [[] for _ in range(tp)]
    _threads(lambda r: got[r].extend(ex[r].all_gather(o, "sig") for o in payloads[r]), tp)
    for r in range(tp):
        assert got[r] == [[payloads[q][i] for q in range(tp)] for i in range(5)]
    # The large object's key went once every rank had posted a later exchange.
    prefix = ex[tp - 1].store_exchange.prefix
    assert not store.check([f"{prefix}/large/2/{tp - 1}"])
    assert ex[0].seq == 5
    for e in ex:
        e.close()


def test_the_file_is_unlinked_once_every_rank_mapped_it(tmp_path, monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(control_shm, "_shared_dir", lambda: str(tmp_path))
    ex = _made(dist.HashStore(), 3)
    assert all(isinstance(e, control_shm.SharedMemoryExchange) for e in ex)
    assert list(tmp_path.iterdir()) == []
    got = [None] * 3
    _threads(lambda r: got.__setitem__(r, ex[r].all_gather(r * 10)), 3)
    assert got == [[0, 10, 20]] * 3


def test_store_exchange_kept_where_rank_0_cannot_make_the_file(tmp_path, monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(control_shm, "_shared_dir", lambda: str(tmp_path / "absent"))
    ex = _made(dist.HashStore(), 4)
    assert all(isinstance(e, control.ControlExchange) for e in ex)
    got = [None] * 4
    _threads(lambda r: got.__setitem__(r, ex[r].all_gather(r)), 4)
    assert got == [[0, 1, 2, 3]] * 4


def test_store_exchange_kept_when_the_environment_says_so(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setenv(control_shm.CONTROL_ENV, "store")
    ex = _made(dist.HashStore(), 2)
    assert all(isinstance(e, control.ControlExchange) for e in ex)


# The contract both transports keep (the store exchange's own tests: tests/test_comm.py).
TRANSPORTS = ("store", "shm")


def _transport(kind, store, tp, timeout_s=5.0):
    if kind == "shm":
        return _made(store, tp, timeout_s)
    out = []
    for member in range(tp):
        control._EXCHANGES_PER_RANKS.clear()
        out.append(control.ControlExchange(store, list(range(tp)), member, timeout_s))
    return out


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_timeout_names_the_absent_rank_and_a_late_rank_raises_too(kind):
    """Rank 0 gives up after 0.3 s; rank 1 arrives later and finds rank 0's object, but the
    exchange was settled as late: it raises as well instead of going on alone."""
    import torch.distributed as dist

    a, b = _transport(kind, dist.HashStore(), 2, timeout_s=0.3)
    errors = {}

    def late():
        time.sleep(0.6)
        try:
            b.all_gather("late", "setup")
        except control.ExchangeTimeout as e:
            errors[1] = e

    t = threading.Thread(target=late)
    t.start()
    t0 = time.perf_counter()
    with pytest.raises(control.ExchangeTimeout) as first:
        a.all_gather("early", "setup")
    assert 0.25 < time.perf_counter() - t0 < 5.0
    t.join(10)
    assert first.value.missing == [1]
    assert 1 in errors and errors[1].missing == []  # everyone had arrived, too late
    assert "gave up waiting before this rank arrived" in str(errors[1])


@pytest.mark.parametrize("kind", TRANSPORTS)
@pytest.mark.parametrize("tp", CPU_TPS)
def test_out_of_step_ranks_raise_a_mismatch(tp, kind):
    """The last rank closes while the others exchange a plan signature: every rank raises,
    naming what each exchanged."""
    import torch.distributed as dist

    ex = _transport(kind, dist.HashStore(), tp)
    whats = ["plan signature"] * (tp - 1) + ["close"]
    errors = {}

    def run(r):
        try:
            ex[r].all_gather({"r": r}, whats[r])
        except control.ExchangeMismatch as e:
            errors[r] = e.whats

    _threads(run, tp)
    assert errors == {r: whats for r in range(tp)}


def _in_processes(rank, tp):
    """Ranks as processes over the gloo job's store: 200 exchanges, objects of every size."""
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    ex = control_shm.shared_memory_exchange(control.ControlExchange(store, range(tp), rank, 30.0))
    rng = random.Random(rank)
    sent, got = [], []
    for i in range(200):
        obj = (rank, i, "y" * rng.choice((0, 10, 5000, control_shm.SLOT_PAYLOAD_BYTES + 1)))
        sent.append(obj)
        got.append(ex.all_gather(obj, f"exchange {i}"))
    kind = type(ex).__name__
    ex.close()
    return {"kind": kind, "sent": sent, "got": got, "pid": os.getpid()}


@pytest.mark.parametrize("tp", (2, 4))
def test_ranks_as_processes(tmp_path, tp):
    res = run_ranks(_in_processes, tmp_path, tp=tp, timeout_s=120)
    assert len({r["pid"] for r in res}) == tp
    for r in res:
        assert r["kind"] == "SharedMemoryExchange"
        assert r["got"] == [[res[q]["sent"][i] for q in range(tp)] for i in range(200)]
