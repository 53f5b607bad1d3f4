"""The tuning table across ranks and through the reference executor, at every TP of
ranks.CPU_TPS: on gloo ranks, ranks that loaded different tables (or only one of them a table)
raise the same ValueError at plan creation and ranks with the same table make the same choice;
and a plan whose S comes from a table entry, run by distgemm.plan.reference on simulated devices,
gives torch's result (float64, relative 1e-12)."""

import json
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from ranks import CPU_TPS, run_ranks  # noqa: E402
from test_tuning_table import _doc, _raw  # noqa: E402

from distgemm import _core, ops  # noqa: E402
from distgemm.plan import reference  # noqa: E402
from distgemm.runtime import control, entry_cache, tuning_table  # noqa: E402
from distgemm.runtime.precision import Precision  # noqa: E402

# Global, all-gather of A (ag_rotate_a): M and N/TP (the rows of w and of the output's tile)
# multiples of 8 at every TP of CPU_TPS.
M, N, K = 192, 192, 32


def _table(tp: int, steps: int, tile_n: int) -> dict:
    bucket = tuning_table.token_bucket(M)
    return _doc(_raw(n=N, k=K, tokens=bucket, tp=tp, steps=steps, tile_n=tile_n))


class _Comm:
    """A Communicator's plan creation over the gloo group's store (the real ControlExchange); a
    workspace of fake bases (no graph is built)."""

    wait_timeout_s = 5.0
    device = torch.device("cuda", 0)  # an ordinal for GraphSetup; never touched

    def __init__(self, rank: int, tp: int):
        from torch.distributed import distributed_c10d

        self.rank, self.tp, self.group = rank, tp, dist.group.WORLD
        self.plans = entry_cache.EntryCache(self)
        store = distributed_c10d._get_default_store()
        self._ctl = control.ControlExchange(store, list(range(tp)), rank, 30.0)

    def all_gather(self, obj, what):
        return self._ctl.all_gather(obj, what)

    def workspace_for(self, layout):
        return types.SimpleNamespace(order=None), [1 << 20] * self.tp


def _create(rank: int, tp: int, table_path: str | None):
    tuning_table.load_tuning_table(table_path)
    comm = _Comm(rank, tp)
    a = torch.empty(M // tp, K, device="meta", dtype=torch.bfloat16)
    w = torch.empty(N // tp, K, device="meta", dtype=torch.bfloat16)
    shapes = (("a_shard", (M // tp, K)), ("w", (N // tp, K)), ("bias", None))
    prec = Precision(torch.bfloat16)
    key = entry_cache.EntryKey(
        "all_gather_gemm", "ag_rotate_a", None, prec, shapes, 0.0, False, "auto"
    )
    try:
        e = comm.plans.create(
            key, lambda: ops.make_spec("all_gather_gemm", "ag_rotate_a", tp, rank, None, a, w)
        )
    except ValueError as err:
        return ("ValueError", str(err))
    return ("ok", e.path, e.spec.steps, e.spec.tile_n, e.choice["source"])


def _rank_scenarios(rank, tp, tmp):
    return [
        _create(rank, tp, f"{tmp}/same.json"),
        _create(rank, tp, f"{tmp}/rank{rank}.json"),
        _create(rank, tp, f"{tmp}/rank1.json" if rank == 1 else None),
    ]


@pytest.mark.parametrize("tp", CPU_TPS)
def test_ranks_with_different_tables_raise_the_same_value_error(tmp_path, tp):
    """Rank 0 loads one table, every other rank another (different) one, or only rank 1 one."""
    (tmp_path / "same.json").write_text(json.dumps(_table(tp, 2 * tp, 128)))
    for r in range(tp):
        table = _table(tp, 2 * tp, 128) if r == 0 else _table(tp, tp, 256)
        (tmp_path / f"rank{r}.json").write_text(json.dumps(table))
    digests = {
        r: tuning_table.TuningTable.load(tmp_path / f"rank{r}.json").digest for r in range(2)
    }
    got = run_ranks(_rank_scenarios, tmp_path, str(tmp_path), tp=tp)
    same, different, only_one = ([got[r][i] for r in range(tp)] for i in range(3))
    # The same table: the same entry on every rank, S and tile from the table.
    assert same == [("ok", "overlap", 2 * tp, 128, "table")] * tp
    # Different tables: one error, the same on every rank, naming both digests.
    assert different == [different[0]] * tp
    assert different[0] == (
        "ValueError",
        f"all_gather_gemm: ranks disagree at plan creation: rank 1 has tuning_table="
        f"'{digests[1]}' where rank 0 has tuning_table='{digests[0]}'; every rank must load the "
        "same tuning table (DISTGEMM_TUNING_TABLE or distgemm.load_tuning_table)",
    )
    assert only_one == [only_one[0]] * tp and only_one[0][0] == "ValueError"
    assert (
        f"rank 1 has tuning_table='{digests[1]}' where rank 0 has tuning_table=None"
        in (only_one[0][1])
    )


@pytest.mark.parametrize("tp", CPU_TPS)
@pytest.mark.parametrize(
    "schedule,steps_per_rank",
    [("ag_rotate_a", 2), ("rs_tile_a", 2), ("rs_tile_b", 1), ("ar_tile_a", 2)],
)
def test_a_plan_from_a_table_entry_computes_what_torch_does(tmp_path, schedule, steps_per_rank, tp):
    op = {"all_gather": "all_gather_gemm", "reduce_scatter": "gemm_reduce_scatter"}.get(
        _core.schedule_definition(schedule)["collective"], "gemm_all_reduce"
    )
    # M, N, K and their shards (K/TP where K is sharded) multiples of 8 at every TP of CPU_TPS.
    steps, m, n, k = steps_per_rank * tp, 96, 192, 192
    bucket = tuning_table.token_bucket(m)
    entry = _raw(op=op, schedule=schedule, tp=tp, n=n, k=k, tokens=bucket, steps=steps, tile_n=0)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_doc(entry)))
    local = _core.build_plan(schedule, tp, tp, m, n, k).local_shapes
    a = torch.empty(local["A"], device="meta", dtype=torch.bfloat16)
    w = torch.empty(local["B"], device="meta", dtype=torch.bfloat16)
    try:
        assert ops.make_spec(op, schedule, tp, 0, None, a, w).steps == tp  # no table
        tuning_table.load_tuning_table(path)
        spec = ops.make_spec(op, schedule, tp, 0, None, a, w)
    finally:
        tuning_table.load_tuning_table(None)
    assert spec.steps == steps and spec.table is not None
    plan = spec.plan.to_dict()
    inputs = reference.reference_inputs(plan, seed=sum(map(ord, schedule)))
    got = reference.execute_plan(plan, inputs, policy="random:1")
    a_full = torch.from_numpy(inputs["A"][0])
    b_full = torch.from_numpy(inputs["B"][0])
    d = a_full @ b_full.T  # the plain torch result [M, N], float64
    part = _core.schedule_definition(schedule)["partition"]["d"]
    for r in range(tp):
        want = {"M": d.chunk(tp, 0)[r], "N": d.chunk(tp, 1)[r]}.get(part, d)
        err = np.linalg.norm(got[r][0] - want.numpy()) / np.linalg.norm(want.numpy())
        assert err < 1e-12, (schedule, r, err)
