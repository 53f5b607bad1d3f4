"""The machine's kernel table without a GPU: the runtime's lookup (kernel/kernel_table.hpp through
_core.kernel_table_row: same dtype, N and K, the nearest M within 2x, ties to the larger M, never
for batches or an N-contiguous B), the table files (distgemm.runtime.kernel_table: validation
with the row and constraint named, the shipped file's name, DISTGEMM_KERNEL_TABLE's file, "off",
and a table of another GPU model refused), and the table kernel_vs_cublas --table writes from a
run's records (benchmarks/kernel/table.kernel_table: the fastest variant, the model's pick
within the margin, cuBLASLt ranks)."""

import json

import pytest

from benchmarks.kernel import kernel_vs_cublas as bench
from benchmarks.kernel import report as rep
from benchmarks.kernel import table as tab
from distgemm import _core
from distgemm.runtime import kernel_table as kt

ROWS = [
    dict(dtype="bf16", m=1024, n=4096, k=2048),
    dict(dtype="bf16", m=4096, n=4096, k=2048),
    dict(dtype="fp16", m=2048, n=4096, k=2048),
    dict(dtype="bf16", m=256, n=8192, k=2048),
]


@pytest.mark.parametrize(
    "m, row",
    [
        (1024, 0),
        (512, 0),  # 2x below: still served
        (511, None),  # beyond 2x: the model decides
        (1500, 0),
        (2048, 1),  # halfway in ratio between 1024 and 4096: the larger row
        (3000, 1),
        (8192, 1),
        (8193, None),
    ],
)
def test_lookup_nearest_m_in_ratio(m, row):
    assert _core.kernel_table_row(ROWS, "bf16", m, 4096, 2048) == row


def test_lookup_needs_same_dtype_n_k_and_a_plain_gemm():
    assert _core.kernel_table_row(ROWS, "fp16", 2048, 4096, 2048) == 2
    assert _core.kernel_table_row(ROWS, "float16", 4096, 4096, 2048) == 2  # torch's name
    assert _core.kernel_table_row(ROWS, "bf16", 1024, 4096, 4096) is None  # other K
    assert _core.kernel_table_row(ROWS, "bf16", 1024, 4104, 2048) is None  # other N
    assert _core.kernel_table_row(ROWS, "bf16", 256, 8192, 2048) == 3
    assert _core.kernel_table_row(ROWS, "bf16", 1024, 4096, 2048, l=2) is None  # batches
    assert _core.kernel_table_row(ROWS, "bf16", 1024, 4096, 2048, b_n_major=True) is None
    assert _core.kernel_table_row([], "bf16", 1024, 4096, 2048) is None
    assert _core.KERNEL_TABLE_MAX_M_RATIO == 2.0


def _table(rows, gpu="NVIDIA H100 80GB HBM3"):
    return dict(format=kt.FORMAT, version=kt.VERSION, gpu=gpu, measured={}, rows=rows)


def _write(tmp_path, data, name="t.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


GOOD = [
    dict(dtype="bf16", m=1024, n=4096, k=2048, kernel="cublaslt", algo=1),
    dict(dtype="bf16", m=4096, n=4096, k=2048, kernel="128x256"),
]


def test_load_validates_and_normalizes(tmp_path):
    t = kt.load(_write(tmp_path, _table(GOOD)))
    assert t["rows"] == [
        dict(dtype="bf16", m=1024, n=4096, k=2048, kernel="cublaslt", algo=1),
        dict(dtype="bf16", m=4096, n=4096, k=2048, kernel="128x256", algo=0),
    ]


@pytest.mark.parametrize(
    "row, words",
    [
        (dict(dtype="e5m2", m=1, n=1, k=1, kernel="128x256"), "dtype 'e5m2' is not one of"),
        (dict(dtype="bf16", m=0, n=1, k=1, kernel="128x256"), "m must be an integer >= 1"),
        (dict(dtype="bf16", m=1, n=1.5, k=1, kernel="128x256"), "n must be an integer >= 1"),
        (dict(dtype="bf16", m=1, n=1, k=True, kernel="128x256"), "k must be an integer >= 1"),
        (dict(dtype="bf16", m=1, n=1, k=1, kernel="64x64"), "kernel '64x64' is not one of"),
        (dict(dtype="bf16", m=1, n=1, k=1, kernel="cublaslt", algo=-1), "algo must be"),
    ],
)
def test_load_refuses_bad_rows_naming_the_row(tmp_path, row, words):
    with pytest.raises(ValueError, match="row 1") as e:
        kt.load(_write(tmp_path, _table([GOOD[0], row])))
    assert words in str(e.value)


@pytest.mark.parametrize(
    "data, words",
    [
        (dict(format="other", version=1, gpu="x", rows=[]), "not a distgemm-kernel-table file"),
        (dict(format=kt.FORMAT, version=2, gpu="x", rows=[]), "version 2, expected 1"),
        (dict(format=kt.FORMAT, version=1, gpu="", rows=[]), "'gpu' must name"),
        (dict(format=kt.FORMAT, version=1, gpu="x", rows={}), "'rows' must be a list"),
    ],
)
def test_load_refuses_bad_files(tmp_path, data, words):
    with pytest.raises(ValueError, match=words):
        kt.load(_write(tmp_path, data))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot be read"):
        kt.load(bad)


def test_table_for_env_shipped_and_off(tmp_path, monkeypatch):
    gpu = "NVIDIA H100 80GB HBM3"
    assert kt.shipped_path(gpu).name == "nvidia-h100-80gb-hbm3.json"
    monkeypatch.setenv(kt.TABLE_ENV, "off")
    assert kt.table_for(gpu) == (None, "DISTGEMM_KERNEL_TABLE=off")
    path = _write(tmp_path, _table(GOOD, gpu))
    monkeypatch.setenv(kt.TABLE_ENV, str(path))
    table, source = kt.table_for(gpu)
    assert source == str(path) and len(table["rows"]) == 2
    with pytest.raises(ValueError, match="was measured on 'NVIDIA H100 80GB HBM3', not on"):
        kt.table_for("NVIDIA H200")
    monkeypatch.delenv(kt.TABLE_ENV)
    table, source = kt.table_for("A GPU nobody measured")
    assert table is None and "no table shipped" in source


def test_every_shipped_table_loads_and_is_named_for_its_gpu():
    for path in sorted(kt.SHIPPED_DIR.glob("*.json")):
        t = kt.load(path)
        assert kt.shipped_path(t["gpu"]) == path
        assert t["rows"], f"{path.name} has no rows"


def _rec(m, ms, model="128x256", status="ok"):
    return dict(
        m=m, n=4096, k=2048, local=True, status=status, model_config=model,
        configs=[v for v in ms if v != "torch"], ms=ms, err={},
    )  # fmt: skip


def test_report_kernel_table_keeps_the_model_within_the_margin():
    records = [
        # cuBLASLt rank 1 beats the model's pick by 5%: it is the row's kernel
        _rec(1024, {"torch": 1.0, "128x256": 1.05, "cublaslt:0": 1.02, "cublaslt:1": 1.0}),
        # the fastest is within TABLE_MARGIN of the model's pick: the pick stays
        _rec(2048, {"torch": 2.0, "128x256": 2.0, "cublaslt:0": 1.99}),
        # another configuration wins clearly
        _rec(4096, {"torch": 4.0, "128x256": 4.4, "128x128": 4.0, "cublaslt:0": 4.2}),
        # not measured, or a variant missing: no row
        _rec(8192, {}, status="failed"),
        dict(_rec(16384, {"torch": 1.0, "128x256": 1.0}), configs=["128x256", "cublaslt:0"]),
    ]
    table = tab.kernel_table(records, dict(device="NVIDIA H100 80GB HBM3", date="d", torch="t"))
    assert [(r["m"], r["kernel"], r["algo"]) for r in table["rows"]] == [
        (1024, "cublaslt", 1),
        (2048, "128x256", 0),
        (4096, "128x128", 0),
    ]
    assert table["rows"][0]["ms"]["cublaslt:1"] == 1.0
    # what the benchmark writes is what the runtime loads
    assert kt.check_rows(table["rows"], "run")[0]["kernel"] == "cublaslt"
    assert table["gpu"] == "NVIDIA H100 80GB HBM3" and table["measured"]["margin"] == 0.01


def test_cublas_variant_names():
    assert rep.cublas_name(3) == "cublaslt:3"
    assert rep.cublas_rank("cublaslt:3") == 3
    assert rep.cublas_rank("128x256") is None and rep.cublas_rank("cublaslt:") is None
    assert rep.VARIANTS[: len(rep.CONFIGS)] == rep.CONFIGS
    assert len(rep.CUBLAS_VARIANTS) == rep.MAX_CUBLAS_ALGOS


def test_cli_refuses_too_many_cublas_algos(capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(["--cublas-algos", str(rep.MAX_CUBLAS_ALGOS + 1)])
    assert e.value.code == 2
    assert "--cublas-algos must be 0..4" in capsys.readouterr().err


def test_merge_tables_of_one_gpu(tmp_path, capsys):
    a = _table([GOOD[0]])
    b = _table([GOOD[1], dict(GOOD[0], algo=3)])  # the first table's row of a shape stays
    a["measured"] = dict(date="d1", args="--tp 2", margin=0.01)
    b["measured"] = dict(date="d2", args="--scales tensor", margin=0.01)
    paths = [_write(tmp_path, a, "a.json"), _write(tmp_path, b, "b.json")]
    out = tmp_path / "merged.json"
    assert bench.main(["--merge", *map(str, paths), "--table", str(out)]) == 0
    assert "(1 row(s) of shapes already in an earlier table left out)" in capsys.readouterr().out
    merged = kt.load(out)
    assert [(r["m"], r["kernel"], r["algo"]) for r in merged["rows"]] == [
        (1024, "cublaslt", 1),
        (4096, "128x256", 0),
    ]
    assert merged["measured"]["parts"] == 2
    assert merged["measured"]["args"] == "--tp 2"  # the first run's provenance, the other's kept
    assert merged["measured"]["merged"] == [dict(date="d2", args="--scales tensor")]
    # merging again keeps the provenance merged in before (a shipped table's fp8 rows)
    c = _table([dict(GOOD[0], m=2048)])
    c["measured"] = dict(date="d3", args="--scales row", margin=0.01)
    again = tmp_path / "again.json"
    assert (
        bench.main(
            ["--merge", str(out), str(_write(tmp_path, c, "c3.json")), "--table", str(again)]
        )
        == 0
    )
    assert kt.load(again)["measured"]["merged"] == [
        dict(date="d2", args="--scales tensor"),
        dict(date="d3", args="--scales row"),
    ]
    assert len(kt.load(again)["rows"]) == 3
    other = _write(tmp_path, _table(GOOD, gpu="NVIDIA H200"), "c.json")
    assert bench.main(["--merge", str(paths[0]), str(other), "--table", str(out)]) == 2
    assert bench.main(["--merge", str(paths[0])]) == 2


def test_install_without_the_cuda_runtime_or_on_a_cpu_device_does_nothing():
    import torch

    assert kt.install(torch.device("cpu")) == {}
    if not getattr(_core, "cuda_runtime", False) or not torch.cuda.is_available():
        # Also a _core built with the CUDA runtime under a torch without CUDA (CI's machine).
        assert kt.install(torch.device("cuda", 0)) == {}
        assert kt.installed() == {}


@pytest.mark.parametrize(
    "env,read,values,bad",
    [
        (kt.PLANS_ENV, kt.plans_scope, ("all", "one-rank"), "every"),
        (kt.ROW_BUCKETS_ENV, kt.row_buckets, ("off", "on"), "1"),
    ],
)
def test_switches_default_to_their_first_value_and_refuse_others(monkeypatch, env, read, values,
                                                                  bad):  # fmt: skip
    monkeypatch.delenv(env, raising=False)
    assert read() == values[0]
    monkeypatch.setenv(env, values[1])
    assert read() == values[1]
    monkeypatch.setenv(env, bad)
    with pytest.raises(ValueError, match=f"{env}='{bad}' is not one of"):
        read()


def test_the_runtimes_row_bucket_switch():
    if not hasattr(_core, "set_cublaslt_row_buckets"):
        pytest.skip("_core was built without the CUDA runtime, which holds the switch")
    assert _core.cublaslt_row_buckets() is False  # the default
    try:
        _core.set_cublaslt_row_buckets(True)
        assert _core.cublaslt_row_buckets() is True
    finally:
        _core.set_cublaslt_row_buckets(False)


FP8 = dict(dtype="e4m3", n=4096, k=2048, scale_a_rows=True, scale_b_rows=True, fast_accum=False)


def test_fp8_rows_match_scale_kinds_and_accumulation():
    rows = [
        dict(FP8, m=1024),
        dict(FP8, m=1024, fast_accum=True),
        dict(FP8, m=1024, scale_b_rows=False),
    ]
    kw = dict(scale_a_rows=True, scale_b_rows=True)
    assert _core.kernel_table_row(rows, "e4m3", 1024, 4096, 2048, **kw) == 0
    assert _core.kernel_table_row(rows, "e4m3", 1024, 4096, 2048, fast_accum=True, **kw) == 1
    assert _core.kernel_table_row(rows, "e4m3", 600, 4096, 2048, scale_a_rows=True) == 2
    # tensor-wise scales on both sides: no row measured them
    assert _core.kernel_table_row(rows, "e4m3", 1024, 4096, 2048) is None
    assert _core.kernel_table_row(rows, "bf16", 1024, 4096, 2048) is None


def test_fp8_rows_validate_their_flags_and_kernel(tmp_path):
    good = [
        dict(FP8, m=1024, kernel="cublaslt", algo=0),
        dict(FP8, m=2048, kernel="e4m3_128x192"),
        dict(FP8, m=2048, fast_accum=True, kernel="e4m3_128x256fa"),
    ]
    rows = kt.load(_write(tmp_path, _table(good)))["rows"]
    assert [(r["kernel"], r["fast_accum"], r["scale_a_rows"]) for r in rows] == [
        ("cublaslt", False, True),
        ("e4m3_128x192", False, True),
        ("e4m3_128x256fa", True, True),
    ]
    for bad, words in [
        (dict(FP8, m=1, kernel="e4m3_128x256fa"), "distgemm's fp8 kernel of that accumulation"),
        (dict(FP8, m=1, kernel="128x256"), "is not one of"),
        (dict(FP8, m=1, kernel="cublaslt", fast_accum=1), "fast_accum must be true or false"),
    ]:
        with pytest.raises(ValueError, match=words):
            kt.load(_write(tmp_path, _table([bad]), "bad.json"))
    # a 16-bit row cannot name an fp8 kernel
    with pytest.raises(ValueError, match="is not one of"):
        kt.load(_write(tmp_path, _table([dict(GOOD[1], kernel="e4m3_128x192")]), "bad2.json"))


def test_fp8_benchmark_writes_table_rows():
    from benchmarks.fp8 import fp8_kernel_vs_scaled_mm as fp8

    recs = [
        # cuBLASLt 5% faster accurate; within the margin with fast accumulation
        dict(m=1024, n=4096, k=2048, status="ok", ms={"ours_fp8": 1.05, "cublaslt_fp8": 1.0,
             "ours_fp8_fast": 1.0, "cublaslt_fp8_fast": 0.995}),
        # cuBLASLt had no algorithm: no row
        dict(m=2048, n=4096, k=2048, status="ok", ms={"ours_fp8": 1.0, "ours_fp8_fast": 0.9}),
        dict(m=4096, n=4096, k=2048, status="failed", ms={}),
    ]  # fmt: skip
    rows = fp8.kernel_table_rows(recs, rowwise=True)
    assert [(r["m"], r["fast_accum"], r["kernel"]) for r in rows] == [
        (1024, False, "cublaslt"),
        (1024, True, "e4m3_128x256fa"),
    ]
    assert all(r["scale_a_rows"] and r["scale_b_rows"] for r in rows)
    assert kt.check_rows(rows, "fp8 run")[0]["kernel"] == "cublaslt"


def test_fp8_benchmark_table_needs_cublas(capsys):
    from benchmarks.fp8 import fp8_kernel_vs_scaled_mm as fp8

    with pytest.raises(SystemExit) as e:
        fp8.parse_args(["--table", "x.json"])
    assert e.value.code == 2 and "--table needs --cublas" in capsys.readouterr().err


def test_merge_keeps_fp8_rows_of_each_accumulation(tmp_path):
    rows = [
        dict(FP8, m=1024, kernel="cublaslt"),
        dict(FP8, m=1024, fast_accum=True, kernel="cublaslt"),
    ]
    merged = tab.merge_tables([kt.load(_write(tmp_path, _table(rows)))])
    assert [r["fast_accum"] for r in merged["rows"]] == [False, True]


@pytest.mark.skipif(
    not getattr(_core, "cuda_runtime", False),
    reason="set_kernel_table is part of the CUDA runtime, which this build of _core lacks",
)
def test_set_kernel_table_holds_rows_and_scope_until_replaced():
    before = _core.kernel_table_all_plans()
    try:
        _core.set_kernel_table(GOOD, all_plans=True)
        assert _core.kernel_table_size() == 2 and _core.kernel_table_all_plans()
        _core.set_kernel_table(GOOD[:1])
        assert _core.kernel_table_size() == 1 and not _core.kernel_table_all_plans()
    finally:
        _core.set_kernel_table([], all_plans=before)
    assert _core.kernel_table_size() == 0


def test_fp8_benchmark_variants_skip_limit_and_table_rules(capsys):
    from benchmarks.fp8 import fp8_kernel_vs_scaled_mm as fp8

    args = fp8.parse_args(["--cublas", "--variants", "ours_fp8,cublaslt_fp8"])
    assert fp8.timed_variants(args) == ("scaled_mm", "ours_fp8", "cublaslt_fp8")
    assert fp8.timed_variants(fp8.parse_args([])) == fp8.VARIANTS
    assert fp8.timed_variants(fp8.parse_args(["--cublas"])) == fp8.ALL_VARIANTS
    # the shapes of one part: --skip and --limit cut the same list
    every = fp8.select(fp8.parse_args(["--tp", "2,4"]))
    part = fp8.select(fp8.parse_args(["--tp", "2,4", "--skip", "3", "--limit", "4"]))
    assert [(s.m, s.n, s.k) for s in part] == [(s.m, s.n, s.k) for s in every[3:7]]
    assert fp8.shape_seconds(3) < fp8.shape_seconds(len(fp8.ALL_VARIANTS))
    for argv, words in (
        (["--variants", "cublaslt_fp8_fast"], "--variants cublaslt_fp8_fast needs --cublas"),
        (["--cublas", "--table", "t.json"], "--table needs --kernel-table off"),
        (["--skip", "-1"], "--skip must be >= 0"),
        (["--variants", "ours_fp9"], "ours_fp9"),
    ):
        with pytest.raises(SystemExit) as e:
            fp8.parse_args(argv)
        assert e.value.code == 2 and words in capsys.readouterr().err, argv


def test_fp8_benchmark_reports_a_subset_of_variants():
    from benchmarks.fp8 import fp8_kernel_vs_scaled_mm as fp8

    src = dict(model="70B", layer="O", tokens=4096, tp=4)
    rec = dict(m=4096, n=8192, k=2048, status="ok", sources=[src], reason=None,
               ms={"scaled_mm": 0.10, "ours_fp8": 0.08}, err={"ours_fp8": 3e-3})  # fmt: skip
    assert fp8.ratios(rec) == {"fp8_over_scaled_mm": pytest.approx(1.25)}
    line = fp8.table([rec]).splitlines()[2]
    assert "| 0.1000 | 0.0800 | - | - | 1.250x | - | - | 3.00e-03 | - |" in line


def test_lookup_falls_back_to_the_dtypes_default():
    rows = ROWS + [dict(dtype="bf16", any_shape=True), dict(dtype="e4m3", any_shape=True)]
    assert _core.kernel_table_row(rows, "bf16", 1024, 4096, 2048) == 0  # a near row first
    assert _core.kernel_table_row(rows, "bf16", 511, 4096, 2048) == 4  # none near: the default
    assert _core.kernel_table_row(rows, "bf16", 64, 12288, 512) == 4  # another N and K
    assert _core.kernel_table_row(rows, "fp16", 64, 12288, 512) is None  # fp16 has no default
    assert _core.kernel_table_row(rows, "bf16", 64, 12288, 512, l=2) is None  # batches: none
    assert _core.kernel_table_row(rows, "bf16", 64, 12288, 512, b_n_major=True) is None
    # an fp8 default serves its own scale kinds and accumulation only
    assert _core.kernel_table_row(rows, "e4m3", 64, 4096, 512) == 5
    assert _core.kernel_table_row(rows, "e4m3", 64, 4096, 512, fast_accum=True) is None


def _timed_row(m, model_ms, lt0_ms, lt1_ms=None):
    ms = {"torch": 1.0, "128x256": model_ms, "cublaslt:0": lt0_ms}
    if lt1_ms is not None:
        ms["cublaslt:1"] = lt1_ms
    return dict(dtype="bf16", m=m, n=4096, k=2048, kernel="128x256", algo=0, model="128x256", ms=ms)


def test_table_default_is_the_cublas_rank_that_beats_the_model_at_the_median():
    rows = [_timed_row(1024, 1.0, 0.90, 0.97), _timed_row(2048, 1.0, 0.95, 0.93),
            _timed_row(4096, 1.0, 1.04, 0.99)]  # fmt: skip
    (default,) = tab.table_defaults(rows)
    assert (default["dtype"], default["kernel"], default["algo"]) == ("bf16", "cublaslt", 0)
    m = default["measured"]
    assert m["shapes"] == 3 and m["median_over_model"] == {"cublaslt:0": 0.95, "cublaslt:1": 0.97}
    assert m["worst_over_model"] == pytest.approx(1.04)
    # within the margin at the median: the model keeps the shapes no row serves
    assert tab.table_defaults([_timed_row(1024, 1.0, 0.995), _timed_row(2048, 1.0, 0.99)]) == []
    # rows stored without their times (or fp8 rows) take no part
    assert tab.table_defaults([dict(GOOD[0])]) == []
    # what table.kernel_table writes carries it, and the runtime loads it
    records = [_rec(m, {"torch": 1.0, "128x256": 1.1, "cublaslt:0": 1.0}) for m in (1024, 4096)]
    doc = tab.kernel_table(records, dict(device="NVIDIA H100 80GB HBM3"))
    assert [d["algo"] for d in doc["defaults"]] == [0]
    assert all(r["model"] == "128x256" for r in doc["rows"])


def test_defaults_load_validate_and_reach_the_runtime_rows(tmp_path):
    good = dict(dtype="bf16", kernel="cublaslt", algo=0, measured={"shapes": 3})
    table = kt.load(_write(tmp_path, dict(_table(GOOD), defaults=[good])))
    assert table["defaults"] == [good]
    rows = kt.runtime_rows(table)
    assert rows[-1] == dict(dtype="bf16", kernel="cublaslt", algo=0, any_shape=True)
    assert len(rows) == len(GOOD) + 1
    assert kt.load(_write(tmp_path, _table(GOOD), "plain.json"))["defaults"] == []
    for defaults, words in (
        ({"dtype": "bf16"}, "'defaults' must be a list"),
        ([dict(good, dtype="e4m3")], "dtype 'e4m3' is not bf16 or fp16"),
        ([good, good], "a second default for bf16"),
        ([dict(good, kernel="64x64")], "kernel '64x64' is not one of"),
    ):
        path = _write(tmp_path, dict(_table(GOOD), defaults=defaults), "bad.json")
        with pytest.raises(ValueError, match=words):
            kt.load(path)


def test_merge_recomputes_the_default_from_every_part(tmp_path):
    a = _table([_timed_row(1024, 1.0, 0.90)])
    b = _table([_timed_row(2048, 1.0, 1.05), _timed_row(4096, 1.0, 1.04)])
    paths = [_write(tmp_path, a, "a.json"), _write(tmp_path, b, "b.json")]
    out = tmp_path / "merged.json"
    assert bench.main(["--merge", *map(str, paths), "--table", str(out)]) == 0
    assert kt.load(out)["defaults"] == []  # median 1.04: the model keeps unmeasured shapes


def test_the_shipped_h100_table_defaults_to_cublaslt_rank_0():
    table = kt.load(kt.shipped_path("NVIDIA H100 80GB HBM3"))
    assert [(d["dtype"], d["kernel"], d["algo"]) for d in table["defaults"]] == [
        ("bf16", "cublaslt", 0)
    ]
    assert tab.table_defaults(table["rows"]) == table["defaults"]  # it is the rows' own verdict


def test_plan_kernel_answers_what_the_table_runs_for_a_plans_step():
    """Under a table for every plan: cuBLASLt where the row near the shape (or the dtype's
    default) is cuBLASLt's, distgemm where the row names a configuration, where the dtype has
    no default and no row, and where no table is installed; priced_as restores what was
    there."""
    rows = [
        dict(dtype="bf16", m=1024, n=2560, k=8192, kernel="cublaslt", algo=1),
        dict(dtype="bf16", m=2048, n=3072, k=4096, kernel="256x192"),
    ]
    table = dict(_table(rows, gpu="NVIDIA H200"))
    table["defaults"] = [dict(dtype="bf16", kernel="cublaslt", algo=0)]
    assert kt.plan_kernel("bf16", 1024, 2560, 8192) == kt.DISTGEMM  # nothing installed here
    with kt.priced_as(table):
        assert kt.plan_kernel("bf16", 512, 2560, 8192) == kt.CUBLASLT  # the row, 2x below
        assert kt.plan_kernel("bf16", 2048, 3072, 4096) == kt.DISTGEMM  # a configuration's row
        assert kt.plan_kernel("bf16", 64, 1280, 8192) == kt.CUBLASLT  # no row: the default
        assert kt.plan_kernel("fp16", 1024, 2560, 8192) == kt.DISTGEMM  # no fp16 row or default
        with kt.priced_as(None):
            assert kt.plan_kernel("bf16", 1024, 2560, 8192) == kt.DISTGEMM
        assert kt.plan_kernel("bf16", 1024, 2560, 8192) == kt.CUBLASLT
    assert kt.plan_kernel("bf16", 1024, 2560, 8192) == kt.DISTGEMM
