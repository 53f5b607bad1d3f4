"""CPU checks of the collective path and of the path choice, on a one-rank gloo group.

The collective path (distgemm.runtime.paths.collective), the "auto" choice between the paths at
entry creation (distgemm.runtime.choose: requested, table, model, a group without NCCL) and
path_choices."""

import pytest

torch = pytest.importorskip("torch")

from distgemm import llama3, ops  # noqa: E402
from distgemm.runtime import entry_cache as entries  # noqa: E402
from distgemm.runtime.choose import choose_path  # noqa: E402
from distgemm.runtime.paths import collective, common  # noqa: E402
from distgemm.runtime.precision import Precision  # noqa: E402


@pytest.mark.parametrize(
    "schedule,op",
    [
        ("ag_rotate_a", "all_gather_gemm"),
        ("ag_rotate_b", "all_gather_gemm"),
        ("rs_tile_a", "gemm_reduce_scatter"),
        ("rs_tile_b", "gemm_reduce_scatter"),
        ("ar_tile_a", "gemm_all_reduce"),
    ],
)
def test_collective_path_computes_the_layer_on_a_one_rank_group(monkeypatch, schedule, op):
    """The collective path's math (gather/scatter layout, bias, beta*c, the reused buffers) on a
    one-rank gloo group with CPU tensors; the GPU worker checks it on 2 ranks with NCCL."""

    import torch.distributed as dist

    monkeypatch.setattr(common, "_ptr", lambda op_, name, t, device: t.data_ptr())  # CPU tensors
    stream = {"now": 7}
    monkeypatch.setattr(collective, "stream_ptr", lambda device: stream["now"])
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        comm = OneRankComm(dist.group.WORLD)
        ag = op == "all_gather_gemm"
        g = torch.Generator().manual_seed(sum(map(ord, schedule)))  # not hash(): PYTHONHASHSEED
        beta = 0.0 if ag else -0.75
        entry = None
        for _ in range(2):  # fresh inputs per call; the second call reuses the plan's buffers
            m, k, n = 8 * torch.randint(1, 9, (1,), generator=g).item(), 40, 24
            a, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
            bias, c = torch.randn(n, generator=g), torch.randn(m, n, generator=g)
            if entry is None or entry.spec.m != m:
                spec = ops.make_spec(
                    op, schedule, 1, 0, None, a, w, bias=bias, beta=beta, c=None if ag else c
                )
                entry = collective.CollectiveState.create(spec, Precision(torch.float32), beta, ag)
            out = torch.full(tuple(entry.out_shape), float("nan"))
            res = collective.run_collective(
                op, comm, entry, {"a": a, "w": w, "bias": bias, "c": c}, out
            )
            y = res[0] if ag else res
            ref = a @ w.t() + bias + beta * c
            assert y.data_ptr() == out.data_ptr()
            assert float((y - ref).norm() / ref.norm()) < 1e-5
            if ag:  # return_gathered: the gathered operand itself
                assert torch.equal(res[1], a if schedule == "ag_rotate_a" else w)
        with pytest.raises(ValueError, match="out shares memory with a"):
            collective.run_collective(op, comm, entry, {"a": a, "w": w, "bias": bias, "c": c}, a)
        # A call on another stream gets its own buffer, the communicator's (none is needed by the
        # all-reduce, and return_gathered hands the gathered operand over instead of keeping it).
        scratch = collective.CollectiveScratch.of(comm)
        before = {s: b.flat for s, b in scratch.buffers.items()}
        stream["now"] = 9
        collective.run_collective(op, comm, entry, {"a": a, "w": w, "bias": bias, "c": c}, None)
        assert set(before) == ({7} if schedule.startswith("rs_") else set())
        assert set(scratch.buffers) == set(before) | ({9} if before else set())
        assert all(scratch.buffers[s].flat is before[s] for s in before)
        assert not hasattr(entry, "scratch")  # the entry holds no buffer
    finally:
        dist.destroy_process_group()


class OneRankComm:
    """What run_collective reads of a Communicator: the group, the device, the attachments."""

    def __init__(self, group):
        self.group, self.device, self._attachments = group, torch.device("cpu"), {}

    def attach(self, name, obj):
        self._attachments[name] = obj
        return obj

    def attachment(self, name):
        return self._attachments.get(name)


def test_collective_path_needs_nccl_every_rank_decides_from_the_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        why = collective.collective_unavailable(dist.group.WORLD)
        assert why == "the group's backend is 'gloo'; the collective path needs NCCL"
    finally:
        dist.destroy_process_group()


def test_path_choices_never_creates_a_communicator():
    import torch.distributed as dist

    assert not dist.is_initialized()
    assert ops.path_choices() == []  # no process group, no communicator: nothing to report


def _meta(*shape):
    return torch.empty(shape, device="meta", dtype=torch.bfloat16)


def _spec(op, tokens, model="70B", layer=None, tp=2, steps=None):
    """make_spec of a Llama layer at ``tokens`` on ``tp`` ranks (meta tensors: shapes only)."""
    layer = layer or ("QKV" if op == "all_gather_gemm" else "O")
    m, n, k = llama3.gemm(model, layer, tokens)
    schedule = "ag_rotate_a" if op == "all_gather_gemm" else "rs_tile_a"
    a, w = (
        (_meta(m // tp, k), _meta(n // tp, k))
        if op == "all_gather_gemm"
        else (
            _meta(m, k // tp),
            _meta(n, k // tp),
        )
    )
    return ops.make_spec(op, schedule, tp, 0, steps, a, w)


@pytest.mark.parametrize("requested", ["overlap", "collective"])
def test_a_requested_path_is_taken_as_it_is(requested):
    spec = _spec("all_gather_gemm", 64)
    assert choose_path(spec, requested, None, None) == (
        requested,
        {"source": "requested", "tile_n": 0},
    )


def test_auto_takes_the_models_path_with_its_prediction():
    from distgemm.runtime import cost_model, machine

    h200 = machine.load(machine.SHIPPED_DIR / "nvidia-h200-tp2-nvlink18.json")
    big = _spec("all_gather_gemm", 8192)  # 70B QKV: the overlap wins by ~13% in the sweep
    path, info = choose_path(big, "auto", None, None, h200)
    assert path == "overlap" and info["source"] == "model"
    assert (info["overlap_ms"], info["collective_ms"]) == pytest.approx(
        tuple(cost_model.predict(h200, big.plan).values())
    )
    assert info["overlap_ms"] < info["collective_ms"] - cost_model.MIN_GAIN_MS
    assert info["why"].startswith("model: predicted overlap")
    for tokens in (2, 64, 256):  # decode sizes: the model predicts the collective path faster
        path, info = choose_path(_spec("gemm_reduce_scatter", tokens), "auto", None, None, h200)
        assert path == "collective" and info["overlap_ms"] > info["collective_ms"], tokens


def test_auto_without_a_calibration_keeps_the_collective_path():
    path, info = choose_path(_spec("all_gather_gemm", 8192), "auto", None, None, None)
    assert path == "collective" and info["source"] == "model"
    assert "no calibration of this machine" in info["why"]


def test_auto_keeps_the_plan_where_the_group_cannot_run_the_collective(monkeypatch):
    gloo = "the group's backend is 'gloo'"
    path, info = choose_path(_spec("gemm_reduce_scatter", 64), "auto", None, gloo)
    assert path == "overlap" and info["source"] == "model"
    assert info["collective_unavailable"] == "the group's backend is 'gloo'"
    path, _ = choose_path(_spec("gemm_reduce_scatter", 8192), "auto", None, gloo)
    assert path == "overlap"


def test_create_entry_decides_the_path_once_with_nothing_measured(monkeypatch):
    """An "auto" entry leaves EntryCache.create with its path and the reason: the op never runs
    a path choice at a later call (every later call runs the entry's state)."""
    monkeypatch.setattr(entries, "collective_unavailable", lambda group: None)  # a NCCL group

    class OneRank:
        rank, tp, group, device = 0, 1, None, torch.device("cpu")  # off CUDA: no constants

        def all_gather(self, obj, what):
            return [obj]

    a, w = _meta(64, 32), _meta(24, 32)
    key = entries.EntryKey("all_gather_gemm", "ag_rotate_a", None, Precision(torch.bfloat16),
                           (("a", (64, 32)),), 0.0, False, "auto")  # fmt: skip
    entry = entries.EntryCache(OneRank()).create(
        key, lambda: ops.make_spec("all_gather_gemm", "ag_rotate_a", 1, 0, None, a, w)
    )
    # no calibration: the collective path, no workspace either
    assert entry.path == "collective" and isinstance(entry.state, collective.CollectiveState)
    assert entry.choice["source"] == "model" and entry.choice["tile_n"] == 0
    assert "no calibration" in entry.choice["why"]


def test_auto_at_tp_4_and_8_prices_with_the_constants_predicted_from_tp_2():
    from distgemm.runtime import machine

    h200 = machine.load(machine.SHIPPED_DIR / "nvidia-h200-tp2-nvlink18.json")
    for tp in (4, 8):
        mc = machine.find(machine.MachineKey(h200.key.gpu, tp, h200.key.topology), [h200])
        assert mc.key.tp == tp and mc.meta["predicted_from_tp"] == [2]
        path, info = choose_path(_spec("all_gather_gemm", 8192, tp=tp), "auto", None, None, mc)
        assert path == "overlap" and info["source"] == "model", info
        assert f"tp{tp}" in info["why"]


def test_finish_waits_on_work_and_accepts_none():
    """A blocking collective of a CUDA group returns no work object; others return one."""
    from distgemm.runtime.paths.collective import _finish

    class Work:
        waited = False

        def wait(self):
            Work.waited = True

    _finish(None)
    _finish(Work())
    assert Work.waited


def _spec_of(op, tp, m, n, k, steps=None):
    """make_spec of global m x n x k on ``tp`` ranks (meta tensors: shapes only)."""
    schedule = "ag_rotate_a" if op == "all_gather_gemm" else "rs_tile_a"
    a, w = (
        (_meta(m // tp, k), _meta(n // tp, k))
        if op == "all_gather_gemm"
        else (_meta(m, k // tp), _meta(n, k // tp))
    )
    return ops.make_spec(op, schedule, tp, 0, steps, a, w)


def test_auto_takes_the_s_the_model_prices_fastest_at_tp_2_3_4_and_8():
    """steps=None under constants: the S among TP and 2 TP with the lower predicted overlapped
    time where it beats the defaults' S by the model's margin, else the defaults' S; the
    predictions reported; the same answer from the same shapes (every rank agrees)."""
    from distgemm.runtime import cost_model, machine
    from distgemm.runtime.choose import MODEL_STEPS_PER_RANK, choose_steps

    h200 = machine.load(machine.SHIPPED_DIR / "nvidia-h200-tp2-nvlink18.json")
    chosen_steps, kept = set(), set()
    for tp in (2, 3, 4, 8):
        mc = machine.find(machine.MachineKey(h200.key.gpu, tp, h200.key.topology), [h200])
        for op, (m, n, k) in (
            ("gemm_reduce_scatter", (8192 * 3, 8192 * 3, 3072 * 8)),
            ("gemm_reduce_scatter", (768 * 8, 8192 * 3, 3072 * 8)),
            ("all_gather_gemm", (4096 * 3, 3072 * 8, 8192)),
        ):
            spec = _spec_of(op, tp, m, n, k)
            chosen, report, pred = choose_steps(spec, None, torch.bfloat16, mc)
            assert pred == cost_model.predict(mc, chosen.plan)  # what choose_path then takes
            priced = report["steps_ms"]
            assert sorted(priced) == [per * tp for per in MODEL_STEPS_PER_RANK], (tp, op)
            for steps, ms in priced.items():
                plan = _spec_of(op, tp, m, n, k, steps).plan
                assert ms == pytest.approx(cost_model.predict(mc, plan)["overlap_ms"])
            fastest = min(priced, key=lambda s: (priced[s], s))
            gain = priced[spec.steps] - priced[fastest]
            if gain >= cost_model.margin_ms(mc, priced[spec.steps]):
                assert chosen.steps == fastest
            else:  # within the model's error: the defaults' S stays
                assert chosen is spec
            assert chosen.plan.steps == chosen.steps and chosen.shapes == spec.shapes
            again, _, _ = choose_steps(_spec_of(op, tp, m, n, k), None, torch.bfloat16, mc)
            assert again.steps == chosen.steps
            kept.add(chosen is spec)
            chosen_steps.add(chosen.steps // tp)
    assert chosen_steps == {1, 2} and kept == {True, False}  # the shapes above take every case


def test_the_s_stays_where_the_call_table_or_dtype_decides_it():
    from distgemm.runtime import machine
    from distgemm.runtime.choose import choose_steps

    h200 = machine.load(machine.SHIPPED_DIR / "nvidia-h200-tp2-nvlink18.json")
    spec = _spec("gemm_reduce_scatter", 8192)
    for requested, dtype, mc in (
        (2, torch.bfloat16, h200),  # the call's S
        (None, torch.float8_e4m3fn, h200),  # fp8: the constants are bf16's
        (None, torch.bfloat16, None),  # no constants: the defaults' S
    ):
        assert choose_steps(spec, requested, dtype, mc) == (spec, {}, None)


def test_a_step_count_the_plan_refuses_is_not_offered(monkeypatch):
    """Where the plan of the S the model prices fastest is refused (build_plan's ValueError),
    the spec's own S stays and the refused S leaves the report."""
    from distgemm import _core
    from distgemm.runtime import choose, cost_model, machine
    from distgemm.runtime import spec as spec_module
    from distgemm.runtime.choose import choose_steps

    h200 = machine.load(machine.SHIPPED_DIR / "nvidia-h200-tp2-nvlink18.json")
    spec = _spec_of("gemm_reduce_scatter", 2, 8192, 8192, 8192)
    assert spec.steps == 4  # the defaults' S = 2 TP here
    build = _core.build_plan

    def refuse_two(schedule, tp, steps, *rest, **options):
        if steps == 2:
            raise ValueError("S=2 refused")
        return build(schedule, tp, steps, *rest, **options)

    monkeypatch.setattr(spec_module._core, "build_plan", refuse_two)
    price = choose.predict_steps

    def two_fastest(mc, d, tp, steps, *rest):
        pred = price(mc, d, tp, steps, *rest)
        return dict(pred, overlap_ms=0.0) if steps == 2 else pred

    monkeypatch.setattr(choose, "predict_steps", two_fastest)
    chosen, report, pred = choose_steps(spec, None, torch.bfloat16, h200)
    assert list(report["steps_ms"]) == [4] and chosen is spec
    assert pred == cost_model.predict(h200, spec.plan)
    assert spec_module.with_steps(spec, 2) is None


def test_a_gemm_all_reduce_the_decode_model_decides_prices_no_s():
    """At the token counts the machine's decode constants cover, gemm_all_reduce's path is the
    decode model's (fused or collective, no overlapped plan): no S is priced; above them, and
    where the group cannot run the collective path, the S is priced as for any op."""
    from distgemm.runtime import machine
    from distgemm.runtime.choose import choose_steps

    h100 = machine.load(machine.SHIPPED_DIR / "nvidia-h100-80gb-hbm3-tp4-nvlink18.json")
    assert h100.reduce is not None

    def spec_at(tokens):
        return ops.make_spec(
            "gemm_all_reduce", "ar_tile_a", 4, 0, None, _meta(tokens, 2048), _meta(8192, 2048)
        )

    small = spec_at(h100.reduce.max_tokens)
    assert choose_steps(small, None, torch.bfloat16, h100) == (small, {}, None)
    _, report, _ = choose_steps(small, None, torch.bfloat16, h100, "the group's backend is 'gloo'")
    assert sorted(report["steps_ms"]) == [4, 8]
    _, report, _ = choose_steps(spec_at(4096), None, torch.bfloat16, h100)
    assert sorted(report["steps_ms"]) == [4, 8]
