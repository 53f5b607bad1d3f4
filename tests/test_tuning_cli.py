"""CPU checks of ``python -m distgemm.tune``: the candidate list of --dry-run, argument errors,
the table it writes from measured candidates (loadable, the faster path per bucket), and its
timing helper (the per-round maximum over ranks, then the median; bounded waits)."""

import random
import subprocess
import sys
import time

import pytest

from distgemm import llama3, tune
from distgemm.runtime import machine, tuning_table


def test_dry_run_lists_every_candidate_without_a_gpu():
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "distgemm.tune",
            "--model",
            "70B",
            "--tp",
            "2",
            "--tokens",
            "64,4096",
            "--layers",
            "QKV,O",
            "--dry-run",
            "--constants",
            str(machine.SHIPPED_DIR / "nvidia-h200-tp2-nvlink18.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == ("70B/QKV/M64: all_gather_gemm ag_rotate_a M=64 N=10240 K=8192, bucket 64")
    names = [ln.split()[0] for ln in lines if ln.startswith("  ")]
    per_case = ["collective"] + [f"overlap/S{s}/n{t}" for s in (2, 4) for t in (128, 256)]
    assert names == per_case * 4
    assert all(" model " in ln and ln.endswith(" ms") for ln in lines if ln.startswith("  "))
    assert lines[-1] == "20 candidates in 4 cases"


def test_uneven_candidates_are_kept_and_unsplittable_cases_skipped_with_the_reason():
    cases = tune.make_cases("8B", 2, [2], ["O"], [128])
    (case,) = cases
    by_name = {c.name: c for c in case.candidates}
    # Uneven steps: M=2 splits into S=4 tiles too (two of them empty); nothing is skipped.
    assert by_name["overlap/S4/n128"].rejected is None
    assert by_name["overlap/S2/n128"].rejected is None
    cases = tune.make_cases("8B", 4, [2], ["O"], [128])  # M=2 does not split over TP=4
    assert cases[0].candidates == []
    assert cases[0].skipped == "M=2 is not divisible by TP=4 (sequence-parallel activations)"
    assert "skipped (M=2 is not divisible by TP=4" in tune.format_cases(cases)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--tokens", "3000"], "--tokens: 3000 is not a power of two"),
        (["--layers", "QKV,MLP"], "--layers: 'MLP' is not one of QKV, O, FC1, FC2"),
        (["--tiles", "64"], "--tiles: 64 is not 128 or 256"),
        (["--rounds", "0"], "--rounds must be >= 1"),
        ([], "--out is required unless --dry-run"),
        (["--tp", "9"], "--tp 9 is not in 1..8"),
    ],
)
def test_argument_errors_name_the_argument(capsys, argv, message):
    base = ["--model", "70B", "--tp", "2"]
    with pytest.raises(SystemExit):
        tune.parse_args(base + argv)
    assert message in capsys.readouterr().err


def test_the_written_table_keeps_the_faster_path_and_the_best_overlap(tmp_path):
    cases = tune.make_cases("70B", 2, [1024, 4096], ["QKV", "FC2"], [128, 256])
    rng = random.Random(3)
    for case in cases:
        for cand in case.candidates:
            cand.ms = 1.0 + rng.random()
    table = tuning_table.TuningTable(tune.table_entries(cases, 2, "bf16"), "measured", {"x": 1})
    path = tmp_path / "table.json"
    table.save(path)
    loaded = tuning_table.load_tuning_table(path)
    try:
        assert len(loaded.entries) == 4 and loaded.digest == table.digest
        for case in cases:
            timed = {c.name: c.ms for c in case.candidates}
            best = min((c for c in case.candidates if c.path == "overlap"), key=lambda c: c.ms)
            e = loaded.lookup(case.op, case.schedule, 2, "bf16", case.n, case.k, case.m)
            assert (e.steps, e.tile_n) == (best.steps, best.tile_n)
            assert e.path == ("overlap" if best.ms <= timed["collective"] else "collective")
            assert e.ms == pytest.approx(timed)
    finally:
        tuning_table.load_tuning_table(None)
    # A case without measurements (skipped, or not run) has no entry.
    for cand in cases[0].candidates:
        cand.ms = None
    assert len(tune.table_entries(cases, 2, "bf16")) == 3


class _Event:
    """torch.cuda.Event on the CPU: records time.perf_counter()."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def query(self):
        return True

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def test_steady_ms_takes_the_per_round_maximum_over_ranks_then_the_median(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    exchanged, calls = [], []

    class TwoRanks:  # the peer's rounds: this rank's, 10% slower in the odd rounds
        rank, timeout_s, device = 0, 5.0, None

        def all_gather(self, obj, what):
            exchanged.append(what)
            if isinstance(obj, list):
                return [obj, [t * (1.1 if i % 2 else 0.9) for i, t in enumerate(obj)]]
            return [obj, obj]

    ms = tune.steady_ms(lambda: calls.append(time.sleep(1e-4)), TwoRanks(), "x", 2.0, 1.0, 5)
    assert exchanged == ["x: settle", "x: probe", "x: timings"]
    assert 0.1 <= ms < 5.0  # ~0.1 ms per call
    assert len(calls) >= 2 + 5  # the untimed and the probe call, warm-up, >= 1 call per round


class _NeverDone:
    def query(self):
        return False


class _BrokenComm:
    rank = 1

    def __init__(self):
        self.broken = None

    def mark_broken(self, msg):
        self.broken = msg

    def raise_if_broken(self):
        raise RuntimeError(
            f"rank {self.rank}: {self.broken}. This communicator can no longer launch"
        )


def test_wait_event_is_bounded_and_marks_the_communicator_broken():
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"x: the GPU work did not finish within 0.2 s"):
        tune.wait_event(_NeverDone(), 0.2, "x")
    assert 0.15 < time.perf_counter() - t0 < 5.0
    comm = _BrokenComm()
    with pytest.raises(
        RuntimeError, match=r"rank 1: tune 70B/O/M4096 collective: the GPU work did not finish"
    ):
        tune.wait_event(_NeverDone(), 0.05, "tune 70B/O/M4096 collective", comm)
    assert "did not join a collective" in comm.broken


def test_every_case_of_the_default_run_has_a_collective_candidate():
    cases = tune.make_cases("70B", 2, list(llama3.tokens()), list(llama3.layers()), [128, 256])
    assert len(cases) == 20 and not any(c.skipped for c in cases)
    assert all(c.candidates[0].name == "collective" for c in cases)
