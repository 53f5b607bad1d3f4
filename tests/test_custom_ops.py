"""The torch.library ops distgemm::all_gather_linear / linear_reduce_scatter on the CPU:
torch.library.opcheck, the fake kernels' shapes on a 2-rank fake group, their ValueErrors, and a
model of both layers under torch.compile(fullgraph=True) on 2 gloo ranks: zero graph breaks, each
op one node of the forward and of the backward graph, compiled equal to eager.
"""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from ranks import CPU_TPS, run_ranks, value_error  # noqa: E402
from torch import nn  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

from distgemm.compat import custom_ops  # noqa: E402
from distgemm.compat.nn import ColumnParallelLinear, RowParallelLinear  # noqa: E402

OPS = {
    "all_gather_linear": torch.ops.distgemm.all_gather_linear.default,
    "linear_reduce_scatter": torch.ops.distgemm.linear_reduce_scatter.default,
}


@pytest.fixture
def group_of(request):
    """A one-rank gloo group (real collectives) or a fake group of ``tp`` ranks (shapes only)."""

    def make(tp):
        if tp == 1:
            dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
        else:
            dist.init_process_group("fake", rank=0, world_size=tp, store=FakeStore())
        request.addfinalizer(dist.destroy_process_group)
        return dist.group.WORLD.group_name

    return make


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(group_of, with_bias, dtype):
    name = group_of(1)
    g = torch.Generator().manual_seed(3)

    def arg(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()

    cases = {
        "all_gather_linear": (arg(8, 16), arg(24, 16), arg(24) if with_bias else None, name),
        "linear_reduce_scatter": (arg(8, 24), arg(16, 24), arg(16) if with_bias else None, name),
    }
    for op_name, args in cases.items():
        result = torch.library.opcheck(OPS[op_name], args)
        assert set(result.values()) == {"SUCCESS"}, (op_name, result)


@pytest.mark.parametrize("tp", CPU_TPS)
def test_fake_shapes_and_indivisible_rows_on_tp_ranks(group_of, tp):
    name = group_of(tp)
    with FakeTensorMode():
        x_shard = torch.empty(8, 64, dtype=torch.bfloat16)
        out, gathered = custom_ops.all_gather_linear(
            x_shard,
            torch.empty(40, 64, dtype=torch.bfloat16),
            torch.empty(40, dtype=torch.bfloat16),
            name,
        )
        rs = custom_ops.linear_reduce_scatter(
            torch.empty(48, 40, dtype=torch.float16),
            torch.empty(64, 40, dtype=torch.float16),
            None,
            name,
        )
        with pytest.raises(
            ValueError, match=rf"M=x.shape\[0\]={2 * tp + 1} is not divisible by tp={tp}"
        ):
            custom_ops.linear_reduce_scatter(
                torch.empty(2 * tp + 1, 40), torch.empty(64, 40), None, name
            )
    assert (tuple(out.shape), out.dtype) == ((8 * tp, 40), torch.bfloat16)
    assert tuple(gathered.shape) == (8 * tp, 64)
    assert (tuple(rs.shape), rs.dtype) == ((48 // tp, 64), torch.float16)


@pytest.mark.parametrize(
    "op_name, shapes, message",
    [
        (
            "all_gather_linear",
            [(8, 64), (40, 48), None],
            r"x_shard.shape\[1\]=64 must equal w.shape\[1\]=48",
        ),
        (
            "all_gather_linear",
            [(8, 64), (40, 64), (41,)],
            r"bias.shape=\[41\] must be \[w.shape\[0\]\]=\[40\]",
        ),
        (
            "all_gather_linear",
            [(8, 64, 1), (40, 64), None],
            r"2-D x_shard and w, got x_shard.shape=\[8, 64, 1\]",
        ),
        (
            "linear_reduce_scatter",
            [(15, 40), (64, 40), None],
            r"M=x.shape\[0\]=15 is not divisible by tp=2",
        ),
        (
            "linear_reduce_scatter",
            [(16, 40), (64, 32), None],
            r"x.shape\[1\]=40 must equal w.shape\[1\]=32",
        ),
        (
            "linear_reduce_scatter",
            [(16, 40), (64, 40), (40,)],
            r"bias.shape=\[40\] must be \[w.shape\[0\]\]=\[64\]",
        ),
    ],
)
def test_fake_kernel_errors_name_the_values(group_of, op_name, shapes, message):
    name = group_of(2)
    with FakeTensorMode():
        args = [None if s is None else torch.empty(*s) for s in shapes]
        with pytest.raises(ValueError, match=message):
            getattr(custom_ops, op_name)(*args, name)


def test_mixed_dtypes_raise_value_error(group_of):
    name = group_of(1)
    with pytest.raises(ValueError, match=r"one dtype, got \['torch.bfloat16', 'torch.float32'\]"):
        custom_ops.all_gather_linear(torch.randn(8, 16), torch.randn(8, 16).bfloat16(), None, name)


class _Mlp(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.up = ColumnParallelLinear(hidden, ffn)
        self.down = RowParallelLinear(ffn, hidden)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


def compile_worker(rank, tp, device="cpu", dtype_name="float32", sizes=(8, 32, 48), backend=None):
    """A column- then row-parallel MLP, eager and under torch.compile(fullgraph=True): graph
    breaks, the ops of the forward and backward graphs (``backend=None``: aot_eager's graphs,
    recorded; else that backend, e.g. "inductor", unrecorded) and the largest relative difference
    between eager and compiled output and gradients."""
    from test_nn import rel_err
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.utils import counters

    tokens, hidden, ffn = sizes
    dtype = getattr(torch, dtype_name)
    graphs = []

    def record(gm, example_inputs):
        graphs.append(sorted(str(n.target) for n in gm.graph.nodes if n.op == "call_function"))
        return gm.forward

    torch.manual_seed(0)
    model = _Mlp(hidden, ffn)
    for p in model.parameters():  # each rank's shard differs; the full layer is the same
        p.data.add_(0.01 * rank)
    model.to(device=device, dtype=dtype)
    torch.manual_seed(1 + rank)
    x = torch.randn(tokens // tp, hidden).to(device, dtype)
    grad = torch.randn(tokens // tp, hidden).to(device, dtype)

    def step(fn):
        model.zero_grad()
        xi = x.clone().requires_grad_()
        y = fn(xi)
        y.backward(grad)
        return [y.detach(), xi.grad, *(p.grad.clone() for p in model.parameters())]

    eager = step(model)
    torch._dynamo.reset()
    counters.clear()
    if backend is None:
        backend = aot_autograd(fw_compiler=record, bw_compiler=record)  # aot_eager, recording
    compiled = step(torch.compile(model, fullgraph=True, backend=backend))
    return {
        "graph breaks": sum(counters["graph_break"].values()),
        "graphs": graphs,
        "max rel diff": max(rel_err(a, b) for a, b in zip(compiled, eager)),
        "grads nonzero": all(t.abs().sum().item() > 0 for t in eager[1:]),
    }


def compile_failures(results, tolerance, recorded=True) -> list[str]:
    """What compile_worker's results on every rank get wrong: a graph break, a graph where a
    distgemm op is not one node (or a collective shows), compiled differing from eager."""
    failures = []
    for rank, r in enumerate(results):
        if r["graph breaks"]:
            failures.append(f"rank {rank}: {r['graph breaks']} graph breaks")
        if recorded and len(r["graphs"]) != 2:
            failures.append(f"rank {rank}: {len(r['graphs'])} graphs, not forward + backward")
        for graph in r["graphs"] if recorded else []:
            ops = [t for t in graph if t.startswith("distgemm.")]
            if ops != [
                "distgemm.all_gather_linear.default",
                "distgemm.linear_reduce_scatter.default",
            ]:
                failures.append(f"rank {rank}: distgemm ops {ops} in a graph")
            if any("c10d" in t for t in graph):
                failures.append(f"rank {rank}: a collective outside the distgemm ops: {graph}")
        if not r["grads nonzero"]:
            failures.append(f"rank {rank}: a gradient is zero")
        if r["max rel diff"] > tolerance:
            failures.append(f"rank {rank}: compiled differs from eager by {r['max rel diff']:.2e}")
    return failures


@pytest.fixture(scope="module")
def compile_results(tmp_path_factory):
    return run_ranks(compile_worker, tmp_path_factory.mktemp("compile"))


def test_compiled_fullgraph_one_node_per_op_equal_to_eager(compile_results):
    failures = compile_failures(compile_results, tolerance=1e-6)
    assert not failures, failures


EVERY_TP_SIZES = (48, 48, 24)  # M, K, N: each divides by 2, 3, 4, 6, 8
EVERY_TP_TOLERANCE = 1e-5  # relative, fp32: a 48-term sum's rounding is about 1e-6


def every_tp_worker(rank, tp):
    """Both ops in fp32, eager, with
    their gradients, against the same products of the full operands on one rank (relative
    errors), and the ValueError of rows indivisible by TP, raised before any collective."""
    from test_nn import rel_err

    name = dist.group.WORLD.group_name
    m, k, n = EVERY_TP_SIZES
    g = torch.Generator().manual_seed(7)  # the same full operands on every rank
    x, w_ag, w_rs, bias, grad = (
        torch.randn(*shape, generator=g) for shape in ((m, k), (n, k), (n, k), (n,), (m, n))
    )
    rows, ks, ns = (slice(rank * e // tp, (rank + 1) * e // tp) for e in (m, k, n))
    # all_gather_linear: x's rows sharded, w's and bias's rows (a column-parallel layer's shard).
    leaves = [t.clone().requires_grad_() for t in (x[rows], w_ag[ns], bias[ns])]
    out, gathered = custom_ops.all_gather_linear(*leaves, name)
    (out * grad[:, ns]).sum().backward()
    got_ag = [out, gathered, *(t.grad for t in leaves)]
    want_ag = [
        (x @ w_ag.T + bias)[:, ns],
        x,
        (grad @ w_ag)[rows],
        (grad.T @ x)[ns],
        grad.sum(0)[ns],
    ]
    # linear_reduce_scatter: x's and w's K sharded, bias whole; rank's rows out.
    leaves = [t.clone().requires_grad_() for t in (x[:, ks], w_rs[:, ks], bias)]
    out = custom_ops.linear_reduce_scatter(*leaves, name)
    (out * grad[rows]).sum().backward()
    got_rs = [out, *(t.grad for t in leaves)]
    want_rs = [(x @ w_rs.T + bias)[rows], (grad @ w_rs)[:, ks], grad.T @ x[:, ks], grad.sum(0)]
    rows = torch.randn(2 * tp + 1, k // tp)
    error = value_error(lambda: custom_ops.linear_reduce_scatter(rows, w_rs[:, ks], None, name))
    return {
        "all_gather_linear": [rel_err(a.detach(), b) for a, b in zip(got_ag, want_ag)],
        "linear_reduce_scatter": [rel_err(a.detach(), b) for a, b in zip(got_rs, want_rs)],
        "error": error,
    }


@pytest.mark.parametrize("tp", CPU_TPS)
def test_every_tp_matches_the_full_product_and_every_rank_raises_on_indivisible_rows(tmp_path, tp):
    results = run_ranks(every_tp_worker, tmp_path, tp=tp)
    assert len(results) == tp
    for rank, r in enumerate(results):
        for op in ("all_gather_linear", "linear_reduce_scatter"):
            assert max(r[op]) < EVERY_TP_TOLERANCE, (rank, op, r[op])
        assert r["error"] == (
            f"linear_reduce_scatter: M=x.shape[0]={2 * tp + 1} is not divisible by tp={tp}"
        )
