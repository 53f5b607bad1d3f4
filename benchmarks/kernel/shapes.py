"""The distinct single-GPU GEMM shapes of the Llama sweep, each with where it comes from: every
rank's local GEMM (the sweep's compute floor) and every per-step sub-GEMM of the plans the sweep
runs (S = TP and 2*TP), for the models, TPs and token counts asked for. Pure (no GPU): the
cases come from benchmarks/common/llama_cases.py, the sub-GEMMs from the C++ plans
(distgemm._core)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.common.llama_cases import (
    SCHEDULE,
    Case,
    make_cases,
    plan_rejects,
    shapes,
    skip_reason,
    step_options,
)
from distgemm import _core
from distgemm.simulate import H200_RESIDENT_CTAS

TP_CHOICES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Source:
    """One place a shape occurs: a case's local GEMM (steps None) or one step of its S-step plan."""

    model: str
    layer: str
    tokens: int
    tp: int
    steps: int | None = None

    @property
    def local(self) -> bool:
        return self.steps is None

    @property
    def name(self) -> str:
        base = Case(self.model, self.layer, self.tokens, self.tp).name
        return base if self.steps is None else f"{base}/S{self.steps}"

    def as_dict(self) -> dict:
        return dict(
            model=self.model, layer=self.layer, tokens=self.tokens, tp=self.tp, steps=self.steps
        )


@dataclass
class KernelShape:
    """One distinct (m, n, k) and every source it has, in the order the cases were walked."""

    m: int
    n: int
    k: int
    sources: list[Source]

    @property
    def local(self) -> bool:
        """A local GEMM of some case: the issue's acceptance covers these."""
        return any(s.local for s in self.sources)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def as_dict(self) -> dict:
        return dict(
            m=self.m,
            n=self.n,
            k=self.k,
            local=self.local,
            sources=[s.as_dict() for s in self.sources],
        )


def model_config(m: int, n: int, slots: int = H200_RESIDENT_CTAS) -> str:
    """The bf16 kernel configuration the model picks for m x n with ``slots`` resident CTAs per
    kernel (the GPU run reports the device's own choice)."""
    return _core.choose_config(m, n, 1, "bf16", slots=slots, stream_k=True)["config"]


def step_gemms(case: Case, steps: int) -> list[tuple[int, int, int]]:
    """(m, n, k) of every sub-GEMM of the case's S-step plan, all ranks, in plan order."""
    m, n, k = shapes(case)["m"], shapes(case)["n"], shapes(case)["k"]
    schedule = SCHEDULE[shapes(case)["collective"]]
    plan = _core.build_plan(schedule, case.tp, steps, m, n, k, 1, None).to_dict()
    return [(g["m"], g["n"], g["k"]) for dev in plan["devices"] for g in dev["gemms"]]


def case_sources(case: Case, plan_check=plan_rejects) -> tuple[list, str | None]:
    """([(m, n, k, Source)...] of one case: its local GEMM, then each accepted S's sub-GEMMs),
    or ([], why) when the sweep skips the case."""
    why, bad_steps = skip_reason(case, plan_check)
    if why:
        return [], why
    out = [(*shapes(case)["floor"], Source(case.model, case.layer, case.tokens, case.tp))]
    for steps in step_options(case.tp):
        if steps in bad_steps:
            continue
        src = Source(case.model, case.layer, case.tokens, case.tp, steps)
        out += [(*g, src) for g in step_gemms(case, steps)]
    return out, None


def kernel_shapes(
    models: Sequence[str] | None = None,
    tps: Sequence[int] = TP_CHOICES,
    tokens: Sequence[int] | None = None,
    layers: Sequence[str] | None = None,
    local_only: bool = False,
    plan_check=plan_rejects,
) -> tuple[list[KernelShape], list[tuple[Case, str]]]:
    """(distinct shapes, [(case, why) skipped by the sweep]). Local GEMMs come first (the
    acceptance set, so that a --limit keeps them), then shapes that only occur as steps; each
    group in the order the cases are walked (TP, model, tokens, layer). A source is listed once
    per shape. ValueError names an unknown model or layer, or a TP outside TP_CHOICES."""
    bad = [t for t in tps if t not in TP_CHOICES]
    if bad:
        raise ValueError(f"tp={bad[0]!r} is not one of {', '.join(map(str, TP_CHOICES))}")
    found: dict[tuple[int, int, int], KernelShape] = {}
    skipped: list[tuple[Case, str]] = []
    for tp in tps:
        for case in make_cases(tp, models=models, tokens=tokens, layers=layers):
            rows, why = case_sources(case, plan_check)
            if why:
                skipped.append((case, why))
            for m, n, k, src in rows:
                if local_only and not src.local:
                    continue
                shape = found.setdefault((m, n, k), KernelShape(m, n, k, []))
                if src not in shape.sources:
                    shape.sources.append(src)
    ordered = list(found.values())
    return [s for s in ordered if s.local] + [s for s in ordered if not s.local], skipped


def describe_sources(shape: KernelShape, most: int = 3) -> str:
    """The first ``most`` source names and how many more there are."""
    names = [s.name for s in shape.sources]
    more = len(names) - most
    return ", ".join(names[:most]) + (f" (+{more} more)" if more > 0 else "")
