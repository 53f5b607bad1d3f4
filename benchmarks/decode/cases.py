"""The decode benchmark's case list: which row-parallel layers it runs, at which token counts.

The layers are a grid, ``--models`` x ``--layers`` (default: the Llama-3 models the sweeps know,
O and FC2), then ``--extra``: single layers of other models (benchmarks/common/models.py), named
``model/layer``, so that a result is not tuned to Llama's shapes alone (default: a Qwen2-72B FC2,
K=29568, and a Mixtral-8x22B O, 6144 x 6144). Issue 42's acceptance covers the Llama O and FC2
layers at 1..256 tokens (``in_scope``); the other layers are reported beside them. Pure (no
torch).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from benchmarks.common import models

LAYERS = ("O", "FC2")  # the row-parallel layers, all-reduced at decode
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
EXTRA = tuple(f"{m}/{la}" for m in models.OTHER for la in LAYERS)  # what --extra may name
EXTRA_DEFAULT = ("Qwen2-72B/FC2", "Mixtral-8x22B/O")
SCOPE_MODELS, SCOPE_LAYERS, SCOPE_TOKENS = models.LLAMA, LAYERS, 256


@dataclass(frozen=True)
class Layer:
    """One row-parallel layer: ``out [M, N] = all_reduce(a [M, K/TP] @ w [N, K/TP]^T)``."""

    model: str
    layer: str
    n: int
    k: int


def layer_list(model_names=models.LLAMA, layers=LAYERS, extra=EXTRA_DEFAULT) -> list[Layer]:
    """The grid ``model_names`` x ``layers``, then the ``extra`` "model/layer" names that the
    grid does not hold already, in the order given; ValueError naming the known values."""
    bad = [m for m in model_names if m not in models.MODELS]
    bad += [la for la in layers if la not in LAYERS]
    bad += [e for e in extra if e not in EXTRA]
    if bad:
        raise ValueError(
            f"unknown {bad[0]!r}: models {', '.join(models.MODELS)}; layers "
            f"{', '.join(LAYERS)}; extra layers {', '.join(EXTRA)}"
        )
    pairs = [(m, la) for m in model_names for la in layers]
    pairs += [p for p in (tuple(e.split("/")) for e in extra) if p not in pairs]
    return [Layer(m, la, *models.layer_nk(m, la)) for m, la in pairs]


def split_reason(n: int, k: int, tp: int) -> str | None:
    """Why a layer's K cannot be split over tp ranks into 16-byte rows (None: it can)."""
    if k % tp or (k // tp) % 8:
        return f"K={k} does not split over tp={tp} into multiples of 8 elements"
    return None


def scope_cases() -> list[tuple[str, str, int]]:
    """Every (model, layer, tokens) of issue 42's acceptance: Llama O and FC2 at each of TOKENS
    up to SCOPE_TOKENS."""
    return [
        (m, la, t) for m in SCOPE_MODELS for la in SCOPE_LAYERS for t in TOKENS if t <= SCOPE_TOKENS
    ]


def in_scope(model: str, layer: str, tokens: int) -> bool:
    """Whether a point counts for issue 42's acceptance (Llama O and FC2, 1..256 tokens)."""
    return model in SCOPE_MODELS and layer in SCOPE_LAYERS and tokens <= SCOPE_TOKENS


def names(valid, none_ok: bool = False):
    """An argparse type: comma-separated names out of ``valid`` ("none": the empty list where
    ``none_ok``); the error names the valid ones."""

    def parse(text: str) -> list[str]:
        if none_ok and text.strip() == "none":
            return []
        vals = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in vals if x not in valid]
        if bad or not vals:
            extra = ", or none" if none_ok else ""
            raise argparse.ArgumentTypeError(f"{text!r}: give some of {', '.join(valid)}{extra}")
        return vals

    return parse
