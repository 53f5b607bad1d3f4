"""distgemm.compat.nn on the CPU: forward output and every gradient (input, weight, bias) of
ColumnParallelLinear and RowParallelLinear on 2 gloo ranks against one process's fp32 nn.Linear
(fp32 and bf16 at every TP of ranks.CPU_TPS too); sharding from an nn.Linear and gathering
back; the shape errors, at every TP raised by every rank.

Tolerances (relative Frobenius error against fp32): fp32 1e-5, fp16 2e-3, bf16 1e-2. Each is
a few times the rounding of one operand to that dtype (relative 2^-11 = 4.9e-4 for fp16,
2^-8 = 3.9e-3 for bf16); on 2 gloo ranks the errors are about 4e-4 (fp16) and 3e-3 (bf16).
Besides, each error may be at most BASELINE_RATIO times the error of the full nn.Linear computed
in the same dtype on one process.
"""

import copy
import types

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from ranks import CPU_TPS, run_ranks, value_error  # noqa: E402
from torch import nn  # noqa: E402

from distgemm.compat.nn import ColumnParallelLinear, RowParallelLinear  # noqa: E402

TP = 2
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
TOKENS, HIDDEN, FFN = 16, 32, 48
EVERY_TP_SIZES = (48, 32, 48)  # tokens, hidden, ffn: tokens and ffn divide by 2, 3, 4, 6, 8
BASELINE_RATIO = 3  # our error may be at most this multiple of one process's in the same dtype
REGATHER = "(keep_gathered_input=False)"  # marks the column layer that gathers x again


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref.float()).norm() / ref.float().norm()).item()


def _full_layers(sizes, device):
    """The same full layers, inputs and output gradients on every rank (CPU generator)."""
    tokens, hidden, ffn = sizes
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
    data = [torch.randn(tokens, n) for n in (hidden, ffn, ffn, hidden)]  # x, grad1, h, grad2
    return fc1.to(device), fc2.to(device), [t.to(device) for t in data]


def _layer_values(fc1, fc2, data, rows, cols, dtype, sharded, keep_gathered_input=True):
    """Forward output and every gradient of fc1 (column-parallel) and fc2 (row-parallel), this
    rank's slice of each: through the distgemm layers (``sharded``) or the full nn.Linear."""
    x, grad1, h, grad2 = data
    fc1, fc2 = copy.deepcopy(fc1).to(dtype), copy.deepcopy(fc2).to(dtype)
    if sharded:
        fc1 = ColumnParallelLinear.from_linear(fc1, keep_gathered_input=keep_gathered_input)
        fc2 = RowParallelLinear.from_linear(fc2)
        x, h = x[rows], h[:, cols]
        grad1, grad2 = grad1[:, cols], grad2[rows]
    x, h = (t.to(dtype, copy=True).requires_grad_() for t in (x, h))
    y1, y2 = fc1(x), fc2(h)
    (y1.float() * grad1).sum().backward()
    (y2.float() * grad2).sum().backward()
    values = {
        "column out": y1,
        "column grad_input": x.grad,
        "column grad_weight": fc1.weight.grad,
        "column grad_bias": fc1.bias.grad,
        "row out": y2,
        "row grad_input": h.grad,
        "row grad_weight": fc2.weight.grad,
        "row grad_bias": fc2.bias.grad,
    }
    if not sharded:  # slice the full results as the layers shard them
        values = {
            "column out": y1[:, cols],
            "column grad_input": x.grad[rows],
            "column grad_weight": fc1.weight.grad[cols],
            "column grad_bias": fc1.bias.grad[cols],
            "row out": y2[rows],
            "row grad_input": h.grad[:, cols],
            "row grad_weight": fc2.weight.grad[:, cols],
            "row grad_bias": fc2.bias.grad,
        }
    return values, (fc1, fc2)


def layers_worker(rank, tp, dtype_names, device="cpu", sizes=(TOKENS, HIDDEN, FFN)):
    """Per dtype: relative errors against the full fp32 layers of the forward output and every
    gradient of both layers (``quantity``; the column layer also with keep_gathered_input=False)
    and of the full layers in that dtype on one process (``single quantity``, the baseline), the
    shapes, and whether gathering back is exact."""
    tokens, _, ffn = sizes
    rows = slice(rank * tokens // tp, (rank + 1) * tokens // tp)
    cols = slice(rank * ffn // tp, (rank + 1) * ffn // tp)
    fc1, fc2, data = _full_layers(sizes, device)
    ref, _ = _layer_values(fc1, fc2, data, rows, cols, torch.float32, sharded=False)
    out = {}
    for dtype_name in dtype_names:
        dtype = getattr(torch, dtype_name)
        got, (col, row) = _layer_values(fc1, fc2, data, rows, cols, dtype, sharded=True)
        single, _ = _layer_values(fc1, fc2, data, rows, cols, dtype, sharded=False)
        out[dtype_name] = {q: rel_err(got[q], ref[q]) for q in ref}
        regathered, _ = _layer_values(fc1, fc2, data, rows, cols, dtype, True, False)
        out[dtype_name].update(
            {f"{q} {REGATHER}": rel_err(regathered[q], ref[q]) for q in ref if "column" in q}
        )
        out[dtype_name].update({f"single {q}": rel_err(single[q], ref[q]) for q in ref})
        out[dtype_name]["shapes"] = [list(got[q].shape) for q in ref]
        fc1_back, fc2_back = col.to_linear(), row.to_linear()
        pairs = [(fc1, fc1_back), (fc2, fc2_back)]
        out[dtype_name]["gathered back equal"] = all(
            torch.equal(a.weight.to(dtype), b.weight) and torch.equal(a.bias.to(dtype), b.bias)
            for a, b in pairs
        )
    return out


@pytest.fixture(scope="module")
def layer_results(tmp_path_factory):
    return run_ranks(layers_worker, tmp_path_factory.mktemp("nn"), list(TOLERANCE))


def expected_shapes(sizes, tp) -> list[list[int]]:
    """Per-rank shapes of the values ``layers_worker`` compares, in its order."""
    t, h, f = sizes
    column = [[t, f // tp], [t // tp, h], [f // tp, h], [f // tp]]
    row = [[t // tp, h], [t, f // tp], [h, f // tp], [h]]
    return column + row


def layer_failures(results, dtype_name, tolerance, sizes, tp) -> list[str]:
    """What ``layers_worker``'s results on every rank get wrong: an error above ``tolerance`` or
    above BASELINE_RATIO times the same dtype's error on one process (+1e-6 for fp32's zeros),
    a wrong shape, an inexact gather back."""
    failures = []
    for rank, result in enumerate(results):
        r = result[dtype_name]
        for q in [k for k in r if k.startswith(("column ", "row "))]:
            err, single = r[q], r[f"single {q.removesuffix(' ' + REGATHER)}"]
            if err > tolerance or err > BASELINE_RATIO * single + 1e-6:
                failures.append(f"rank {rank} {q}: {err:.2e} (one process: {single:.2e})")
        if r["shapes"] != expected_shapes(sizes, tp):
            failures.append(f"rank {rank} shapes {r['shapes']}")
        if not r["gathered back equal"]:
            failures.append(f"rank {rank}: to_linear() differs from the layer it was built from")
    return failures


@pytest.mark.parametrize("dtype_name", list(TOLERANCE))
def test_output_and_every_gradient_match_fp32(layer_results, dtype_name):
    failures = layer_failures(
        layer_results, dtype_name, TOLERANCE[dtype_name], (TOKENS, HIDDEN, FFN), TP
    )
    assert not failures, failures


def every_tp_worker(rank, tp):
    """layers_worker in fp32 and bf16 on sizes that split over ``tp``, and the ValueError of each
    layer's constraint on TP, raised before any collective (so by every rank)."""
    layers = layers_worker(rank, tp, ["float32", "bfloat16"], sizes=EVERY_TP_SIZES)
    errors = [
        value_error(lambda: ColumnParallelLinear(HIDDEN, 8 * tp + 1)),
        value_error(lambda: RowParallelLinear(FFN, HIDDEN)(torch.randn(2 * tp + 1, FFN // tp))),
    ]
    return {"layers": layers, "errors": errors}


@pytest.mark.parametrize("tp", CPU_TPS)
def test_every_tp_matches_fp32_and_every_rank_raises_on_indivisible_shapes(tmp_path, tp):
    results = run_ranks(every_tp_worker, tmp_path, tp=tp)
    assert len(results) == tp
    layers = [r["layers"] for r in results]
    failures = []
    for dtype_name in ("float32", "bfloat16"):
        failures += layer_failures(layers, dtype_name, TOLERANCE[dtype_name], EVERY_TP_SIZES, tp)
    assert not failures, failures
    want = [
        f"out_features={8 * tp + 1} is not divisible by tp={tp}",
        f"RowParallelLinear: tokens={2 * tp + 1} (input dim 0) is not divisible by tp={tp}",
    ]
    assert [r["errors"] for r in results] == [want] * tp


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
    with pytest.raises(ValueError, match=r"tokens=7 \(input dim 0\) is not divisible by tp=2"):
        RowParallelLinear(32, 16, group=group)(torch.randn(7, 16))


def test_layers_deep_copy(one_rank_group):
    torch.manual_seed(4)
    col = ColumnParallelLinear(HIDDEN, FFN)
    twin = copy.deepcopy(col)
    x = torch.randn(TOKENS, HIDDEN)
    assert torch.equal(twin(x), col(x)) and twin.group_name == col.group_name


def test_sequence_first_3d_input(one_rank_group):
    torch.manual_seed(1)
    fc = nn.Linear(HIDDEN, FFN)
    col = ColumnParallelLinear.from_linear(fc)
    x = torch.randn(4, 3, HIDDEN)  # [seq, batch, hidden]
    torch.testing.assert_close(col(x), fc(x), rtol=1e-5, atol=1e-5)
    row = RowParallelLinear.from_linear(nn.Linear(FFN, HIDDEN))
    assert row(torch.randn(4, 3, FFN)).shape == (4, 3, HIDDEN)


def test_autocast_computes_in_its_dtype_and_grads_reach_fp32_params(one_rank_group):
    torch.manual_seed(2)
    fc1, fc2 = nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN)
    col, row = ColumnParallelLinear.from_linear(fc1), RowParallelLinear.from_linear(fc2)
    x = torch.randn(TOKENS, HIDDEN)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = row(col(x))
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    fc2(fc1(x)).sum().backward()
    assert col.weight.dtype == torch.float32 and col.weight.grad.dtype == torch.float32
    for got, ref in [(col.weight.grad, fc1.weight.grad), (row.bias.grad, fc2.bias.grad)]:
        assert rel_err(got, ref) <= TOLERANCE["bfloat16"]
    assert rel_err(y, fc2(fc1(x))) <= TOLERANCE["bfloat16"]


def test_regathering_column_layer_keeps_only_the_shard_and_compiles(one_rank_group):
    torch.manual_seed(3)
    fc = nn.Linear(HIDDEN, FFN)
    kept = ColumnParallelLinear.from_linear(fc)
    regather = ColumnParallelLinear.from_linear(fc, keep_gathered_input=False)
    x = torch.randn(TOKENS, HIDDEN)
    for layer, saves_input in [(kept, False), (regather, True)]:
        saved = []

        def pack(t, saved=saved):
            saved.append(t.data_ptr())
            return t

        xi = x.clone().requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            layer(xi)
        assert (xi.data_ptr() in saved) == saves_input  # the shard itself, not a gathered copy
    grads = []
    for layer in (kept, torch.compile(regather, fullgraph=True, backend="aot_eager")):
        xi = x.clone().requires_grad_()
        layer(xi).square().sum().backward()
        grads.append(xi.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(regather.weight.grad, kept.weight.grad, rtol=1e-6, atol=1e-6)
