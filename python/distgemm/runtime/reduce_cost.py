"""The cost model of ``gemm_all_reduce`` at the token counts a calibration measured (decode):
torch.mm then an all-reduce (NCCL's, or our one-shot or two-shot kernel), or one fused kernel,
and the choice among them.

What it models (one rank, the constants ``machine.ReduceConstants``, fitted by
``calibration_fit.fit_reduce`` to ``distgemm.calibrate``'s runs):

- torch.mm: ``launch + bytes * per_byte + flops * per_flop``: at a few tokens the GEMM streams
  its weight (bytes), at hundreds its flops start to count;
- an all-reduce of ``bytes``: ``latency + bytes * per_byte``, per algorithm;
- the fused kernel (``_core.fused_kernel``: the decode kernel or the CUTLASS one) with each of
  its tails (``machine.FUSED_PATHS``: "fused" the one-shot, "fused_two_shot" the CUTLASS
  kernel's two-shot): torch.mm's time plus its own overhead, ``fixed + weight bytes * per_byte +
  tokens * partials * per_token + pushed bytes * per_pushed``, each kernel and tail with
  constants of its own (``machine.fused_constants_key``): the GEMM streams the same weight, and
  what it adds is the exchange and the sum, whose rows each cost a latency. ``partials`` is the
  partials per rank of a tile's sum (``_core.fused_splits`` on the kernel's resident CTAs,
  ``ReduceConstants.fused_resident_ctas``): a layer with fewer tiles than SMs has each tile
  computed in pieces, and every piece's partial is pushed (pushed bytes: the result times TP - 1
  times partials) and summed.
  Priced as an overhead over torch.mm, a fused-against-unfused choice compares that overhead
  with the all-reduce alone: torch.mm's own error does not enter it. A tail whose constants the
  machine's calibration has not is not offered, as an own all-reduce is not.

The all-reduce's constants price it as it runs on the collective path, right after its torch.mm
(the calibration times mm then the all-reduce in one graph and takes torch.mm's own time off):
the ranks' GEMMs end at different times and the all-reduce waits for the last, which an
all-reduce timed alone, back to back, never does.

The baseline is mm + NCCL. Another candidate can be taken where it is predicted faster by at
least ``MIN_GAIN_MS`` and by its own error less ``cost_model.TOLERATED_LOSS`` of the baseline's
time: the calibration's over-predicted gain of that candidate (``candidate_errors``, keyed by
``error_key``; the candidates' common ``choice_error`` where the constants have none for it), as
the overlapped plan is taken. The fastest predicted of those is taken. Each candidate's own
error, because they differ in kind: mm + an all-reduce shares torch.mm with the baseline, so only
the all-reduces' fits enter its gain, while a fused kernel's gain carries its own overhead fit,
and each fused kernel (the decode kernel at a few tokens, the CUTLASS one beyond) its own.
"""

from __future__ import annotations

from .. import _core
from .cost_model import ELEM_BYTES, error_margin_ms
from .machine import FUSED_PATHS, ReduceConstants, fused_constants_key

FUSED_ERROR_PREFIX = "fused/"

BASELINE = "collective/nccl"
# The least predicted gain taken: decode calls are replayed from CUDA graphs, whose per-call
# times a calibration's windows resolve to a fraction of a microsecond (the path model's 5 us
# floor is the jitter of eager calls of large GEMMs, a fifth of a whole decode call).
MIN_GAIN_MS = 5e-4


def mm_terms(m: int, n: int, k: int) -> tuple[float, float, float]:
    """torch.mm's terms before the constants: (1, bytes of a, w and the result, flops)."""
    return 1.0, float((m * k + n * k + m * n) * ELEM_BYTES), 2.0 * m * n * k


def fused_terms(
    m: int, n: int, k: int, tp: int, partials: int
) -> tuple[float, float, float, float]:
    """The fused kernel's overhead terms over torch.mm before the constants: (1, weight bytes,
    tokens times ``partials``, bytes pushed to the peers), ``partials`` per rank of a tile's
    sum (``fused_partials``)."""
    return (
        1.0,
        float(n * k * ELEM_BYTES),
        float(m * partials),
        float(m * n * ELEM_BYTES * (tp - 1) * partials),
    )


def partials_on(m: int, n: int, k: int, resident_ctas: int) -> int:
    """Partials per rank of a tile's sum in the fused kernel that runs m tokens on
    ``resident_ctas`` resident CTAs (``_core.fused_splits``); 1 where they are unknown (0)."""
    return _core.fused_splits(m, n, k, resident_ctas) if resident_ctas > 0 else 1


def fused_partials(rc: ReduceConstants, m: int, n: int, k: int) -> int:
    """``partials_on`` the resident CTAs the constants hold for the kernel that runs m tokens."""
    return partials_on(m, n, k, rc.fused_resident_ctas.get(_core.fused_kernel(m), 0))


def _dot(consts, terms) -> float:
    return sum(c * t for c, t in zip(consts, terms, strict=True))


def mm_ms(rc: ReduceConstants, m: int, n: int, k: int) -> float:
    """Predicted ms of torch.mm m x n x k at decode token counts."""
    return _dot(rc.mm, mm_terms(m, n, k))


def all_reduce_ms(rc: ReduceConstants, algorithm: str, nbytes: float) -> float:
    """Predicted ms of an all-reduce of ``nbytes`` per rank by ``algorithm``."""
    latency, per_byte = rc.all_reduce[algorithm]
    return latency + nbytes * per_byte


def fused_overhead_ms(
    rc: ReduceConstants, m: int, n: int, k: int, tp: int, tail: str = "one_shot"
) -> float:
    """Predicted ms the fused GEMM + all-reduce of this rank's m x n x k with ``tail`` takes over
    torch.mm."""
    terms = fused_terms(m, n, k, tp, fused_partials(rc, m, n, k))
    return _dot(rc.fused[fused_constants_key(m, tail)], terms)


def fused_ms(rc: ReduceConstants, m: int, n: int, k: int, tp: int, tail: str = "one_shot") -> float:
    """Predicted ms of the fused GEMM + all-reduce of this rank's m x n x k with ``tail``."""
    return mm_ms(rc, m, n, k) + fused_overhead_ms(rc, m, n, k, tp, tail)


def predict(
    rc: ReduceConstants, m: int, n: int, k: int, tp: int, offered: dict[str, str]
) -> dict[str, float]:
    """Predicted ms of every candidate this rank's m x n x k can run: "collective/<algorithm>"
    for each all-reduce the constants price, each fused path (``FUSED_PATHS``: "fused",
    "fused_two_shot") where its kernel and tail are; ``offered`` maps each fused path and each
    own algorithm to '' where it can run the call, else the reason (a name absent: not
    offered). Nothing past the calibration's ``max_tokens`` or ``max_bytes`` but the baseline."""
    nbytes = m * n * ELEM_BYTES
    mm = mm_ms(rc, m, n, k)
    out = {BASELINE: mm + all_reduce_ms(rc, "nccl", nbytes)}
    if m > rc.max_tokens:
        return out
    for algorithm in rc.all_reduce:
        if algorithm != "nccl" and offered.get(algorithm) == "" and nbytes <= rc.max_bytes:
            out[f"collective/{algorithm}"] = mm + all_reduce_ms(rc, algorithm, nbytes)
    for path, tail in FUSED_PATHS.items():
        if offered.get(path) == "" and fused_constants_key(m, tail) in rc.fused:
            out[path] = mm + fused_overhead_ms(rc, m, n, k, tp, tail)
    return out


def choose(
    rc: ReduceConstants, m: int, n: int, k: int, tp: int, offered: dict[str, str], slug: str = ""
) -> tuple[str, dict[str, float], str]:
    """(candidate, the predictions, why in words): the fastest predicted of the candidates that
    beat mm + NCCL by their margins (module docstring, ``margin``), else mm + NCCL. Shapes and
    constants only, so every rank picks the same."""
    pred = predict(rc, m, n, k, tp, offered)
    base = pred[BASELINE]
    margins = {c: margin(rc, c, base, m) for c in pred if c != BASELINE}
    taken = [c for c, need in margins.items() if base - pred[c] >= need]
    pick = min(taken, key=lambda c: (pred[c], c)) if taken else BASELINE
    listed = ", ".join(
        f"{c} {v * 1e3:.1f} us" + (f" (margin {margins[c] * 1e3:.2f})" if c in margins else "")
        for c, v in sorted(pred.items(), key=lambda x: x[1])
    )
    return pick, pred, f"predicted {listed} us ({slug})"


def error_key(candidate: str, m: int) -> str:
    """The name of ``candidate``'s own error at ``m`` tokens (``ReduceConstants.candidate_errors``):
    a fused path's is its kernel's and tail's, "fused/<fused_constants_key>" (the decode kernel
    and the CUTLASS one err apart), any other candidate's its own name."""
    tail = FUSED_PATHS.get(candidate)
    return candidate if tail is None else FUSED_ERROR_PREFIX + fused_constants_key(m, tail)


def margin(rc: ReduceConstants, candidate: str, base_ms: float, m: int) -> float:
    """The predicted gain over mm + NCCL (``base_ms``) that ``candidate`` at ``m`` tokens needs to
    be taken: its own error (``error_key``; a file of an earlier calibration keys a fused path's by
    the path's name), else the common one."""
    errors = rc.candidate_errors
    error = errors.get(error_key(candidate, m), errors.get(candidate, rc.choice_error))
    return error_margin_ms(error, base_ms, MIN_GAIN_MS)
