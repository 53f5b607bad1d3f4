"""Llama-3 sweep cases: the case list, each case's global and per-rank shapes, and why a case or
an S is skipped. Pure (no torch.distributed, no CUDA): the tables come from distgemm.llama3
(python/distgemm/data/llama3.json), which ``distgemm_bench --sweep`` is built from too, so that
the C++ and the torchrun numbers are of the same cases."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from distgemm import llama3

MODELS: dict[str, dict[str, int]] = llama3.models()  # hidden, ffn, heads, kv heads, head dim
_LAYERS = llama3.layers()
LAYERS = tuple(_LAYERS)
TOKENS = tuple(llama3.tokens())
QUICK_MODELS = tuple(llama3.models(quick=True))
QUICK_TOKENS = tuple(llama3.tokens(quick=True))
# Column-parallel layers gather the activations before the GEMM, row-parallel ones scatter the
# summed result after it (sequence parallelism on both sides).
COLLECTIVE = {la: d["collective"] for la, d in _LAYERS.items()}
SCHEDULE = {d["collective"]: d["schedule"] for d in _LAYERS.values()}


@dataclass(frozen=True)
class Case:
    model: str
    layer: str
    tokens: int
    tp: int

    @property
    def name(self) -> str:
        return f"{self.model}/{self.layer}/M{self.tokens}/TP{self.tp}"


def make_cases(
    tp: int,
    quick: bool = False,
    models: Sequence[str] | None = None,
    tokens: Sequence[int] | None = None,
    layers: Sequence[str] | None = None,
) -> list[Case]:
    """Every (model, layer, tokens) case for TP ranks, in the order they are run; ``models``,
    ``tokens``, ``layers`` narrow the (full or quick) list. ValueError names unknown values."""
    mo_all = QUICK_MODELS if quick else tuple(MODELS)
    to_all = QUICK_TOKENS if quick else TOKENS
    for what, given, valid in (("model", models, tuple(MODELS)), ("layer", layers, LAYERS)):
        bad = [x for x in (given or ()) if x not in valid]
        if bad:
            raise ValueError(f"unknown {what} {bad[0]!r}; one of {', '.join(valid)}")
    bad_tokens = [t for t in (tokens or ()) if not isinstance(t, int) or t < 1]
    if bad_tokens:
        raise ValueError(f"tokens must be positive integers, got {bad_tokens[0]!r}")
    mo = [m for m in mo_all if models is None or m in models]
    to = [t for t in (tokens if tokens is not None else to_all)]
    la = [x for x in LAYERS if layers is None or x in layers]
    return [Case(m_, l_, t_, tp) for m_ in mo for t_ in to for l_ in la]


def global_gemm(model: str, layer: str, tokens: int) -> tuple[int, int, int]:
    """(M, N, K) of the whole layer, D[M, N] = X[M, K] @ W[N, K]^T (ValueError naming the valid
    models / layers)."""
    return tuple(llama3.gemm(model, layer, tokens))


def shapes(case: Case) -> dict[str, Any]:
    """Per-rank operand shapes of every variant (integer division; skip_reason says whether
    the division is exact). a: the op's activation input, w: nn.Linear weight [N_rank, K_rank],
    out: the op's output, full_a: the all-gathered activations (all-gather only), partial: the
    un-reduced product (reduce-scatter only), floor: (m, n, k) of the per-rank local GEMM."""
    m, n, k = global_gemm(case.model, case.layer, case.tokens)
    tp = case.tp
    coll = COLLECTIVE[case.layer]
    d: dict[str, Any] = dict(collective=coll, schedule=SCHEDULE[coll], m=m, n=n, k=k)
    if coll == "all_gather":
        d.update(
            a=(m // tp, k), w=(n // tp, k), out=(m, n // tp), full_a=(m, k), floor=(m, n // tp, k)
        )
    else:
        d.update(
            a=(m, k // tp), w=(n, k // tp), out=(m // tp, n), partial=(m, n), floor=(m, n, k // tp)
        )
    return d


def plan_rejects(op: str, schedule: str, tp: int, steps: int, a_shape, w_shape) -> str | None:
    """distgemm's own verdict on one S (the op's make_spec on meta tensors, every rank's
    sub-GEMMs): None when accepted, else the message."""
    import torch  # CPU-only use; imported here so that case generation needs no torch

    from distgemm import ops

    a = torch.empty(a_shape, device="meta", dtype=torch.bfloat16)
    w = torch.empty(w_shape, device="meta", dtype=torch.bfloat16)
    try:
        for r in range(tp):
            ops.make_spec(op, schedule, tp, r, steps, a, w)
    except (ValueError, TypeError) as e:
        return str(e)
    return None


def step_options(tp: int) -> list[int]:
    """The S values searched for distgemm's best: TP and 2*TP."""
    return [tp, 2 * tp]


def skip_reason(case: Case, plan_check=plan_rejects) -> tuple[str | None, dict[int, str]]:
    """(why the whole case is skipped or None, {S: why that S is rejected}). The case is skipped
    when the tensor-parallel split itself is inexact or distgemm rejects S = TP (the default);
    an S = 2*TP rejection only narrows distgemm's best-S search."""
    why = llama3.tp_split_reason(case.model, case.layer, case.tokens, case.tp)
    if why:  # the same rule as distgemm_bench --sweep
        return why, {}
    s = shapes(case)
    tp = case.tp
    # The baselines are plain torch; the rows of a per-rank operand must still be 16-byte
    # multiples for every variant to see the same dense layout distgemm requires.
    for what, shape in (("a", s["a"]), ("w", s["w"])):
        if shape[1] % 8:
            return (
                f"per-rank {what} {list(shape)}: {shape[1]} columns is not a multiple of 8 "
                f"elements (16-byte rows)"
            ), {}
    op = "all_gather_gemm" if s["collective"] == "all_gather" else "gemm_reduce_scatter"
    bad: dict[int, str] = {}
    for steps in step_options(tp):
        why = plan_check(op, s["schedule"], tp, steps, s["a"], s["w"])
        if why:
            bad[steps] = why
    if tp in bad:
        return f"distgemm rejects the default S={tp}: {bad[tp]}", bad
    return None, bad
