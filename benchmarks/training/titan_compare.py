"""Compare two titan_async_tp.py runs: losses within bf16 tolerance, and the tokens/s ratio.

    python3 -m benchmarks.training.titan_compare OFF.json ON.json [--rtol 2e-2] [--atol 2e-2]

OFF is the run with distgemm's switch off (torch's async-TP kernels), ON the run with it on. The
runs must share every setting but the switch (TP, layers, steps, sequence, batch, seed, dtype,
...). Every step's losses agree when ``|on - off| <= atol + rtol * |off|``; the default 2e-2
is the repository's bf16 training tolerance (a few times bf16's rounding of 2^-8 = 3.9e-3, as in
benchmarks/training/training_step.py), and the absolute part keeps late, small losses from
demanding more than bf16 gives. Prints one line per verdict and the ratio ON/OFF of tokens/s;
exit status 0 when the losses agree, 1 when they do not, 2 when the files cannot be compared.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from typing import Any

RTOL = 2e-2
ATOL = 2e-2
# Settings that may differ between the two runs (everything else in "config" must match).
FREE = ("switch",)


class Incomparable(ValueError):
    """The two records are not runs of the same configuration."""


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The verdict on two runs: ``steps`` compared, the first step whose losses differ beyond
    tolerance (None: none), the largest absolute and relative differences, tokens/s of each and
    ON / OFF, and each run's median time of the steps after its warm-up (None where the record
    has no step times): tokens/s counts every timed step, so one stalled step moves it, the
    median does not."""

    steps: int
    first_bad_step: int | None
    max_abs_diff: float
    max_rel_diff: float
    tokens_per_s_off: float
    tokens_per_s_on: float
    rtol: float
    atol: float
    median_step_ms_off: float | None = None
    median_step_ms_on: float | None = None

    @property
    def agree(self) -> bool:
        return self.first_bad_step is None

    @property
    def speedup(self) -> float:
        return self.tokens_per_s_on / self.tokens_per_s_off

    def lines(self) -> list[str]:
        verdict = (
            "agree"
            if self.agree
            else f"DIFFER (first at step {self.first_bad_step}, beyond atol + rtol * |off|)"
        )
        return [
            f"losses over {self.steps} steps: {verdict}; max |on - off| {self.max_abs_diff:.3g}, "
            f"max relative {self.max_rel_diff:.3g} (atol {self.atol:g}, rtol {self.rtol:g})",
            f"tokens/s: off {self.tokens_per_s_off:.1f}, on {self.tokens_per_s_on:.1f}, "
            f"on/off {self.speedup:.4f}x",
        ] + (
            [
                f"median step: off {self.median_step_ms_off:.2f} ms, on "
                f"{self.median_step_ms_on:.2f} ms, off/on "
                f"{self.median_step_ms_off / self.median_step_ms_on:.4f}x"
            ]
            if self.median_step_ms_off and self.median_step_ms_on
            else []
        )


def median_step_ms(rec: dict[str, Any]) -> float | None:
    """The median of the record's step times after its warm-up steps, None without them."""
    timed = rec.get("step_ms", [])[rec["config"].get("warmup", 0) :]
    return statistics.median(timed) if timed else None


def _config(rec: dict[str, Any], which: str) -> dict[str, Any]:
    for key in ("config", "losses", "tokens_per_s"):
        if key not in rec:
            raise Incomparable(f"{which} has no {key!r}: not a titan_async_tp.py record")
    return {k: v for k, v in rec["config"].items() if k not in FREE}


def compare(off: dict[str, Any], on: dict[str, Any], rtol=RTOL, atol=ATOL) -> Comparison:
    """Compare the records of the switch-off run and the switch-on run (see the module's
    docstring); Incomparable when their configurations or step counts differ."""
    a, b = _config(off, "OFF"), _config(on, "ON")
    diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    if diff:
        raise Incomparable(
            "the runs differ in " + ", ".join(f"{k} ({a.get(k)!r} vs {b.get(k)!r})" for k in diff)
        )
    lo, ln = off["losses"], on["losses"]
    if len(lo) != len(ln) or not lo:
        raise Incomparable(f"loss counts differ or are empty: {len(lo)} vs {len(ln)}")
    first_bad, max_abs, max_rel = None, 0.0, 0.0
    for step, (x, y) in enumerate(zip(lo, ln, strict=True)):
        d = abs(y - x)
        if not (math.isfinite(x) and math.isfinite(y)):
            d = math.inf
        max_abs = max(max_abs, d)
        max_rel = max(max_rel, d / abs(x) if x else d)
        if first_bad is None and not d <= atol + rtol * abs(x):
            first_bad = step
    return Comparison(
        steps=len(lo),
        first_bad_step=first_bad,
        max_abs_diff=max_abs,
        max_rel_diff=max_rel,
        tokens_per_s_off=float(off["tokens_per_s"]),
        tokens_per_s_on=float(on["tokens_per_s"]),
        rtol=rtol,
        atol=atol,
        median_step_ms_off=median_step_ms(off),
        median_step_ms_on=median_step_ms(on),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmarks.training.titan_compare",
        description="Do two titan_async_tp.py runs (switch off, switch on) agree? tokens/s ratio.",
    )
    p.add_argument("off", help="JSON of the run with --switch off")
    p.add_argument("on", help="JSON of the run with --switch on")
    p.add_argument("--rtol", type=float, default=RTOL, help=f"relative tolerance ({RTOL:g})")
    p.add_argument("--atol", type=float, default=ATOL, help=f"absolute tolerance ({ATOL:g})")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with open(args.off) as f:
            off = json.load(f)
        with open(args.on) as f:
            on = json.load(f)
        c = compare(off, on, args.rtol, args.atol)
    except (OSError, json.JSONDecodeError, Incomparable) as ex:
        print(f"titan_compare: {ex}", file=sys.stderr)
        return 2
    for line in c.lines():
        print(line)
    stats = on.get("routing_stats", {})
    print(
        f"distgemm with the switch on: served {stats.get('served')}, "
        f"fell back {stats.get('fallen_back')}"
    )
    return 0 if c.agree else 1


if __name__ == "__main__":
    sys.exit(main())
