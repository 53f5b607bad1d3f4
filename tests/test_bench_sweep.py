"""The Llama-3 sweep shapes (python/distgemm/data/llama3.json) through distgemm.llama3, and
what `distgemm_bench` decides without calling into CUDA: `--sweep ... --dry-run`, which lists the
sweep's cases, and the refusals of bad arguments (exit code 2), the fp8 options' among them.
The binary is the installed distgemm/bin/distgemm_bench (or DISTGEMM_BENCH); its tests skip, with
the reason, where the package was built without the CUDA runtime."""

import os
import pathlib
import re
import subprocess

import pytest

import distgemm
from distgemm import _core, llama3

ROOT = pathlib.Path(__file__).resolve().parents[1]

MODELS = {  # Llama-3 / 3.1 config.json values, typed in by hand
    "8B": dict(hidden=4096, ffn=14336, q_heads=32, kv_heads=8, head_dim=128),
    "70B": dict(hidden=8192, ffn=28672, q_heads=64, kv_heads=8, head_dim=128),
    "405B": dict(hidden=16384, ffn=53248, q_heads=128, kv_heads=8, head_dim=128),
}
LAYERS = {
    "QKV": dict(collective="all_gather", schedule="ag_rotate_a"),
    "O": dict(collective="reduce_scatter", schedule="rs_tile_a"),
    "FC1": dict(collective="all_gather", schedule="ag_rotate_a"),
    "FC2": dict(collective="reduce_scatter", schedule="rs_tile_a"),
}


def test_models_layers_tokens():
    assert list(llama3.models().items()) == list(MODELS.items())
    assert llama3.models(quick=True) == {"70B": MODELS["70B"]}
    assert list(llama3.layers().items()) == list(LAYERS.items())
    assert llama3.tokens() == [1024, 2048, 4096, 8192, 16384]
    assert llama3.tokens(quick=True) == [4096, 8192]


def test_layer_schedules_do_their_collective():
    for layer, d in llama3.layers().items():
        assert _core.schedule_definition(d["schedule"])["collective"] == d["collective"], layer


@pytest.mark.parametrize(
    "model,layer,tokens,mnk",
    [
        ("70B", "FC1", 8192, (8192, 57344, 8192)),  # N = 2 * 28672 (gate and up)
        ("70B", "QKV", 1024, (1024, 10240, 8192)),  # N = (64 + 2*8) * 128
        ("70B", "FC2", 4096, (4096, 8192, 28672)),
        ("8B", "QKV", 2048, (2048, 6144, 4096)),  # N = (32 + 2*8) * 128
        ("8B", "O", 16384, (16384, 4096, 4096)),  # K = 32 * 128
        ("405B", "O", 1024, (1024, 16384, 16384)),  # K = 128 * 128
        ("405B", "FC1", 16384, (16384, 106496, 16384)),  # the largest case
        ("405B", "FC2", 2048, (2048, 16384, 53248)),
    ],
)
def test_gemm_shapes(model, layer, tokens, mnk):
    assert llama3.gemm(model, layer, tokens) == mnk
    assert llama3.gemm(model=model, layer=layer, tokens=tokens) == mnk


def test_cases_in_sweep_order():
    full = llama3.cases()
    assert len(full) == 60 and len(set(full)) == 60
    assert full[:5] == [
        ("8B", "QKV", 1024),
        ("8B", "O", 1024),
        ("8B", "FC1", 1024),
        ("8B", "FC2", 1024),
        ("8B", "QKV", 2048),
    ]
    assert full[-1] == ("405B", "FC2", 16384)
    assert llama3.cases(quick=True) == [
        ("70B", la, m) for m in (4096, 8192) for la in ("QKV", "O", "FC1", "FC2")
    ]


@pytest.mark.parametrize(
    "args,message",
    [
        (("7B", "QKV", 1024), "unknown Llama model '7B'; valid models: 8B, 70B, 405B"),
        (("70B", "MLP", 1024), "unknown Llama layer 'MLP'; valid layers: QKV, O, FC1, FC2"),
        (("70B", "QKV", 0), "tokens=0 must be positive"),
    ],
)
def test_unknown_names_raise_value_error(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        llama3.gemm(*args)


def test_python_sweep_measures_the_same_shapes():
    """benchmarks/sweep/llama_sweep.py reads its tables from llama3: its cases, shapes and timing
    rules are those of distgemm_bench --sweep, or the C++ and torchrun numbers would not sit side by
    side."""
    from benchmarks.sweep import llama_sweep as sweep

    assert llama3.models() == sweep.MODELS
    assert tuple(llama3.layers()) == sweep.LAYERS
    assert {la: d["collective"] for la, d in llama3.layers().items()} == sweep.COLLECTIVE
    assert all(sweep.SCHEDULE[d["collective"]] == d["schedule"] for d in llama3.layers().values())
    assert tuple(llama3.tokens()) == sweep.TOKENS
    assert tuple(llama3.tokens(quick=True)) == sweep.QUICK_TOKENS
    assert tuple(llama3.models(quick=True)) == sweep.QUICK_MODELS
    for quick in (False, True):
        assert llama3.cases(quick) == [
            (c.model, c.layer, c.tokens) for c in sweep.make_cases(2, quick)
        ]
    for model, layer, tokens in llama3.cases():
        assert llama3.gemm(model, layer, tokens) == sweep.global_gemm(model, layer, tokens)
    timing = llama3.sweep_timing()
    assert timing == dict(
        warmup_ms=round(sweep.WARMUP_S * 1000),
        rewarm_ms=round(sweep.REWARM_S * 1000),
        timed_ms=round(sweep.TIMED_S * 1000),
        min_iterations=sweep.MIN_ITERS,
        max_iterations=sweep.MAX_ITERS,
    )
    # steady state on power-capped GPUs: at least 1 s of warm load and 1 s timed windows
    assert timing["warmup_ms"] >= 1000 and timing["timed_ms"] >= 1000


# ---------------------------------------------------------------------------------------------
# distgemm_bench --sweep --dry-run


def _bench():
    env = os.environ.get("DISTGEMM_BENCH")
    if env:
        return pathlib.Path(env)
    cand = pathlib.Path(distgemm.__file__).resolve().parent / "bin" / "distgemm_bench"
    return cand if os.access(cand, os.X_OK) else None


BENCH = _bench()
needs_bench = pytest.mark.skipif(
    BENCH is None,
    reason="distgemm/bin/distgemm_bench is not installed: the package was built without the "
    f"CUDA runtime ({_core.cuda_runtime_reason}); set DISTGEMM_BENCH to a built binary",
)


def bench(*args):
    # No visible GPU: the dry run must not need one, also on a machine that has GPUs.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    return subprocess.run([str(BENCH), *args], capture_output=True, text=True, timeout=60, env=env)


def dry_cases(proc):
    """{name: fields} of the CASE lines (key=value, then an optional 'reason: ...')."""
    out = {}
    for line in proc.stdout.splitlines():
        if not line.startswith("CASE "):
            continue
        head, _, reason = line.partition(" reason: ")
        name, *kv = head.split()[1:]
        fields = dict(x.split("=", 1) for x in kv)
        fields["reason"] = reason
        assert name not in out, f"case {name} listed twice"
        out[name] = fields
    return out


def dims(s):
    return tuple(int(x) for x in s.split("x"))


@needs_bench
@pytest.mark.parametrize("kind,tp", [("full", 2), ("quick", 2), ("full", 8)])
def test_dry_run_lists_the_sweep(kind, tp):
    proc = bench("--sweep", kind, "--tp", str(tp), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    cases = dry_cases(proc)
    want = llama3.cases(quick=kind == "quick")
    assert list(cases) == [f"{mo}/{la}/M{t}/TP{tp}" for mo, la, t in want]
    layers = llama3.layers()
    for (model, layer, tokens), f in zip(want, cases.values()):
        m, n, k = llama3.gemm(model, layer, tokens)
        assert (f["model"], f["layer"], int(f["tokens"])) == (model, layer, tokens)
        assert (int(f["m"]), int(f["n"]), int(f["k"])) == (m, n, k)
        assert (f["collective"], f["schedule"]) == (
            layers[layer]["collective"],
            layers[layer]["schedule"],
        )
        assert f["status"] == "run" and f["steps"] == f"{tp},{2 * tp}"
        if f["collective"] == "all_gather":  # A and W sharded on rows, D on N
            assert (dims(f["a"]), dims(f["b"]), dims(f["d"])) == (
                (m // tp, k),
                (n // tp, k),
                (m, n // tp),
            )
            assert dims(f["local"]) == (m, n // tp, k)
        else:  # A and W sharded on K, D on M
            assert (dims(f["a"]), dims(f["b"]), dims(f["d"])) == (
                (m, k // tp),
                (n, k // tp),
                (m // tp, n),
            )
            assert dims(f["local"]) == (m, n, k // tp)
    assert f"{len(want)} case(s) ({len(want)} to run, 0 skipped)" in proc.stdout
    assert "nothing was launched" in proc.stdout


@needs_bench
def test_dry_run_filters():
    proc = bench(
        "--sweep",
        "full",
        "--tp",
        "8",
        "--dry-run",
        "--models",
        "405B,8B",
        "--layers",
        "FC1",
        "--tokens",
        "16384,1024",
    )
    assert proc.returncode == 0, proc.stderr
    cases = dry_cases(proc)
    assert list(cases) == [
        "8B/FC1/M1024/TP8",
        "8B/FC1/M16384/TP8",
        "405B/FC1/M1024/TP8",
        "405B/FC1/M16384/TP8",
    ]  # sweep order, not filter order
    big = cases["405B/FC1/M16384/TP8"]
    assert (dims(big["a"]), dims(big["b"]), dims(big["d"])) == (
        (2048, 16384),
        (13312, 16384),
        (16384, 13312),
    )


@needs_bench
def test_dry_run_skips_what_tp_cannot_split():
    proc = bench("--sweep", "quick", "--tp", "3", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    cases = dry_cases(proc)
    assert len(cases) == 8
    for name, f in cases.items():
        assert f["status"] == "skipped", name
        assert f["reason"] == (
            f"M={f['tokens']} is not divisible by TP=3 (sequence-parallel activations)"
        )
    assert "8 case(s) (0 to run, 8 skipped)" in proc.stdout


@needs_bench
@pytest.mark.parametrize(
    "args,message",
    [
        (("--models", "7B"), "unknown Llama model '7B'; valid models: 8B, 70B, 405B"),
        (("--layers", "MLP"), "unknown Llama layer 'MLP'; valid layers: QKV, O, FC1, FC2"),
        (
            ("--tokens", "3000"),
            "--tokens 3000 is not a sweep size; valid tokens: 1024, 2048, 4096, 8192, 16384",
        ),
        (("--tokens", "1024"), "leave no case of the quick sweep"),
        (("--m", "4096"), "--m does not apply to --sweep"),
        (("--warmup-ms", "100"), "--warmup-ms 100 is below 200 in --sweep mode"),
    ],
)
def test_bad_sweep_arguments_exit_2(args, message):
    proc = bench("--sweep", "quick", "--tp", "2", "--dry-run", *args)
    assert proc.returncode == 2
    assert message in proc.stderr


@needs_bench
def test_dry_run_needs_tp():
    proc = bench("--sweep", "quick", "--dry-run")
    assert proc.returncode == 2
    assert "--dry-run needs --tp" in proc.stderr


# ---------------------------------------------------------------------------------------------
# distgemm_bench --dtype fp8: the options checked before anything runs


@needs_bench
def test_dry_run_takes_fp8():
    proc = bench(
        *("--sweep", "quick", "--tp", "2", "--dry-run", "--dtype", "fp8"),
        *("--scales", "row", "--fast-accum"),
    )
    assert proc.returncode == 0, proc.stderr
    assert len(dry_cases(proc)) == 8


@needs_bench
@pytest.mark.parametrize(
    "args,message",
    [
        (("--dtype", "e4m3"), "--dtype takes one of bf16, fp16, fp8, got e4m3"),
        (("--fast-accum",), "--fast-accum needs --dtype fp8"),
        (("--dtype", "fp16", "--scales", "row"), "--scales needs --dtype fp8, got --dtype fp16"),
        (("--dtype", "fp8", "--scales", "rows"), "--scales takes tensor or row, got rows"),
        (("--dtype", "fp8", "--alpha", "0.5"), "with --dtype fp8: the fp8 kernels scale by"),
        (("--dtype", "fp8", "--tile-n", "256"), "--tile-n 256 with --dtype fp8"),
        (
            ("--dtype", "fp8", "--scales", "row", "--l", "2"),
            "row-wise scales (of A and B) need L=1, got L=2",
        ),
    ],
)
def test_bad_fp8_arguments_exit_2(args, message):
    """Refused before any GPU is asked for (none is visible here), with the reason."""
    proc = bench("--schedule", "ag_rotate_a", "--tp", "2", "--steps", "2", *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
