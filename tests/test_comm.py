"""CPU checks of distgemm.runtime.communicator and distgemm.runtime.control.

The group checks every rank computes from all-gathered data, the control exchange over the job's
key-value store, Communicator setup errors. The workspace (sharing, growth, release) is
tests/test_workspace_sharing.py's."""

import random

import pytest

torch = pytest.importorskip("torch")

from ranks import CPU_TPS  # noqa: E402

from distgemm.runtime import communicator as comm_mod  # noqa: E402
from distgemm.runtime import control  # noqa: E402

# ---------------------------------------------------------------------------------------------
# What every rank raises: pure functions over all-gathered data.


def info(host="h", uuid="u0", cap=(9, 0), peer_ok=None, device=0, name="NVIDIA H200"):
    return {
        "host": host,
        "uuid": uuid,
        "capability": cap,
        "device": device,
        "name": name,
        "peer_ok": peer_ok if peer_ok is not None else {},
    }


def test_group_info_ok():
    assert (
        comm_mod.group_problem(
            [info(uuid="a", peer_ok={"b": True}), info(uuid="b", device=1, peer_ok={"a": True})]
        )
        is None
    )


def test_group_on_two_hosts_is_rejected():
    msg = comm_mod.group_problem([info(host="n1", uuid="a"), info(host="n2", uuid="b")])
    assert msg == (
        "distgemm needs every rank of the group on one host (CUDA IPC and NVLink peer "
        "access): rank 0 on 'n1', rank 1 on 'n2'"
    )


def test_two_ranks_on_one_gpu_are_rejected():
    msg = comm_mod.group_problem([info(uuid="a"), info(uuid="a")])
    assert msg.startswith("ranks 0 and 1 use the same GPU (cuda:0)")
    assert "torch.cuda.set_device(local_rank)" in msg


def test_shared_gpu_only_when_allowed():
    # DISTGEMM_ALLOW_SHARED_GPU=1: functional tests of the multi-rank paths on one GPU.
    assert comm_mod.group_problem([info(uuid="a"), info(uuid="a")], allow_shared_gpu=True) is None


def test_non_hopper_is_rejected():
    msg = comm_mod.group_problem([info(uuid="a"), info(uuid="b", cap=(8, 0), name="A100")])
    assert msg == (
        "rank 1: GPU 'A100' has compute capability 8.0; the distgemm kernels are built "
        "for Hopper (sm_90a)"
    )


def test_missing_peer_access_is_rejected():
    msg = comm_mod.group_problem(
        [info(uuid="a", peer_ok={"b": False}), info(uuid="b", device=1, peer_ok={"a": True})]
    )
    assert msg.startswith("rank 0 (cuda:0) has no peer access to rank 1's GPU")


def test_unknown_peer_access_is_left_to_the_ipc_open():
    # A GPU hidden by CUDA_VISIBLE_DEVICES cannot be queried; cudaIpcOpenMemHandle decides.
    assert comm_mod.group_problem([info(uuid="a"), info(uuid="b", device=0)]) is None


def test_group_size_limit_and_query_errors():
    assert comm_mod.group_problem([info(uuid=str(i)) for i in range(9)]) == (
        "distgemm supports groups of 1 to 8 ranks (TP), this group has 9"
    )
    bad = info(uuid="b")
    bad["error"] = "querying cuda:1 failed: boom"
    assert comm_mod.group_problem([info(uuid="a"), bad]) == "rank 1: querying cuda:1 failed: boom"


# ---------------------------------------------------------------------------------------------
# The control exchange over the job's key-value store (each rank a thread).


def _exchanges(store, ranks, timeout_s=5.0):
    """Each member's ControlExchange over the global ``ranks``, as its own process makes it."""
    out = []
    for member in range(len(ranks)):
        control._EXCHANGES_PER_RANKS.clear()  # every "process" counts from 1: the same prefix
        out.append(control.ControlExchange(store, ranks, member, timeout_s))
    return out


def _exchange_pair(store, timeout_s=5.0):
    return _exchanges(store, [3, 5], timeout_s)


def _run_threads(fn, tp, timeout_s):
    import threading

    ts = [threading.Thread(target=fn, args=(r,)) for r in range(tp)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout_s)


@pytest.mark.parametrize("tp", CPU_TPS)
def test_control_exchange_all_gathers_in_rank_order_and_cleans_up(tp):
    import torch.distributed as dist

    store = dist.HashStore()
    ex = _exchanges(store, list(range(1, 2 * tp, 2)))  # global ranks 1, 3, 5, ...
    got = [[] for _ in range(tp)]
    rng = random.Random(5)
    payloads = [[{"r": r, "i": i, "x": rng.random()} for i in range(4)] for r in range(tp)]

    def run(r):
        for obj in payloads[r]:
            got[r].append(ex[r].all_gather(obj))

    _run_threads(run, tp, 30)
    for r in range(tp):
        assert got[r] == [[payloads[q][i] for q in range(tp)] for i in range(4)]
    # Keys of exchanges 1-3 were deleted by their writers (the verdicts by rank 0); only the
    # last exchange's remain.
    prefix = ex[0].prefix
    keys = [*range(tp), "verdict"]
    assert not any(store.check([f"{prefix}/{s}/{k}"]) for s in (1, 2, 3) for k in keys)
    assert store.check([f"{prefix}/4/{k}" for k in keys])


def test_control_exchange_over_torchruns_tcp_store():
    """The store torchrun gives the ranks (a TCPStore server and a client): exchanges in order,
    stale keys deleted, a timeout bounded and naming the absent rank."""
    import datetime
    import time

    import torch.distributed as dist

    server = dist.TCPStore(
        "127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=10), wait_for_workers=False
    )
    client = dist.TCPStore(
        "127.0.0.1", server.port, 2, False, timeout=datetime.timedelta(seconds=10)
    )
    control._EXCHANGES_PER_RANKS.clear()
    ex = [control.ControlExchange(server, [0, 1], 0, 5.0)]
    control._EXCHANGES_PER_RANKS.clear()
    ex.append(control.ControlExchange(client, [0, 1], 1, 5.0))
    rng = random.Random(11)
    sent = [[rng.random() for _ in range(3)] for _ in range(2)]
    got = {}

    def run(r):
        got[r] = [ex[r].all_gather(x, "plan signature") for x in sent[r]]

    _run_threads(run, 2, 30)
    assert got[0] == got[1] == [[sent[0][i], sent[1][i]] for i in range(3)]
    assert not any(
        server.check([f"distgemm/ctl/0-1/1/{s}/{k}"]) for s in (1, 2) for k in (0, 1, "verdict")
    )
    t0 = time.perf_counter()
    with pytest.raises(control.ExchangeTimeout) as e:
        ex[0].all_gather("alone", "close", timeout_s=0.4)
    assert e.value.missing == [1] and time.perf_counter() - t0 < 5.0


def test_control_exchange_names_the_rank_that_did_not_arrive():
    import time

    import torch.distributed as dist

    a, _ = _exchange_pair(dist.HashStore(), timeout_s=0.3)
    t0 = time.perf_counter()
    with pytest.raises(control.ExchangeTimeout) as e:
        a.all_gather("hello")
    assert e.value.missing == [1]
    assert 0.25 < time.perf_counter() - t0 < 5.0


# The late rank and out-of-step ranks: tests/test_control_shm.py, for both transports.


def test_each_new_exchange_of_the_same_ranks_gets_a_fresh_prefix():
    import torch.distributed as dist

    control._EXCHANGES_PER_RANKS.clear()
    store = dist.HashStore()
    first = control.ControlExchange(store, [0, 1], 0, 1.0)
    second = control.ControlExchange(store, [0, 1], 0, 1.0)
    other = control.ControlExchange(store, [0, 2], 0, 1.0)
    assert first.prefix == "distgemm/ctl/0-1/1" and second.prefix == "distgemm/ctl/0-1/2"
    assert other.prefix == "distgemm/ctl/0-2/1"


# ---------------------------------------------------------------------------------------------
# Communicator setup errors that need no GPU.


def test_communicator_needs_torch_distributed():
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.fail("a test left torch.distributed initialised")
    with pytest.raises(RuntimeError, match=r"call torch.distributed.init_process_group\(\) first"):
        comm_mod.Communicator()


def test_communicator_needs_cuda(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # also on a GPU machine
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        with pytest.raises(
            RuntimeError, match=r"distgemm.Communicator needs CUDA GPUs; torch sees none"
        ):
            comm_mod.Communicator()
    finally:
        dist.destroy_process_group()
