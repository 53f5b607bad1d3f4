"""distgemm.nn on the CPU: forward output and every gradient (input, weight, bias) of
ColumnParallelLinear and RowParallelLinear on 2 gloo ranks against one process's fp32 nn.Linear;
sharding from an nn.Linear and gathering back; the shape errors.

Also home of ``run_ranks``, the 2-rank gloo harness the other CPU distributed tests import.

Tolerances (relative Frobenius error against fp32): fp32 1e-5, fp16 2e-3, bf16 1e-2. Each is
a few times the rounding of one operand to that dtype (relative 2^-11 = 4.9e-4 for fp16,
2^-8 = 3.9e-3 for bf16); on 2 gloo ranks the errors are about 4e-4 (fp16) and 3e-3 (bf16).
"""

import copy
import pathlib
import types

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

from distgemm.nn import ColumnParallelLinear, RowParallelLinear  # noqa: E402

TP = 2
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
TOKENS, HIDDEN, FFN = 16, 32, 48


def _rank_entry(rank, fn, tp, tmp, args):
    dist.init_process_group(
        "gloo", store=dist.FileStore(f"{tmp}/store", tp), rank=rank, world_size=tp
    )
    try:
        result = fn(rank, tp, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    torch.save(result, f"{tmp}/result{rank}.pt")


def run_ranks(fn, tmp_path: pathlib.Path, *args, tp: int = TP) -> list:
    """``fn(rank, tp, *args)`` on ``tp`` spawned processes joined in one gloo group; returns each
    rank's result (anything ``torch.save`` takes). A rank that raises fails the spawn."""
    mp.spawn(_rank_entry, args=(fn, tp, str(tmp_path), args), nprocs=tp, join=True)
    return [torch.load(tmp_path / f"result{r}.pt") for r in range(tp)]


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref.float()).norm() / ref.float().norm()).item()


def _layers_worker(rank, tp, dtype_names):
    """Per dtype: relative errors of the forward output and of every gradient of both layers
    against the full fp32 layers, plus the gathered-back layers' exact equality."""
    out = {}
    for dtype_name in dtype_names:
        dtype = getattr(torch, dtype_name)
        torch.manual_seed(0)  # the same full layers and inputs on every rank
        fc1, fc2 = nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN)
        x = torch.randn(TOKENS, HIDDEN, requires_grad=True)
        grad_y1 = torch.randn(TOKENS, FFN)
        h = torch.randn(TOKENS, FFN, requires_grad=True)
        grad_y2 = torch.randn(TOKENS, HIDDEN)
        rows = slice(rank * TOKENS // tp, (rank + 1) * TOKENS // tp)
        cols = slice(rank * FFN // tp, (rank + 1) * FFN // tp)

        col = ColumnParallelLinear.from_linear(copy.deepcopy(fc1).to(dtype))
        row = RowParallelLinear.from_linear(copy.deepcopy(fc2).to(dtype))
        x_shard = x.detach()[rows].to(dtype).requires_grad_()
        y1 = col(x_shard)  # [T, F/tp]
        (y1.float() * grad_y1[:, cols]).sum().backward()
        h_local = h.detach()[:, cols].to(dtype).requires_grad_()
        y2 = row(h_local)  # [T/tp, H]
        (y2.float() * grad_y2[rows]).sum().backward()

        ref1 = fc1(x)
        (ref1 * grad_y1).sum().backward()
        ref2 = fc2(h)
        (ref2 * grad_y2).sum().backward()
        out[dtype_name] = {
            "column shapes": (list(y1.shape), list(x_shard.grad.shape)),
            "row shapes": (list(y2.shape), list(h_local.grad.shape)),
            "column out": rel_err(y1, ref1[:, cols]),
            "column grad_input": rel_err(x_shard.grad, x.grad[rows]),
            "column grad_weight": rel_err(col.weight.grad, fc1.weight.grad[cols]),
            "column grad_bias": rel_err(col.bias.grad, fc1.bias.grad[cols]),
            "row out": rel_err(y2, ref2[rows]),
            "row grad_input": rel_err(h_local.grad, h.grad[:, cols]),
            "row grad_weight": rel_err(row.weight.grad, fc2.weight.grad[:, cols]),
            "row grad_bias": rel_err(row.bias.grad, fc2.bias.grad),
        }
        fc1_back, fc2_back = col.to_linear(), row.to_linear()
        out[dtype_name]["gathered back equal"] = all(
            torch.equal(a.to(dtype), b)
            for a, b in [
                (fc1.weight, fc1_back.weight),
                (fc1.bias, fc1_back.bias),
                (fc2.weight, fc2_back.weight),
                (fc2.bias, fc2_back.bias),
            ]
        )
    return out


@pytest.fixture(scope="module")
def layer_results(tmp_path_factory):
    return run_ranks(_layers_worker, tmp_path_factory.mktemp("nn"), list(TOLERANCE))


QUANTITIES = [
    f"{layer} {what}"
    for layer in ("column", "row")
    for what in ("out", "grad_input", "grad_weight", "grad_bias")
]


@pytest.mark.parametrize("dtype_name", list(TOLERANCE))
@pytest.mark.parametrize("quantity", QUANTITIES)
def test_matches_fp32_reference(layer_results, dtype_name, quantity):
    for rank, result in enumerate(layer_results):
        err = result[dtype_name][quantity]
        assert err <= TOLERANCE[dtype_name], f"rank {rank}: {quantity} relative error {err:.2e}"


def test_sequence_parallel_shapes(layer_results):
    for result in layer_results:
        r = result["float32"]
        assert r["column shapes"] == ([TOKENS, FFN // TP], [TOKENS // TP, HIDDEN])
        assert r["row shapes"] == ([TOKENS // TP, HIDDEN], [TOKENS, FFN // TP])


@pytest.mark.parametrize("dtype_name", list(TOLERANCE))
def test_from_linear_then_gather_back_is_exact(layer_results, dtype_name):
    assert all(result[dtype_name]["gathered back equal"] for result in layer_results)


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_wrong_input_width_names_the_values(one_rank_group):
    col = ColumnParallelLinear(HIDDEN, FFN)
    with pytest.raises(ValueError, match=r"in_features=32.*\[8, 31\]"):
        col(torch.randn(8, 31))
    row = RowParallelLinear(FFN, HIDDEN)
    with pytest.raises(ValueError, match=r"in_features/tp=48.*\[8, 32\]"):
        row(torch.randn(8, 32))


def test_indivisible_features_name_the_values():
    # The layers read only the size, rank and name of their group when they are built.
    group = types.SimpleNamespace(size=lambda: 2, rank=lambda: 0, group_name="two ranks")
    with pytest.raises(ValueError, match=r"out_features=33 is not divisible by tp=2"):
        ColumnParallelLinear(32, 33, group=group)
    with pytest.raises(ValueError, match=r"in_features=33 is not divisible by tp=2"):
        RowParallelLinear(33, 32, group=group)


def test_sequence_first_3d_input(one_rank_group):
    torch.manual_seed(1)
    fc = nn.Linear(HIDDEN, FFN)
    col = ColumnParallelLinear.from_linear(fc)
    x = torch.randn(4, 3, HIDDEN)  # [seq, batch, hidden]
    torch.testing.assert_close(col(x), fc(x), rtol=1e-5, atol=1e-5)
    row = RowParallelLinear.from_linear(nn.Linear(FFN, HIDDEN))
    assert row(torch.randn(4, 3, FFN)).shape == (4, 3, HIDDEN)
