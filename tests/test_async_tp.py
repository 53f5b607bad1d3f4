"""distgemm.compat.async_tp, the one switch for torch's async-TP, on the CPU.

- install() / uninstall(): idempotent and reversible (the dispatcher's table of every routed op
  is what it was), the router is the active CUDA kernel of the four ops and nothing else changes
  (Meta and CPU keys), DISTGEMM_ASYNC_TP at the import of distgemm.compat.
- The router with fakes: a servable call goes to distgemm's drop-in, any other to torch's kernel
  with the keyset and the arguments unchanged, with the reason counted (routing_stats); refused
  arguments and a build without the CUDA runtime are reasons too.
- The real rules through the router on one gloo rank: CPU tensors, a gather of K, refused
  arguments, the fp8 ops.
- torch.compile on 2 gloo ranks: torch's micro-pipeline TP pass
  (torch._inductor.config._micro_pipeline_tp) rewrites a sequence-parallel MLP's all-gather +
  matmul and matmul + reduce-scatter into torch.ops.symm_mem's fused ops, and the compiled graph
  (inductor, fullgraph, no graph break) reaches the router: with distgemm's rules it gives CPU
  calls back to torch, with the rules waived distgemm's drop-ins serve them; the outputs equal
  the uncompiled function's within fp32 rounding (RTOL, ATOL). Also a compiled function that
  calls the fused ops itself.

The CUDA key cannot run here, so these tests register the router for the CPU key in a test
library (``cpu_routers``; the package registers CUDA only), with torch's reference
implementation of each op (its Meta kernel, which computes on any device) in the place of
torch's CUDA kernel. torch's pass fuses only where ``torch.distributed.is_nccl_available()``
(False in a CPU build of torch) and symmetric memory is enabled for the group: the workers set
the first to True and use torch's ``_test_mode`` for the second. The GPU test with the real
CUDA kernels is tests/gpu/test_async_tp.py.
"""

import contextlib
import dataclasses
import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402
import torch.distributed._symmetric_memory as torch_symm_mem  # noqa: E402
from ranks import run_ranks  # noqa: E402

from distgemm import _core  # noqa: E402
from distgemm.compat import async_tp  # noqa: E402

OPS = list(async_tp.ROUTES)
BF16_OPS = ["fused_all_gather_matmul", "fused_matmul_reduce_scatter"]
RTOL, ATOL = 1e-5, 1e-5  # fp32: compiled and eager sum the same products in another order
CPU_REASON = "CPU tensors: distgemm runs on CUDA GPUs only"
REFUSED = "distgemm's checks refuse the arguments: "
# funcol's names in the running torch (torch 2.11 has only the *_tensor ones)
_all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
_reduce_scatter = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor


@pytest.fixture
def switch():
    """async_tp with empty counts, uninstalled and counts cleared again afterwards."""
    async_tp.uninstall()
    async_tp.reset_routing_stats()
    yield async_tp
    async_tp.uninstall()
    async_tp.reset_routing_stats()


def dispatch_tables() -> dict[str, str]:
    return {name: torch._C._dispatch_dump(f"symm_mem::{name}") for name in OPS}


def active_kernel_line(table: str, key: str) -> str:
    """The line of ``key``'s active kernel in a ``_dispatch_dump`` table."""
    lines = [line for line in table.splitlines() if line.startswith(f"{key}: ")]
    assert len(lines) == 1, table
    return lines[0]


def test_install_uninstall_idempotent_and_reversible(switch):
    before = dispatch_tables()
    impls_before = set(torch.library._impls)
    assert not switch.installed() and not switch.routing_stats().installed
    switch.install()
    switch.install()  # a second install is a no-op: one router per op
    assert switch.installed() and switch.routing_stats().installed
    for name, table in dispatch_tables().items():
        qualname = f"symm_mem::{name}"
        assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CUDA")
        assert "compat/async_tp.py" in active_kernel_line(table, "CUDA"), table
        # torch's kernel stays, shadowed; Meta (shapes under compile) is torch's; no CPU kernel
        assert "CUDA (inactive): registered at" in table, table
        assert table.count("CUDA: registered at") == 1, table
        assert active_kernel_line(table, "Meta") == active_kernel_line(before[name], "Meta")
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CPU")
    switch.uninstall()
    switch.uninstall()
    assert not switch.installed() and not switch.routing_stats().installed
    assert dispatch_tables() == before
    assert set(torch.library._impls) == impls_before
    switch.install()  # and again after an uninstall
    assert all(
        "compat/async_tp.py" in active_kernel_line(t, "CUDA") for t in dispatch_tables().values()
    )


@pytest.mark.parametrize(
    "value, installed", [("1", True), ("0", False), ("", False), ("yes", None)]
)
def test_environment_variable(value, installed):
    """DISTGEMM_ASYNC_TP at the import of distgemm.compat (in a process of its own)."""
    code = "from distgemm.compat import async_tp; print(async_tp.installed())"
    env = {**os.environ, async_tp.ENV: value}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if installed is None:
        assert proc.returncode != 0
        assert "DISTGEMM_ASYNC_TP='yes': 1 routes torch's async-TP ops" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == [str(installed)]


class FakeKernel:
    """torch's kernel as the router sees it (``call_boxed``), recording its calls."""

    def __init__(self, result="torch"):
        self.calls, self.result = [], result

    def call_boxed(self, keyset, *args, **kwargs):
        self.calls.append((keyset, args, kwargs))
        return self.result


def fake_route(reason):
    """A Route whose rule says ``reason`` (an exception: raises it) and whose drop-in records."""
    served = []

    def rule(*args, **kwargs):
        if isinstance(reason, Exception):
            raise reason
        return reason

    def serve(*args, **kwargs):
        served.append((args, kwargs, torch.is_grad_enabled()))
        return "distgemm"

    return async_tp.Route(rule, serve), served


@pytest.mark.parametrize("name", OPS)
def test_router_serves_or_falls_back(switch, monkeypatch, name):
    monkeypatch.setattr(_core, "cuda_runtime", True, raising=False)
    keyset = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
    args, kwargs = ("A", ["B"], 0, "group"), {"return_A": False}
    torch_kernel = FakeKernel()
    router = switch.make_router(name, torch_kernel)

    route, served = fake_route(None)
    monkeypatch.setitem(switch.ROUTES, name, route)
    assert router(keyset, *args, **kwargs) == "distgemm"
    assert served == [(args, kwargs, False)] and torch_kernel.calls == []  # under no_grad

    rules = [
        "K=12 is not a multiple of 8",
        ValueError("Bs[0].shape[0]=16 must equal K=32"),
        TypeError("B is torch.float8_e5m2"),
    ]
    for rule in rules:
        route, served = fake_route(rule)
        monkeypatch.setitem(switch.ROUTES, name, route)
        assert router(keyset, *args, **kwargs) == "torch"
        assert served == [] and torch_kernel.calls[-1] == (keyset, args, kwargs)
    monkeypatch.setattr(_core, "cuda_runtime", False, raising=False)
    monkeypatch.setitem(switch.ROUTES, name, fake_route(None)[0])
    assert router(keyset, *args, **kwargs) == "torch"

    stats = switch.routing_stats().ops[name]
    assert stats.served == 1 and stats.fallen_back == 4
    assert sorted(stats.fallbacks) == sorted(
        [
            "K=12 is not a multiple of 8",
            REFUSED + "Bs[0].shape[0]=16 must equal K=32",
            REFUSED + "B is torch.float8_e5m2",
            f"distgemm was built without the CUDA runtime ({_core.cuda_runtime_reason})",
        ]
    )
    others = [o for n, o in switch.routing_stats().ops.items() if n != name]
    assert all(o.served == 0 and o.fallen_back == 0 for o in others)
    switch.reset_routing_stats()
    assert switch.routing_stats().served == 0 and switch.routing_stats().fallen_back == 0


def test_unknown_op_is_refused(switch):
    with pytest.raises(ValueError, match=r"symm_mem::fused_all_reduce is not routed"):
        switch.make_router("fused_all_reduce", FakeKernel())


def test_routes_serve_the_drop_ins_python_functions_not_their_ops():
    """The router already runs inside torch's dispatcher: each route calls the drop-in's function
    directly, not the torch.library op that wraps it (a second dispatch per call)."""
    import inspect

    for name, route in async_tp.ROUTES.items():
        assert inspect.isfunction(route.serve), (name, type(route.serve))
        module = inspect.getmodule(route.serve)
        op = getattr(module, name)  # compat.symm_mem(_fp8).<the symm_mem op's name>
        assert isinstance(op, torch.library.CustomOpDef) and hasattr(torch.ops.distgemm, name)
        assert route.serve.__name__ == name.removeprefix("fused_")


def _fp8_args(group_name, A_dtype=torch.float8_e4m3fn):
    g = torch.Generator().manual_seed(3)
    A = torch.rand(4, 16, 32, generator=g).to(A_dtype)
    B = torch.rand(16, 32, generator=g).to(torch.float8_e4m3fn).t()
    one = torch.tensor(0.1)
    gather = (A, [B], one, [one], 0, group_name, [None], [None], [torch.bfloat16], [False])
    scatter = (A, B, one, one, "sum", 0, 0, group_name, [4, 16, 16])
    return gather, scatter


def test_real_rules_through_the_router(switch, group_name):
    """The rules of compat.symm_mem / symm_mem_fp8 behind the router, on one gloo rank."""
    torch_kernel = FakeKernel()
    route = {name: switch.make_router(name, torch_kernel) for name in OPS}
    keyset = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    g = torch.Generator().manual_seed(2)
    A, B = torch.rand(4, 16, 32, generator=g), torch.rand(32, 16, generator=g)
    fp8_gather, fp8_scatter = _fp8_args(group_name)
    bad_gather, bad_scatter = _fp8_args(group_name, torch.float8_e5m2)
    ag, rs = "fused_all_gather_matmul", "fused_matmul_reduce_scatter"
    ag8, rs8 = "fused_all_gather_scaled_matmul", "fused_scaled_matmul_reduce_scatter"
    refused = re.escape(REFUSED) + ".*"  # then the op's own error
    calls = [  # op, arguments, keyword arguments, the reason (a regex)
        (ag, (A, [B], 0, group_name), {"return_A": True}, CPU_REASON),
        (ag, (A, [B], 2, group_name), {}, "gather_dim is the contracted dim K"),
        (ag, (A, [B[:8]], 0, group_name), {}, refused + r"Bs\[0\].shape\[0\]=8 must equal K=32"),
        (rs, (A, B, "sum", 1, group_name), {}, CPU_REASON),
        (rs, (A, B, "max", 1, group_name), {}, refused + "reduce_op='max' is not one of"),
        (ag8, fp8_gather, {}, CPU_REASON),
        (ag8, bad_gather, {}, refused + "A_shard is torch.float8_e5m2"),
        (rs8, fp8_scatter, {}, CPU_REASON),
        (rs8, bad_scatter, {}, refused + "A is torch.float8_e5m2"),
    ]
    for name, args, kwargs, reason in calls:
        assert route[name](keyset, *args, **kwargs) == "torch"
        assert torch_kernel.calls[-1] == (keyset, args, kwargs)
        fallbacks = switch.routing_stats().ops[name].fallbacks
        assert any(re.search(reason, r) for r in fallbacks), (name, reason, fallbacks)
    assert switch.routing_stats().served == 0
    assert switch.routing_stats().fallen_back == len(calls)


class TorchReference:
    """torch's reference implementation of a symm_mem op (its Meta kernel, which computes on any
    device) in the place of torch's CUDA kernel, as the router calls it."""

    def __init__(self, name: str):
        self.fn = getattr(torch_symm_mem, f"_{name}_fallback")

    def call_boxed(self, keyset, *args, **kwargs):
        return self.fn(*args, **kwargs)


@contextlib.contextmanager
def cpu_routers(names):
    """The router of each op in ``names`` as its CPU kernel, for the duration (tests only)."""
    library = torch.library.Library("symm_mem", "IMPL")
    for name in names:
        router = async_tp.make_router(name, TorchReference(name))
        library.impl(name, router, "CPU", with_keyset=True)
    try:
        yield
    finally:
        library._destroy()


@contextlib.contextmanager
def rules_waived(names):
    """distgemm's rules waived for ``names`` (and the CUDA runtime taken as built): the router
    hands every call to the drop-in, which runs its collective path on CPU tensors."""
    saved = dict(async_tp.ROUTES)
    had_runtime = getattr(_core, "cuda_runtime", False)
    for name in names:
        async_tp.ROUTES[name] = dataclasses.replace(saved[name], reason=lambda *a, **k: None)
    _core.cuda_runtime = True
    try:
        yield
    finally:
        async_tp.ROUTES.update(saved)
        _core.cuda_runtime = had_runtime


def sequence_parallel_mlp(x_shard, w1, w2, group_name):
    """x_shard [S/TP, B, H] -> all-gather of S -> x @ w1.T, relu, @ w2.T -> reduce-scatter of S:
    the column- then row-parallel MLP of a sequence-parallel block in Megatron's sequence-first
    layout (torch 2.11's dynamo refuses a functional all-gather along dim 1 under fullgraph:
    ``_maybe_view_chunk_cat`` is marked skipped)."""
    x = _all_gather(x_shard, 0, group_name)
    h = torch.relu(x @ w1.t())
    return _reduce_scatter(h @ w2.t(), "sum", 0, group_name)


def _fused_ops_called(A_shard, B1, B2, group_name):
    """The fused ops called directly (the form torch's pass leaves in the graph)."""
    x, (h,) = torch.ops.symm_mem.fused_all_gather_matmul(A_shard, [B1], 0, group_name)
    return torch.ops.symm_mem.fused_matmul_reduce_scatter(torch.relu(h), B2, "sum", 0, group_name)


def routed(before, after, names=tuple(OPS)) -> dict:
    """What the router did between two RoutingStats, per op of ``names``:
    ``[served, {reason: calls given back}]``."""
    out = {}
    for name in names:
        b, a = before.ops[name], after.ops[name]
        reasons = {r: n - b.fallbacks.get(r, 0) for r, n in a.fallbacks.items()}
        out[name] = [a.served - b.served, {r: n for r, n in reasons.items() if n}]
    return out


@contextlib.contextmanager
def pass_on_cpu(*contexts):
    """torch's pass on a CPU torch, for the duration: its NCCL gate opened, the switch installed
    with the CPU routers, symm_mem's test mode, ``_micro_pipeline_tp`` on, and ``contexts``."""
    nccl_available = dist.is_nccl_available
    dist.is_nccl_available = lambda: True  # the pass's gate; a CPU torch has no NCCL
    async_tp.install()
    try:
        with contextlib.ExitStack() as stack:
            for context in (
                cpu_routers(BF16_OPS),
                *contexts,
                torch_symm_mem._test_mode(),
                torch._inductor.config.patch(_micro_pipeline_tp=True),
            ):
                stack.enter_context(context)
            yield
    finally:
        dist.is_nccl_available = nccl_available
        async_tp.uninstall()


def compile_worker(rank, tp):
    """torch's pass and a direct call of the fused ops, compiled with inductor (fullgraph) with
    the switch installed and the CPU routers registered: per function, the graph breaks and, for
    distgemm's rules and for the rules waived, what the router did and whether the compiled
    output equals the eager one."""
    from torch._dynamo.utils import counters

    group_name = dist.group.WORLD.group_name
    torch.manual_seed(0)  # the same weights on every rank, this rank's rows of the input
    w1, w2 = torch.randn(48, 64), torch.randn(64, 48)
    x_shard = torch.randn(tp, 16, 2, 64)[rank]
    cases = {
        "pass": (sequence_parallel_mlp, (x_shard, w1, w2, group_name)),
        "direct": (_fused_ops_called, (x_shard, w1.t(), w2.t(), group_name)),
    }
    results = {}
    with pass_on_cpu():
        for case, (fn, args) in cases.items():
            torch._dynamo.reset()
            counters.clear()
            compiled = torch.compile(fn, fullgraph=True)
            eager = sequence_parallel_mlp(x_shard, w1, w2, group_name)
            result = {}
            for rules in ("distgemm's rules", "rules waived"):
                waived = rules_waived(BF16_OPS) if rules == "rules waived" else None
                with waived or contextlib.nullcontext():
                    before = async_tp.routing_stats()
                    out = compiled(*args)
                    result[rules] = {
                        "routed": routed(before, async_tp.routing_stats(), BF16_OPS),
                        "equal": torch.allclose(out, eager, rtol=RTOL, atol=ATOL),
                        "shape": list(out.shape),
                    }
            result["graph breaks"] = sum(counters["graph_break"].values())
            results[case] = result
    return results


@pytest.fixture(scope="module")
def compiled_results(tmp_path_factory):
    return run_ranks(compile_worker, tmp_path_factory.mktemp("async_tp"))


@pytest.mark.parametrize("case", ["pass", "direct"])
@pytest.mark.parametrize("rules", ["distgemm's rules", "rules waived"])
def test_compiled_graph_reaches_distgemm(compiled_results, case, rules):
    for rank, result in enumerate(compiled_results):
        got = result[case]
        assert got["graph breaks"] == 0, (rank, got)
        r = got[rules]
        assert r["equal"] and r["shape"] == [16, 2, 64], (rank, r)  # x_shard's shape
        if rules == "rules waived":  # every fused op of the graph served by the drop-in
            assert r["routed"] == {name: [1, {}] for name in BF16_OPS}, (rank, r)
        else:  # CPU tensors: every call given back to torch's kernel, with the reason
            assert r["routed"] == {name: [0, {CPU_REASON: 1}] for name in BF16_OPS}, (rank, r)


def test_install_sets_and_uninstall_restores_the_gather_rewrite(switch):
    import torch._inductor.config as inductor_config

    from distgemm.compat import gather_rewrite

    def users_pass(graph):
        pass

    with torch._inductor.config.patch(post_grad_custom_pre_pass=users_pass):
        switch.install()
        ours = inductor_config.post_grad_custom_pre_pass
        assert isinstance(ours, gather_rewrite.GatherRewritePass) and ours.chained is users_pass
        switch.install()
        assert inductor_config.post_grad_custom_pre_pass is ours  # not wrapped twice
        assert ours.uuid() == gather_rewrite.GatherRewritePass(users_pass).uuid()
        switch.uninstall()
        assert inductor_config.post_grad_custom_pre_pass is users_pass


def sequence_parallel_block(mesh, hidden=64, ffn=96):
    """A DTensor sequence-parallel MLP block as torchtitan builds it: RMSNorm on the sequence
    shard, then gate/up column-parallel (input Shard(1): the sequence all-gathered), down
    row-parallel back to Shard(1); the same weights on every rank."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.RMSNorm(hidden)
            self.w1 = torch.nn.Linear(hidden, ffn, bias=False)
            self.w3 = torch.nn.Linear(hidden, ffn, bias=False)
            self.w2 = torch.nn.Linear(ffn, hidden, bias=False)

        def forward(self, x):
            y = self.norm(x)
            return x + self.w2(torch.nn.functional.silu(self.w1(y)) * self.w3(y))

    torch.manual_seed(0)
    block = Block()
    plan = {
        "norm": SequenceParallel(),
        "w1": ColwiseParallel(input_layouts=Shard(1)),
        "w3": ColwiseParallel(input_layouts=Shard(1)),
        "w2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    }
    return parallelize_module(block, mesh, plan)


def dtensor_block_worker(rank, tp):
    """The block compiled with torch's pass, the switch installed (CPU routers, rules waived),
    at batch 1 and 2: per batch, the all-gather + matmul fusions torch's pass inserted, the
    fused ops the router served, and whether the output equals the uncompiled block's."""
    from torch._inductor.fx_passes import micro_pipeline_tp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (tp,))
    block = sequence_parallel_block(mesh)
    inserted = {"n": 0}
    original = micro_pipeline_tp._insert_fused_all_gather_matmul

    def counting(*args, **kwargs):
        inserted["n"] += 1
        return original(*args, **kwargs)

    micro_pipeline_tp._insert_fused_all_gather_matmul = counting
    results = {}
    try:
        with pass_on_cpu(rules_waived(BF16_OPS)):
            for batch in (1, 2):
                torch._dynamo.reset()
                inserted["n"] = 0
                torch.manual_seed(1)
                x = distribute_tensor(torch.randn(batch, 8 * tp, 64), mesh, [Shard(1)])
                eager = block(x).full_tensor()
                before = async_tp.routing_stats()
                out = torch.compile(block)(x).full_tensor()
                after = async_tp.routing_stats()
                results[batch] = {
                    "fusions": inserted["n"],
                    "served": routed(before, after, BF16_OPS),
                    "equal": torch.allclose(out, eager, rtol=RTOL, atol=ATOL),
                }
    finally:
        micro_pipeline_tp._insert_fused_all_gather_matmul = original
    return results


@pytest.mark.parametrize("tp", [2, 4])
def test_batch_one_sequence_gather_is_fused_and_served(tmp_path, tp):
    """At batch 1 DTensor gathers the sequence as a dim-0 all-gather + reshape, which torch's
    pass fuses only after gather_rewrite; at batch 2 (split + cat) it fuses it anyway."""
    results = run_ranks(dtensor_block_worker, tmp_path, tp=tp)
    assert len(results) == tp
    for rank, res in enumerate(results):
        for batch in (1, 2):
            r = res[batch]
            assert r["equal"], (rank, batch, r)
            assert r["fusions"] >= 1, (rank, batch, r)
            assert r["served"]["fused_all_gather_matmul"][0] >= 1, (rank, batch, r)


def _gather_graph(shard_shape, tp, *, extra_user=False):
    """A post-grad-like graph: all_gather_into_tensor(x) -> wait -> reshape [1, S, H] ->
    reshape [S, H] -> mm (and, with ``extra_user``, the wait's result also returned as is),
    each node with its fake value."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    c10d, aten = torch.ops._c10d_functional, torch.ops.aten
    mode = FakeTensorMode()
    with mode:
        x, w = torch.empty(shard_shape), torch.empty(shard_shape[-1], 16)
        gathered = torch.empty(tp * shard_shape[0], *shard_shape[1:])
        rows = gathered.numel() // shard_shape[-1]
        seq, flat = gathered.reshape(1, rows, shard_shape[-1]), gathered.reshape(rows, -1)
        product = flat @ w
    g = torch.fx.Graph()
    nx, nw = g.placeholder("x"), g.placeholder("w")
    nx.meta["val"], nw.meta["val"] = x, w
    ag = g.call_function(c10d.all_gather_into_tensor.default, (nx, tp, "0"))
    wait = g.call_function(c10d.wait_tensor.default, (ag,))
    ag.meta["val"] = wait.meta["val"] = gathered
    r1 = g.call_function(aten.reshape.default, (wait, list(seq.shape)))
    r2 = g.call_function(aten.reshape.default, (r1, list(flat.shape)))
    r1.meta["val"], r2.meta["val"] = seq, flat
    mm = g.call_function(aten.mm.default, (r2, nw))
    mm.meta["val"] = product
    g.output((mm, wait) if extra_user else (mm,))
    return g


def test_gather_rewrite_feeds_the_matmul_from_a_2d_gather():
    from distgemm.compat import gather_rewrite

    c10d, aten = torch.ops._c10d_functional, torch.ops.aten
    g = _gather_graph((1, 8, 32), 4)
    assert gather_rewrite.rewrite(g) == 1
    g.lint()
    (ag,) = [n for n in g.nodes if n.target is c10d.all_gather_into_tensor.default]
    assert ag.args[0].target is aten.reshape.default and list(ag.args[0].args[1]) == [8, 32]
    (mm,) = [n for n in g.nodes if n.target is aten.mm.default]
    wait = mm.args[0]  # the 2-D gather feeds the mm with no reshape between
    assert wait.target is c10d.wait_tensor.default and wait.args[0] is ag
    assert tuple(wait.meta["val"].shape) == (32, 32)
    reshapes = [n for n in g.nodes if n.target is aten.reshape.default]
    assert reshapes == [ag.args[0]]  # the chain to [1, S, H] and back is gone
    assert gather_rewrite.rewrite(g) == 0  # a 2-D shard: nothing more to do


@pytest.mark.parametrize("shape, extra_user", [((8, 32), False), ((1, 8, 32), True)])
def test_gather_rewrite_leaves_other_graphs_as_they_are(shape, extra_user):
    from distgemm.compat import gather_rewrite

    g = _gather_graph(shape, 2, extra_user=extra_user)
    before = str(g)
    assert gather_rewrite.rewrite(g) == 0
    assert str(g) == before
