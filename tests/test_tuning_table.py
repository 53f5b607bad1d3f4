"""CPU checks of distgemm.runtime.tuning_table, the tuning table: its format and validation (every
field named with its value), token buckets and lookup, the digest, loading from the environment,
and how make_spec takes a table entry's S and tile (and falls back to the defaults, warning once,
where an entry does not fit the call)."""

import json
import warnings

import pytest

torch = pytest.importorskip("torch")

from distgemm import _core, llama3, ops  # noqa: E402
from distgemm.runtime import entry_cache, tuning_table  # noqa: E402
from distgemm.runtime.choose import choose_path  # noqa: E402


def _raw(**kw):
    e = {
        "op": "all_gather_gemm",
        "schedule": "ag_rotate_a",
        "tp": 2,
        "dtype": "bf16",
        "n": 10240,
        "k": 8192,
        "tokens": 4096,
        "path": "overlap",
        "steps": 4,
        "tile_n": 128,
        "ms": {"collective": 0.65, "overlap/S2/n256": 0.56, "overlap/S4/n128": 0.55},
    }
    e.update(kw)
    return e


def _doc(*entries_, **kw):
    d = {"format": "distgemm-tuning-table", "version": 1, "meta": {"device": "x"}}
    d["entries"] = list(entries_)
    d.update(kw)
    return d


@pytest.fixture(autouse=True)
def no_active_table(monkeypatch):
    """Every test starts and ends without a table (and without the environment's)."""
    monkeypatch.delenv(tuning_table.TABLE_ENV, raising=False)
    tuning_table.load_tuning_table(None)
    yield
    tuning_table.load_tuning_table(None)


@pytest.mark.parametrize(
    "tokens,bucket",
    [(1, 1), (2, 2), (3, 2), (255, 128), (256, 256), (1024, 1024), (3000, 2048), (6144, 4096)],
)
def test_a_call_takes_the_power_of_two_bucket_at_or_below_its_tokens(tokens, bucket):
    assert tuning_table.token_bucket(tokens) == bucket
    assert bucket <= tokens < 2 * bucket


def test_lookup_finds_the_bucket_holding_m_and_nothing_else():
    table = tuning_table.TuningTable.from_dict(_doc(_raw(), _raw(tokens=1024, path="collective")))
    key = ("all_gather_gemm", "ag_rotate_a", 2, "bf16", 10240, 8192)
    for m in (4096, 5000, 8191):
        assert table.lookup(*key, m).tokens == 4096
    for m in (1024, 2047):
        assert table.lookup(*key, m).path == "collective"
    for m in (2048, 4095, 8192, 512):
        assert table.lookup(*key, m) is None
    assert table.lookup("all_gather_gemm", "ag_rotate_a", 4, "bf16", 10240, 8192, 4096) is None
    assert table.lookup("all_gather_gemm", "ag_rotate_a", 2, "fp16", 10240, 8192, 4096) is None


def test_a_table_round_trips_through_its_file_and_keeps_its_digest(tmp_path):
    table = tuning_table.TuningTable.from_dict(_doc(_raw(), _raw(tokens=1024, steps=2, tile_n=0)))
    path = tmp_path / "t.json"
    table.save(path)
    again = tuning_table.TuningTable.load(path)
    assert again.digest == table.digest and again.entries == table.entries
    assert again.lookup("all_gather_gemm", "ag_rotate_a", 2, "bf16", 10240, 8192, 4096).ms == {
        "collective": 0.65,
        "overlap/S2/n256": 0.56,
        "overlap/S4/n128": 0.55,
    }
    # The digest covers the decisions, not the metadata or the measured ms.
    other_meta = tuning_table.TuningTable.from_dict(
        _doc(_raw(ms={}), _raw(tokens=1024, steps=2, tile_n=0), meta={})
    )
    assert other_meta.digest == table.digest
    other_choice = tuning_table.TuningTable.from_dict(
        _doc(_raw(steps=2), _raw(tokens=1024, steps=2, tile_n=0))
    )
    assert other_choice.digest != table.digest


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(op="gemm"), "entries[0]: op='gemm' is not one of 'all_gather_gemm', "),
        (
            dict(schedule="rs_tile_a"),
            "entries[0]: schedule='rs_tile_a' is not a all_gather schedule",
        ),
        (dict(tp=0), "entries[0]: tp=0 is not an integer >= 1"),
        (dict(tp=16, steps=16), "entries[0]: tp=16 is more than 8"),
        (dict(tp=2.0), "entries[0]: tp=2.0 is not an integer >= 1"),
        (dict(dtype="fp32"), "entries[0]: dtype='fp32' is not one of 'bf16', 'fp16'"),
        (dict(n=-5), "entries[0]: n=-5 is not an integer >= 1"),
        (dict(k="8192"), "entries[0]: k='8192' is not an integer >= 1"),
        (dict(tokens=3000), "entries[0]: tokens=3000 is not a power of two"),
        (dict(path="fast"), "entries[0]: path='fast' is not one of 'overlap', 'collective'"),
        (dict(steps=3), "entries[0]: steps=3 is not a multiple of tp=2"),
        (dict(steps=True), "entries[0]: steps=True is not an integer >= 1"),
        (dict(tile_n=64), "entries[0]: tile_n=64 is not one of 0, 128, 256"),
        (
            dict(ms={"collective": -1.0}),
            "entries[0]: ms['collective']=-1.0 is not a positive number",
        ),
        (
            dict(ms={"collective": float("nan")}),
            "entries[0]: ms['collective']=nan is not a positive",
        ),
        (dict(ms=[1.0]), "entries[0]: ms must be an object of candidate -> ms"),
        (dict(speed=3), "entries[0]: unknown field 'speed'"),
    ],
)
def test_validation_names_the_field_and_the_value(change, message):
    with pytest.raises(ValueError) as e:
        tuning_table.TuningTable.from_dict(_doc(_raw(**change)), "tuning table t.json")
    assert str(e.value).startswith("tuning table t.json: ")
    assert message in str(e.value)


def test_validation_of_the_file_itself(tmp_path):
    for doc, message in [
        (_doc(_raw(), format="other"), "format='other' is not 'distgemm-tuning-table'"),
        (_doc(_raw(), version=2), "version=2 is not 1"),
        (_doc(entries=None), "entries=None is not a list"),
        ([], "a tuning table is a JSON object, got list"),
        (_doc(_raw(), _raw(path="collective")), "entries[1] repeats the bucket of all_gather_gemm"),
        (_doc({k: v for k, v in _raw().items() if k != "tile_n"}), "the field 'tile_n' is missing"),
    ]:
        with pytest.raises(ValueError, match=".*") as e:
            tuning_table.TuningTable.from_dict(doc)
        assert message in str(e.value)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=rf"tuning table {bad}: not JSON"):
        tuning_table.load_tuning_table(bad)
    with pytest.raises(ValueError, match=r"tuning table .*missing.json: cannot be read"):
        tuning_table.load_tuning_table(tmp_path / "missing.json")


def test_the_environment_names_the_table_the_first_lookup_reads(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_doc(_raw())))
    monkeypatch.setenv(tuning_table.TABLE_ENV, str(path))
    monkeypatch.setattr(tuning_table, "_active", None)  # as in a fresh process
    table = tuning_table.active_table()
    assert table is not None and table.source == f"tuning table {path}"
    assert tuning_table.active_digest() == table.digest
    assert tuning_table.load_tuning_table(None) is None and tuning_table.active_digest() is None


def _qkv(tokens, tp=2, steps=None, dtype=torch.bfloat16):
    m, n, k = llama3.gemm("70B", "QKV", tokens)
    a = torch.empty(m // tp, k, device="meta", dtype=dtype)
    w = torch.empty(n // tp, k, device="meta", dtype=dtype)
    return ops.make_spec("all_gather_gemm", "ag_rotate_a", tp, 0, steps, a, w)


def test_make_spec_takes_the_tables_steps_and_tile_and_the_path_follows_the_table(
    tmp_path, monkeypatch
):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_doc(_raw(path="collective"))))
    assert _qkv(4096).steps == 2 and _qkv(4096).tile_n == 0  # no table: the default S
    table = tuning_table.load_tuning_table(path)
    spec = _qkv(5000 // 2 * 2)  # in the 4096 bucket
    bucket = table.lookup("all_gather_gemm", "ag_rotate_a", 2, "bf16", 10240, 8192, 4096)
    assert (spec.steps, spec.tile_n, spec.table) == (4, 128, bucket)
    assert spec.plan.steps == 4
    chosen, info = choose_path(spec, "auto", None, None)
    assert chosen == "collective" and info["source"] == "table"
    assert (info["overlap_ms"], info["collective_ms"]) == (0.55, 0.65)
    assert _qkv(4096, steps=2).tile_n == 0 and _qkv(4096, steps=2).table is None  # S given
    assert _qkv(2048).table is None and _qkv(4096, dtype=torch.float16).table is None
    sig = entry_cache.signature(
        entry_cache.EntryKey(
            "all_gather_gemm", "ag_rotate_a", None, "bf16", (), 0.0, False, "auto"
        ),
        None,
    )
    assert sig["tuning_table"] == table.digest


def test_an_entry_that_does_not_fit_the_call_falls_back_to_the_defaults_warning_once(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_doc(_raw(steps=256))))  # beyond the plans' S <= MAX_STEPS
    tuning_table.load_tuning_table(path)
    with pytest.warns(RuntimeWarning) as record:
        spec = _qkv(4100)
        again = _qkv(4104)  # the same entry: no second warning
    assert len(record) == 1
    assert "does not fit M=4100: S=256 is out of range" in str(record[0].message)
    assert "the cost model decides for this bucket instead" in str(record[0].message)
    assert (spec.steps, spec.tile_n, spec.table) == (2, 0, None)
    assert (again.steps, again.table) == (2, None)
    chosen, info = choose_path(spec, "auto", None, None)
    assert info["source"] == "model"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tuning_table.load_tuning_table(path)  # a new table warns afresh
        with pytest.raises(RuntimeWarning):
            _qkv(4100)


def test_an_entry_applies_where_its_steps_do_not_divide_the_tokens(tmp_path):
    """Steps may be uneven: the table's S = 8 serves every token count of its bucket."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_doc(_raw(steps=8))))
    tuning_table.load_tuning_table(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = _qkv(4100)  # 4100 = 8 * 512 + 4
    assert (spec.steps, spec.tile_n) == (8, 128) and spec.table is not None


def test_make_spec_forces_a_tile_and_refuses_others():
    a = torch.empty(64, 32, device="meta", dtype=torch.bfloat16)
    w = torch.empty(24, 32, device="meta", dtype=torch.bfloat16)
    spec = ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, a, w, tile_n=256)
    assert spec.tile_n == 256
    with pytest.raises(
        ValueError, match=r"all_gather_gemm: tile_n=96 is not 0 \(per GEMM\), 128 or 256"
    ):
        ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, a, w, tile_n=96)


def test_graph_setup_carries_the_tile_to_the_graph():
    assert _core.GraphSetup(0, 0, "bf16", [1], 0, 5.0).tile_n == 0
    assert _core.GraphSetup(0, 0, "bf16", [1], 0, 5.0, tile_n=128).tile_n == 128
    with pytest.raises(ValueError, match=r"tile_n=64 is not 0 \(auto\), 128 or 256"):
        _core.GraphSetup(0, 0, "bf16", [1], 0, 5.0, tile_n=64)


def test_default_plan_is_the_plan_of_default_steps():
    for schedule, tp, m, n, k in [
        ("rs_tile_a", 2, 8192, 8192, 8192),  # S = 2TP
        ("rs_tile_a", 2, 8192, 8192, 28672),  # long K: S = TP
        ("rs_tile_b", 4, 4096, 4096, 8192),
        ("ag_rotate_a", 2, 1024, 10240, 8192),
        ("ar_tile_a", 2, 64, 48, 32),
        ("ag_rotate_b", 1, 64, 48, 32),
    ]:
        plan = _core.default_plan(schedule, tp, m, n, k)
        steps = _core.default_steps(schedule, tp, m, n, k)
        assert plan.steps == steps
        assert plan.to_dict() == _core.build_plan(schedule, tp, steps, m, n, k).to_dict()
    with pytest.raises(ValueError, match="M=1023 is not divisible by TP=2"):
        _core.default_plan("ag_rotate_a", 2, 1023, 64, 32)


def test_a_broken_table_file_is_every_first_calls_error_and_the_exchange_still_runs(
    tmp_path, monkeypatch
):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_doc(_raw(path="fast"))))
    monkeypatch.setenv(tuning_table.TABLE_ENV, str(bad))
    monkeypatch.setattr(tuning_table, "_active", None)  # as in a fresh process
    with pytest.raises(ValueError, match=rf"tuning table {bad}: entries\[0\]: path='fast'"):
        _qkv(4096)
    key = entry_cache.EntryKey(
        "all_gather_gemm", "ag_rotate_a", None, "bf16", (), 0.0, False, "auto"
    )
    digest = entry_cache.signature(key, "ValueError: ...")["tuning_table"]
    assert digest.startswith(f"unreadable: tuning table {bad}: entries[0]: path='fast'")
