"""gemm_all_reduce's decode model (runtime.reduce_cost) and its constants: a fit of runs the model
priced gives back the constants at TP 2, 3, 4 and 8 (the fused kernel's two-shot tail with its
own), the choice takes the fastest candidate only beyond its margin and never past what the
calibration measured, each candidate with its own margin (its own over-predicted gains), a fused
tail is offered only where the calibration priced it, the JSON form and the TP prediction carry
the constants, and path="auto" follows the model (fused with either tail, or the collective path
with NCCL's or our all-reduce) at shapes the calibration did not run."""

import json
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from test_machine import constants  # noqa: E402
from test_machine import priced_runs as path_runs  # noqa: E402

from distgemm import _core, calibrate, ops  # noqa: E402
from distgemm.runtime import calibration_fit, machine, reduce_cost  # noqa: E402
from distgemm.runtime.choose import choose_path  # noqa: E402
from distgemm.runtime.paths import collective  # noqa: E402

TPS = (2, 3, 4, 8)
RESIDENT_CTAS = 132  # an H100's or H200's SMs, one CTA of a fused kernel each


def reduce_constants(error: float = 0.0) -> machine.ReduceConstants:
    """H100-like: torch.mm streams 3 TB/s, NCCL's all-reduce 18 us + 150 GB/s, our one-shot 6 us
    and our two-shot 10 us; the decode kernel 4 us and 0.45 us per token over torch.mm; the
    CUTLASS kernel's two-shot tail more fixed cost than its one-shot, less per token and per
    pushed byte."""
    return machine.ReduceConstants(
        mm=(5e-3, 1 / 3.0e9, 1 / 6.7e11),
        all_reduce={
            "nccl": (18e-3, 1 / 1.5e8),
            "one_shot": (6e-3, 1 / 0.6e8),
            "two_shot": (10e-3, 1 / 1.4e8),
        },
        fused={  # the overhead over torch.mm: fixed, per weight byte, per token, per pushed byte
            "decode": (4e-3, 1e-12, 4.5e-4, 1e-9),
            "cutlass": (12e-3, 2e-12, 3.3e-4, 5e-10),
            "cutlass_two_shot": (16e-3, 2e-12, 0.6e-4, 1e-10),
        },
        max_tokens=256,
        max_bytes=16 << 20,
        choice_error=error,
        fused_resident_ctas={"decode": RESIDENT_CTAS, "cutlass": RESIDENT_CTAS},
    )


def priced_runs(rc: machine.ReduceConstants, tp: int, after_mm: bool = False) -> list[dict]:
    """A calibration's decode runs (calibrate.REDUCE_SHAPES x REDUCE_TOKENS), each priced by the
    model under ``rc``: the fused path with each tail that runs the tokens (as calibrate does);
    the all-reduces timed alone (an earlier calibration's form) or, ``after_mm``, right after
    torch.mm of each shape (calibrate's form: the shape, the pair's ms and its ms less mm's)."""
    runs = []
    for n, k in calibrate.REDUCE_SHAPES:
        for m in calibrate.REDUCE_TOKENS:
            shape = {"m": m, "n": n, "k": k}
            runs.append({"kind": "reduce_mm", **shape, "ms": reduce_cost.mm_ms(rc, m, n, k)})
            for tail in _core.FUSED_TAILS:
                if _core.fused_tail_problem(tail, m) == "":
                    fused = reduce_cost.fused_ms(rc, m, n, k, tp, tail)
                    partials = reduce_cost.fused_partials(rc, m, n, k)
                    runs.append({"kind": "fused", "tp": tp, **shape, "tail": tail, "ms": fused,
                                 "resident_ctas": RESIDENT_CTAS, "splits": partials})  # fmt: skip
            for algorithm in rc.all_reduce:
                nbytes = m * n * 2
                ms = reduce_cost.all_reduce_ms(rc, algorithm, nbytes)
                run = {"kind": "all_reduce", "algorithm": algorithm, "bytes": nbytes, "ms": ms}
                if after_mm:
                    run.update(shape, after_mm_ms=reduce_cost.mm_ms(rc, m, n, k) + ms)
                runs.append(run)
    return runs


def close(a, b):
    return a == pytest.approx(b, rel=1e-5, abs=1e-12)


@pytest.mark.parametrize("after_mm", [False, True], ids=["alone", "after-mm"])
@pytest.mark.parametrize("tp", TPS)
def test_a_fit_of_runs_the_model_priced_gives_back_its_constants(tp, after_mm):
    want = reduce_constants()
    got = calibration_fit.fit_reduce(priced_runs(want, tp, after_mm), tp)
    assert all(close(g, w) for g, w in zip(got.mm, want.mm, strict=True))
    for algorithm, consts in want.all_reduce.items():
        assert all(close(g, w) for g, w in zip(got.all_reduce[algorithm], consts, strict=True))
    # Compare times: a constant the runs cannot tell from 0 may come back as 0.
    assert set(got.fused) == set(machine.FUSED_KERNELS)
    for n, k in calibrate.REDUCE_SHAPES:
        for m in calibrate.REDUCE_TOKENS:
            for tail in _core.FUSED_TAILS:
                if _core.fused_tail_problem(tail, m) == "":
                    assert close(
                        reduce_cost.fused_ms(got, m, n, k, tp, tail),
                        reduce_cost.fused_ms(want, m, n, k, tp, tail),
                    ), (m, n, k, tail)
    assert got.fused_resident_ctas == want.fused_resident_ctas
    assert got.max_tokens == max(calibrate.REDUCE_TOKENS)
    biggest = max(m * n * 2 for n, _ in calibrate.REDUCE_SHAPES for m in calibrate.REDUCE_TOKENS)
    assert got.max_bytes == biggest
    assert got.choice_error == pytest.approx(0.0, abs=1e-9)


def test_the_fit_refuses_too_few_runs_and_leaves_out_what_it_cannot_fit():
    runs = priced_runs(reduce_constants(), 2)
    with pytest.raises(ValueError, match="torch.mm at decode token counts needs at least 3 runs"):
        calibration_fit.fit_reduce([r for r in runs if r["kind"] != "reduce_mm"], 2)
    no_nccl = [r for r in runs if r.get("algorithm") != "nccl"]
    with pytest.raises(ValueError, match="NCCL's all-reduce needs at least 2 runs"):
        calibration_fit.fit_reduce(no_nccl, 2)
    # No own all-reduce and no fused run (a build without them): only NCCL is priced.
    bare = [r for r in runs if r["kind"] == "reduce_mm" or r.get("algorithm") == "nccl"]
    rc = calibration_fit.fit_reduce(bare, 2)
    assert set(rc.all_reduce) == {"nccl"} and rc.fused == {}
    offered = {"fused": "", "one_shot": "", "two_shot": ""}
    assert set(reduce_cost.predict(rc, 8, 8192, 4096, 2, offered)) == {reduce_cost.BASELINE}


def test_runs_without_a_tail_are_one_shot_and_too_few_two_shot_runs_leave_it_out():
    runs = priced_runs(reduce_constants(), 4)
    # A calibration before the two-shot tail: its fused runs name no tail.
    old = [{k: v for k, v in r.items() if k != "tail"} for r in runs
           if r.get("tail", "one_shot") == "one_shot"]  # fmt: skip
    rc = calibration_fit.fit_reduce(old, 4)
    assert set(rc.fused) == {"decode", "cutlass"}
    # Three two-shot runs cannot fit its four constants: it is left out, never offered.
    two = [r for r in runs if r.get("tail") == "two_shot"]
    rc = calibration_fit.fit_reduce(old + two[:3], 4)
    assert "cutlass_two_shot" not in rc.fused
    offered = {"fused": "", "fused_two_shot": ""}
    assert "fused_two_shot" not in reduce_cost.predict(rc, 128, 8192, 4096, 4, offered)
    rc = calibration_fit.fit_reduce(old + two, 4)
    assert "fused_two_shot" in reduce_cost.predict(rc, 128, 8192, 4096, 4, offered)


def test_the_error_is_the_over_predicted_gain():
    want = reduce_constants()
    runs = priced_runs(want, 4)
    # The fused kernel measured 20% slower than the model prices it: its gain over-predicted.
    slower = [dict(r, ms=r["ms"] * 1.2) if r["kind"] == "fused" else r for r in runs]
    errs = calibration_fit.reduce_gain_errors(want, slower, 4)
    assert errs and max(errs) > 0.05
    assert calibration_fit.over_prediction(errs) > 0.05
    # Faster than priced: an under-predicted gain costs nothing.
    faster = [dict(r, ms=r["ms"] * 0.8) if r["kind"] == "fused" else r for r in runs]
    errs = calibration_fit.reduce_gain_errors(want, faster, 4)
    assert calibration_fit.over_prediction(errs) == pytest.approx(0.0, abs=1e-12)
    # The two-shot tail alone measured slower: its own gain is over-predicted.
    slower2 = [dict(r, ms=r["ms"] * 1.2) if r.get("tail") == "two_shot" else r for r in runs]
    assert (
        calibration_fit.over_prediction(calibration_fit.reduce_gain_errors(want, slower2, 4)) > 0.05
    )


@pytest.mark.parametrize("tp", TPS)
def test_a_tile_computed_in_pieces_prices_every_pieces_partial(tp):
    # Fewer output tiles than resident CTAs: the decode kernel computes each tile in pieces, and
    # every piece's partial is pushed and summed (the per-token and per-pushed-byte terms times
    # the partials); as many tiles as CTAs or more: one partial per tile.
    rc = reduce_constants()
    few, many = (4, 4096, 1024), (4, 16384, 1024)  # 64 and 256 tiles of the decode kernel
    assert reduce_cost.fused_partials(rc, *few) == _core.fused_splits(*few, RESIDENT_CTAS) == 2
    assert reduce_cost.fused_partials(rc, *many) == 1
    fixed, per_byte, per_token, per_pushed = rc.fused["decode"]
    m, n, k = few
    want = fixed + per_byte * n * k * 2 + 2 * (per_token * m + per_pushed * m * n * 2 * (tp - 1))
    assert reduce_cost.fused_overhead_ms(rc, m, n, k, tp) == pytest.approx(want)
    # constants that do not know the kernel's resident CTAs price one partial per tile
    unknown = replace(rc, fused_resident_ctas={})
    assert reduce_cost.fused_partials(unknown, *few) == 1
    one = fixed + per_byte * n * k * 2 + per_token * m + per_pushed * m * n * 2 * (tp - 1)
    assert reduce_cost.fused_overhead_ms(unknown, m, n, k, tp) == pytest.approx(one)


@pytest.mark.parametrize("tp", (2, 4))
def test_runs_that_recorded_no_partials_are_fitted_on_the_machines_slots(tp):
    # An earlier calibration's fused runs carry no partials or resident CTAs: fit_reduce takes
    # the machine's slots (one fused CTA per SM) and gives the same constants back.
    want = reduce_constants()
    runs = priced_runs(want, tp, after_mm=True)
    assert any(r.get("splits", 1) > 1 for r in runs if r["kind"] == "fused")
    bare = [{k: v for k, v in r.items() if k not in ("splits", "resident_ctas")} for r in runs]
    got = calibration_fit.fit_reduce(bare, tp, slots=RESIDENT_CTAS)
    assert got.fused_resident_ctas == want.fused_resident_ctas
    for kernel, consts in want.fused.items():
        assert all(close(g, w) for g, w in zip(got.fused[kernel], consts, strict=True)), kernel
    # without slots either, every run is priced as one partial per tile, and so is the model
    blind = calibration_fit.fit_reduce(bare, tp)
    assert blind.fused_resident_ctas == {}
    assert reduce_cost.fused_partials(blind, 4, 4096, 1024) == 1


ALL = {"fused": "", "one_shot": "", "two_shot": ""}
ALL_TAILS = {**ALL, "fused_two_shot": ""}


@pytest.mark.parametrize("tp", TPS)
def test_the_two_shot_tail_is_priced_by_its_own_constants_where_offered(tp):
    rc = reduce_constants()
    m, n, k = 128, 8192, 4096
    pred = reduce_cost.predict(rc, m, n, k, tp, ALL_TAILS)
    terms = reduce_cost.fused_terms(m, n, k, tp, reduce_cost.fused_partials(rc, m, n, k))
    own = sum(c * t for c, t in zip(rc.fused["cutlass_two_shot"], terms, strict=True))
    assert pred["fused_two_shot"] == pytest.approx(reduce_cost.mm_ms(rc, m, n, k) + own)
    assert pred["fused_two_shot"] != pytest.approx(pred["fused"])
    # not offered (absent from the offer, or with a reason): not priced
    assert "fused_two_shot" not in reduce_cost.predict(rc, m, n, k, tp, ALL)
    refused = {**ALL, "fused_two_shot": "the two-shot tail is the CUTLASS kernel's"}
    assert "fused_two_shot" not in reduce_cost.predict(rc, m, n, k, tp, refused)
    # at the decode kernel's tokens there is no two-shot constant to price it by
    assert "fused_two_shot" not in reduce_cost.predict(rc, 8, n, k, tp, ALL_TAILS)
    # constants without the two-shot tail (every shipped file): never offered
    old = replace(rc, fused={k: v for k, v in rc.fused.items() if k != "cutlass_two_shot"})
    assert "fused_two_shot" not in reduce_cost.predict(old, m, n, k, tp, ALL_TAILS)
    # with the most tokens and bytes pushed, its lower per-byte cost wins over the one-shot
    pick, pred, _ = reduce_cost.choose(rc, 256, 16384, 4096, tp, ALL_TAILS)
    assert pred["fused_two_shot"] < pred["fused"]
    assert pick == min(pred, key=pred.get)


def test_the_shipped_machine_files_load_and_price_the_tails_they_calibrated():
    files = sorted(machine.SHIPPED_DIR.glob("*.json"))
    assert files
    for path in files:
        mc = machine.load(path)
        assert mc.reduce is not None and set(mc.reduce.fused) <= set(machine.FUSED_KERNELS)
        # every kernel's resident CTAs are known, so that tiles in pieces are priced as such
        assert set(mc.reduce.fused_resident_ctas) == {"decode", "cutlass"}, path.name
        calibrated = "cutlass_two_shot" in mc.reduce.fused
        for m in (64, 128, 256):
            pred = reduce_cost.predict(mc.reduce, m, 8192, 4096, mc.key.tp, ALL_TAILS)
            assert ("fused_two_shot" in pred) == calibrated and "fused" in pred, path.name


@pytest.mark.parametrize("tp", TPS)
def test_the_choice_is_the_fastest_prediction(tp):
    rc = reduce_constants()
    for m, n, k in [(1, 8192, 2048), (8, 16384, 4096), (96, 4096, 1024), (256, 16384, 6656)]:
        pick, pred, why = reduce_cost.choose(rc, m, n, k, tp, ALL, "slug")
        assert pick == min(pred, key=pred.get), (m, n, k, pred)
        assert set(pred) == {reduce_cost.BASELINE, "fused", "collective/one_shot",
                             "collective/two_shot"}  # fmt: skip
        assert "margin" in why and "(slug)" in why


def test_the_choice_keeps_the_baseline_within_its_margin_and_honours_the_offer():
    rc = reduce_constants()
    m, n, k, tp = 4, 8192, 2048, 4
    pick, pred, _ = reduce_cost.choose(rc, m, n, k, tp, ALL)
    assert pick != reduce_cost.BASELINE
    gain = pred[reduce_cost.BASELINE] - pred[pick]
    # An error that makes the margin larger than the gain keeps mm + NCCL.
    big = gain / pred[reduce_cost.BASELINE] + cost_tolerated() + 0.01
    assert reduce_cost.choose(replace(rc, choice_error=big), m, n, k, tp, ALL)[0] == (
        reduce_cost.BASELINE
    )
    # A candidate that cannot run the call (its reason given) is never priced.
    offered = {"fused": "transposed weight", "one_shot": "", "two_shot": "too large"}
    pick, pred, _ = reduce_cost.choose(rc, m, n, k, tp, offered)
    assert set(pred) == {reduce_cost.BASELINE, "collective/one_shot"}


def test_each_candidate_needs_the_margin_of_its_own_error():
    rc = reduce_constants()
    m, n, k, tp = 4, 8192, 2048, 4
    pick, pred, _ = reduce_cost.choose(rc, m, n, k, tp, ALL)
    base = pred[reduce_cost.BASELINE]
    # The fastest predicted candidate with an error that makes its margin larger than its gain
    # gives way to the fastest of the others that clear theirs.
    gain = base - pred[pick]
    own = {pick: gain / base + cost_tolerated() + 0.01}
    rest = sorted((c for c in pred if c not in (pick, reduce_cost.BASELINE)), key=pred.get)
    assert rest and base - pred[rest[0]] > reduce_cost.MIN_GAIN_MS
    got, _, why = reduce_cost.choose(replace(rc, candidate_errors=own), m, n, k, tp, ALL)
    assert got == rest[0] and f"{pick} " in why and "margin" in why
    # Every candidate's own error too large: mm + NCCL, whatever the common error says.
    every = {c: 0.9 for c in pred if c != reduce_cost.BASELINE}
    assert reduce_cost.choose(replace(rc, candidate_errors=every), m, n, k, tp, ALL)[0] == (
        reduce_cost.BASELINE
    )
    assert reduce_cost.margin(rc, pick, base, m) == pytest.approx(reduce_cost.MIN_GAIN_MS)


def test_the_fit_gives_each_candidate_the_error_of_its_own_gains():
    want = reduce_constants()
    runs = priced_runs(want, 4)
    for a in ("nccl", "one_shot", "two_shot"):
        for n, _ in calibrate.REDUCE_SHAPES:
            for m in calibrate.REDUCE_TOKENS:
                b = m * n * 2
                runs.append({"kind": "all_reduce", "algorithm": a, "bytes": b,
                             "ms": reduce_cost.all_reduce_ms(want, a, b)})  # fmt: skip
    fitted = calibration_fit.fit_reduce(runs, 4)  # exact runs: every candidate's error ~0
    assert set(fitted.candidate_errors) == {
        "fused/decode", "fused/cutlass", "fused/cutlass_two_shot", "collective/one_shot",
        "collective/two_shot",
    }  # fmt: skip
    assert max(fitted.candidate_errors.values()) == pytest.approx(0.0, abs=1e-6)
    # The fused kernel measured 20% slower than priced: only its own gains are over-predicted.
    slower = [dict(r, ms=r["ms"] * 1.2) if r["kind"] == "fused" else r for r in runs]
    errs = calibration_fit.candidate_gain_errors(want, slower, 4)
    each = {c: calibration_fit.over_prediction(v) for c, v in errs.items()}
    assert each["fused/decode"] > 0.05 and each["fused/cutlass"] > 0.05
    assert each["fused/cutlass_two_shot"] > 0.05
    assert each["collective/one_shot"] == pytest.approx(0.0, abs=1e-9)
    assert each["collective/two_shot"] == pytest.approx(0.0, abs=1e-9)
    flat = calibration_fit.reduce_gain_errors(want, slower, 4)
    assert sorted(flat) == sorted(e for v in errs.values() for e in v)


def test_each_fused_kernel_has_the_error_of_its_own_gains_and_the_margin_it_gives():
    want = reduce_constants()
    runs = priced_runs(want, 4)
    # The CUTLASS kernel (one-shot tail) measured 30% slower than priced, the decode kernel exact:
    # the decode kernel's error stays 0 and its margin is the smaller.
    cutlass = {m for m in calibrate.REDUCE_TOKENS if _core.fused_kernel(m) == "cutlass"}
    decode = set(calibrate.REDUCE_TOKENS) - cutlass
    assert cutlass and decode
    slower = [
        dict(r, ms=r["ms"] * 1.3)
        if r["kind"] == "fused" and r["m"] in cutlass and r["tail"] == "one_shot"
        else r
        for r in runs
    ]
    errs = calibration_fit.candidate_gain_errors(want, slower, 4)
    errors = {c: calibration_fit.over_prediction(v) for c, v in errs.items()}
    assert errors["fused/cutlass"] > 0.05
    assert errors["fused/decode"] == pytest.approx(0.0, abs=1e-9)
    fitted = replace(want, candidate_errors=errors)
    base = 0.05
    m_decode, m_cutlass = min(decode), max(cutlass)
    assert reduce_cost.margin(fitted, "fused", base, m_decode) < reduce_cost.margin(
        fitted, "fused", base, m_cutlass
    )
    # An earlier calibration's file keys one error by the path's name: every kernel takes it.
    old = replace(want, candidate_errors={"fused": 0.3})
    assert reduce_cost.margin(old, "fused", base, m_decode) == pytest.approx(
        reduce_cost.margin(old, "fused", base, m_cutlass)
    )
    assert reduce_cost.margin(old, "fused", base, m_decode) == pytest.approx(
        (0.3 - cost_tolerated()) * base
    )
    # The decode kernel with a large error of its own gives way at its tokens only.
    m, n, k = m_decode, 8192, 2048
    pick, pred, _ = reduce_cost.choose(want, m, n, k, 4, ALL)
    assert pick == "fused", pred
    no_decode = replace(want, candidate_errors={"fused/decode": 0.9})
    assert reduce_cost.choose(no_decode, m, n, k, 4, ALL)[0] != "fused"


def test_all_reduces_timed_after_torch_mm_price_the_collective_path_over_those_timed_alone():
    want = reduce_constants()
    # The all-reduces timed alone as priced, and after torch.mm 20% slower (the ranks' GEMMs end
    # apart): the pair is what the collective path runs, so its error is what the choice guards.
    alone = [r for r in priced_runs(want, 4) if r["kind"] == "all_reduce"]
    after = [
        dict(r, ms=r["ms"] * 1.2, after_mm_ms=r["after_mm_ms"] + 0.2 * r["ms"])
        if r["kind"] == "all_reduce" and r["algorithm"] == "one_shot"
        else r
        for r in priced_runs(want, 4, after_mm=True)
    ]
    each = calibration_fit.candidate_gain_errors(want, alone + after, 4)
    assert calibration_fit.over_prediction(each["collective/one_shot"]) > 0.01
    assert calibration_fit.over_prediction(each["collective/two_shot"]) == pytest.approx(
        0.0, abs=1e-9
    )
    # Timed alone only (an earlier calibration): looked up by bytes, as priced.
    each = calibration_fit.candidate_gain_errors(want, priced_runs(want, 4), 4)
    assert calibration_fit.over_prediction(each["collective/one_shot"]) == pytest.approx(
        0.0, abs=1e-9
    )


def cost_tolerated():
    from distgemm.runtime import cost_model

    return cost_model.TOLERATED_LOSS


def test_nothing_is_priced_past_what_the_calibration_measured():
    rc = replace(reduce_constants(), max_tokens=64, max_bytes=1 << 20)
    assert set(reduce_cost.predict(rc, 65, 8192, 4096, 2, ALL)) == {reduce_cost.BASELINE}
    pred = reduce_cost.predict(rc, 64, 16384, 4096, 2, ALL)  # 2 MB: past max_bytes
    assert set(pred) == {reduce_cost.BASELINE, "fused"}


def test_json_round_trip_problems_and_the_tp_prediction(tmp_path):
    mc = replace(constants(2), reduce=reduce_constants(0.03))
    path = tmp_path / "m.json"
    mc.save(path)
    back = machine.load(path)
    assert back.reduce == mc.reduce
    each = replace(mc, reduce=replace(mc.reduce, candidate_errors={"fused": 0.1}))
    each.save(path)
    assert machine.load(path).reduce.candidate_errors == {"fused": 0.1}
    d = json.loads(path.read_text())
    d["reduce"].pop("candidate_errors")  # a file written before them: the common error serves
    path.write_text(json.dumps(d))
    assert machine.load(path).reduce.candidate_errors == {}
    d["reduce"]["candidate_errors"] = {"fused": 1.2}
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"candidate_errors \{'fused': 1.2\} are not in"):
        machine.load(path)
    mc.save(path)
    d = json.loads(path.read_text())
    d["reduce"]["all_reduce"].pop("nccl")
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="no NCCL constants"):
        machine.load(path)
    d["reduce"]["all_reduce"]["nccl"] = [0.01, 1e-9]
    d["reduce"]["choice_error"] = 1.5
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"reduce.choice_error 1.5 is not in \[0, 1\)"):
        machine.load(path)
    # Older files have no reduce constants: the model then keeps mm + NCCL at decode sizes.
    d.pop("reduce")
    path.write_text(json.dumps(d))
    assert machine.load(path).reduce is None
    # Another TP: latencies on the line through the TPs measured, per-byte terms kept.
    at2 = replace(constants(2), reduce=reduce_constants())
    rc4 = reduce_constants()
    rc4 = replace(rc4, all_reduce={**rc4.all_reduce, "one_shot": (9e-3, 1 / 0.6e8)})
    rc4 = replace(rc4, fused={**rc4.fused, "cutlass_two_shot": (19e-3, 2e-12, 2.0e-4, 1.5e-10)})
    at4 = replace(constants(4), reduce=rc4)
    at8 = at4.at_tp(8, [at2])
    lat2, lat4 = 6e-3, 9e-3  # hops 1 and 3: 1.5 us per hop
    assert at8.reduce.all_reduce["one_shot"][0] == pytest.approx(lat4 + (lat4 - lat2) / 2 * 4)
    assert at8.reduce.all_reduce["one_shot"][1] == rc4.all_reduce["one_shot"][1]
    assert at4.at_tp(8).reduce.all_reduce["one_shot"] == rc4.all_reduce["one_shot"]
    # the two-shot tail's fixed cost on its own line (16 us at TP 2, 19 at TP 4)
    fixed = at8.reduce.fused["cutlass_two_shot"]
    assert fixed[0] == pytest.approx(19e-3 + (19e-3 - 16e-3) / 2 * 4)
    assert fixed[1:] == rc4.fused["cutlass_two_shot"][1:]


def _spec(tokens, n, k_local, tp, transposed=False):
    a = torch.empty(tokens, k_local, device="meta", dtype=torch.bfloat16)
    w = torch.empty(n, k_local, device="meta", dtype=torch.bfloat16)
    if transposed:
        w = torch.empty(k_local, n, device="meta", dtype=torch.bfloat16).t()
    return ops.make_spec("gemm_all_reduce", "ar_tile_a", tp, 0, None, a, w)


@pytest.fixture
def cuda_build(monkeypatch):
    """A build with the CUDA runtime, as the choice sees it (shapes only: no GPU is touched)."""
    monkeypatch.setattr(_core, "cuda_runtime", True, raising=False)
    if not hasattr(_core, "allreduce_problem"):
        pytest.fail("distgemm._core has no allreduce_problem (the all-reduce kernel's rules)")


@pytest.mark.parametrize("tp", TPS)
def test_auto_follows_the_model_on_shapes_the_calibration_did_not_run(cuda_build, tp):
    mc = replace(constants(tp), reduce=reduce_constants())
    # Neither these (n, k) nor these token counts are the calibration's.
    picked = set()
    for tokens, n, k in [(2, 6144, 1280), (24, 12288, 3072), (100, 7168, 2304), (200, 3584, 896),
                         (192, 14336, 2048)]:  # fmt: skip
        spec = _spec(tokens, n, k, tp)
        path, info = choose_path(spec, "auto", torch.bfloat16, None, mc)
        offered = {p: _core.fused_tail_problem(tail, tokens)
                   for p, tail in machine.FUSED_PATHS.items()}  # fmt: skip
        offered.update(collective.own_all_reduce_offer(tokens * n, torch.bfloat16, tp))
        want, pred, _ = reduce_cost.choose(mc.reduce, tokens, n, k, tp, offered)
        picked.add(want)
        fused_want = want in machine.FUSED_PATHS
        assert path == ("fused" if fused_want else "collective"), (tokens, n, k, info)
        if path == "collective":
            assert info["all_reduce"] == want.split("/")[1]
        else:
            assert info["fused_tail"] == machine.FUSED_PATHS[want]
        assert info["source"] == "model" and info["why"].startswith("model: predicted")
        assert info["collective_nccl_ms"] == pytest.approx(pred[reduce_cost.BASELINE])
        assert ("fused_two_shot_ms" in info) == ("fused_two_shot" in pred)
    assert "fused_two_shot" in picked, picked  # the two-shot tail is chosen somewhere


def test_auto_without_reduce_constants_never_runs_fused(cuda_build):
    for mc in (None, constants(2)):  # no calibration; one without decode terms
        path, info = choose_path(_spec(8, 8192, 4096, 2), "auto", torch.bfloat16, None, mc)
        assert path != "fused" and info["all_reduce"] == "nccl", info


def test_auto_past_the_calibrated_tokens_uses_the_path_model(cuda_build):
    mc = replace(constants(2), reduce=reduce_constants())
    path, info = choose_path(_spec(257, 8192, 4096, 2), "auto", torch.bfloat16, None, mc)
    assert path in ("overlap", "collective") and "overlap_ms" in info
    # a group that cannot run the collective path (the baseline) leaves the decode model out
    path, info = choose_path(_spec(8, 8192, 4096, 2), "auto", torch.bfloat16, "gloo", mc)
    assert path == "overlap" and info["collective_unavailable"] == "gloo"


def test_a_transposed_weight_is_never_fused_and_own_all_reduce_refusals_name_the_reason(cuda_build):
    mc = replace(constants(2), reduce=reduce_constants())
    path, info = choose_path(_spec(8, 8192, 4096, 2, transposed=True), "auto", torch.bfloat16,
                             None, mc)  # fmt: skip
    assert path == "collective" and "fused_ms" not in info
    assert "bf16 or fp16" in collective.own_all_reduce_problem("one_shot", 64, torch.float32, 2)


def test_refit_keeps_the_decode_runs_a_reduce_only_calibration_added(tmp_path):
    """A file whose decode terms came from --reduce-only (calibration_fit.with_reduce: the runs
    under meta["reduce"]) prices them from those runs again when refitted, not from the decode
    runs of its first calibration."""
    tp = 4
    first, added = reduce_constants(), replace(reduce_constants(), mm=(7e-3, 1 / 2.5e9, 1 / 6e11))
    added = replace(added, all_reduce=dict(added.all_reduce, two_shot_pull=(8e-3, 1 / 1.5e8)))
    base = replace(constants(tp), reduce=None)
    stored = calibration_fit.fit(
        path_runs(base) + priced_runs(first, tp), base.key, base.slots, {"command": "x"}
    )
    stored = replace(stored, meta=dict(stored.meta, runs=path_runs(base) + priced_runs(first, tp)))
    grown = calibration_fit.with_reduce(stored, priced_runs(added, tp), {"command": "y"})
    src, dst = tmp_path / "m.json", tmp_path / "again.json"
    grown.save(src)
    assert calibrate.main(["--calibrate", "--refit", str(src), "--out", str(dst)]) == 0
    got = machine.load(dst)
    assert "two_shot_pull" in got.reduce.all_reduce and close(got.reduce.mm[0], added.mm[0])
    assert got.meta["reduce"]["command"] == "y" and got.meta["refit"].startswith("python -m")
    assert close(got.gemm_launch_ms, base.gemm_launch_ms)
