"""The Llama-3 tensor-parallel layer cases, read from data/llama3.json: the models, the layers,
the token counts of the full and the quick sweep, each layer's GEMM and how the sweeps time a
case. The JSON is the one source: ``distgemm_bench --sweep`` reads a header CMake writes from it
(cpp/examples/bench/llama_shapes.cmake), the benchmarks, ``python -m distgemm.tune --model`` and
``python -m distgemm.simulate`` read this module. No torch and nothing else of distgemm.

Every layer is one GEMM D[M, N] = X[M, K] @ W[N, K]^T (W in nn.Linear layout), M = tokens, with
sequence parallelism on both sides: the all-gather layers (QKV, FC1) are column parallel and
gather X, the reduce-scatter layers (O, FC2) row parallel and scatter D, both sharded on M."""

from __future__ import annotations

import ast
import json
from pathlib import Path

_DATA = json.loads((Path(__file__).parent / "data" / "llama3.json").read_text())
_MODELS = {m["name"]: {k: v for k, v in m.items() if k != "name"} for m in _DATA["models"]}
_LAYERS = {la["name"]: la for la in _DATA["layers"]}


def _evaluate(expr: str, fields: dict[str, int]) -> int:
    """An n or k of the JSON: + and * over the model's fields and integers."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
            left, right = value(node.left), value(node.right)
            return left + right if isinstance(node.op, ast.Add) else left * right
        if isinstance(node, ast.Name) and node.id in fields:
            return fields[node.id]
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        raise ValueError(
            f"llama3.json: {expr!r} is not + and * over integers and {', '.join(fields)}"
        )

    return value(ast.parse(expr, mode="eval").body)


def layer_nk(fields: dict[str, int], layer: str) -> tuple[int, int]:
    """(N, K) of ``layer`` for a model given by its fields (hidden, ffn, q_heads, kv_heads,
    head_dim): the JSON's formulas, also for models outside its list; ValueError naming the
    valid layers or the missing field."""
    if layer not in _LAYERS:
        raise ValueError(f"unknown Llama layer '{layer}'; valid layers: {', '.join(_LAYERS)}")
    la = _LAYERS[layer]
    return _evaluate(la["n"], fields), _evaluate(la["k"], fields)


# (N, K) of every model's layers, evaluated once.
_NK = {
    (model, name): layer_nk(fields, name) for model, fields in _MODELS.items() for name in _LAYERS
}


def models(quick: bool = False) -> dict[str, dict[str, int]]:
    """Model configs in sweep order: {name: {'hidden', 'ffn', 'q_heads', 'kv_heads',
    'head_dim'}}. quick=True: only the quick sweep's models."""
    names = _DATA["quick"]["models"] if quick else list(_MODELS)
    return {n: dict(_MODELS[n]) for n in names}


def layers() -> dict[str, dict[str, str]]:
    """The tensor-parallel layers in sweep order: {name: {'collective': 'all_gather' or
    'reduce_scatter', 'schedule': the default distgemm schedule}}."""
    return {
        n: {"collective": la["collective"], "schedule": la["schedule"]} for n, la in _LAYERS.items()
    }


def tokens(quick: bool = False) -> list[int]:
    """Token counts M of the full sweep (quick=True: the quick sweep's)."""
    return list(_DATA["quick"]["tokens"] if quick else _DATA["tokens"])


def gemm(model: str, layer: str, tokens: int) -> tuple[int, int, int]:
    """Global (M, N, K) of a layer at ``tokens`` tokens; ValueError naming the valid models /
    layers, or for tokens < 1."""
    if model not in _MODELS:
        raise ValueError(f"unknown Llama model '{model}'; valid models: {', '.join(_MODELS)}")
    if layer not in _LAYERS:
        raise ValueError(f"unknown Llama layer '{layer}'; valid layers: {', '.join(_LAYERS)}")
    if tokens < 1:
        raise ValueError(f"tokens={tokens} must be positive")
    return (tokens, *_NK[model, layer])


def cases(quick: bool = False) -> list[tuple[str, str, int]]:
    """(model, layer, tokens) of every sweep case, in the order the sweeps run them: model, then
    tokens, then layer (the four layers of one forward pass at one size side by side)."""
    return [(mo, la, t) for mo in models(quick) for t in tokens(quick) for la in _LAYERS]


def tp_split_reason(model: str, layer: str, tokens: int, tp: int) -> str:
    """'' when TP ranks split the layer exactly (M of the sequence-parallel activations; N of a
    column-parallel, K of a row-parallel weight), else the reason with the values: the rule
    distgemm_bench --sweep skips a case by (llama_shapes.hpp)."""
    m, n, k = gemm(model, layer, tokens)
    if tp < 1:
        return f"TP={tp}: needs at least one rank"
    if m % tp:
        return f"M={m} is not divisible by TP={tp} (sequence-parallel activations)"
    all_gather = _LAYERS[layer]["collective"] == "all_gather"
    if all_gather and n % tp:
        return f"N={n} is not divisible by TP={tp} (column-parallel weight)"
    if not all_gather and k % tp:
        return f"K={k} is not divisible by TP={tp} (row-parallel weight)"
    return ""


def sweep_timing() -> dict[str, int]:
    """How the sweeps time a variant: at least 'warmup_ms' (a case's first) or 'rewarm_ms' (the
    others) of sustained replays, then about 'timed_ms' of timed replays within
    ['min_iterations', 'max_iterations']; the median counts (docs/tuning.md says why)."""
    return dict(_DATA["timing"])
