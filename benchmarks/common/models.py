"""The models of the decode and serving benchmarks: the Llama-3 models the sweeps know, and others.

The Llama-3 models (8B, 70B, 405B) come from distgemm.llama3 (python/distgemm/data/llama3.json);
the others are dense transformer configs whose layer shapes are not Llama's, so that a result is
not tuned to one family's shapes. Every model's layers are the JSON's formulas
(``distgemm.llama3.layer_nk``): O is ``[hidden, q_heads * head_dim]``, FC2 ``[hidden, ffn]``,
QKV ``[(q_heads + 2 kv_heads) * head_dim, hidden]``, FC1 ``[2 ffn, hidden]`` (N, K). Pure (no
torch).

The fields are each model's config.json: hidden_size, intermediate_size, num_attention_heads,
num_key_value_heads, head_dim (Mixtral's ffn is one expert's: its FC2 is what a tensor-parallel
expert runs).
"""

from __future__ import annotations

from distgemm import llama3

LLAMA = tuple(llama3.models())
OTHER: dict[str, dict[str, int]] = {
    "Qwen2-72B": dict(hidden=8192, ffn=29568, q_heads=64, kv_heads=8, head_dim=128),
    "Mixtral-8x22B": dict(hidden=6144, ffn=16384, q_heads=48, kv_heads=8, head_dim=128),
    "Mistral-Nemo-12B": dict(hidden=5120, ffn=14336, q_heads=32, kv_heads=8, head_dim=128),
}
MODELS = (*LLAMA, *OTHER)


def fields(model: str) -> dict[str, int]:
    """A model's config fields; ValueError naming the known models."""
    if model in LLAMA:
        return llama3.models()[model]
    if model in OTHER:
        return dict(OTHER[model])
    raise ValueError(f"unknown model {model!r}; known models: {', '.join(MODELS)}")


def layer_nk(model: str, layer: str) -> tuple[int, int]:
    """(N, K) of a layer of a model (D[M, N] = X[M, K] @ W[N, K]^T)."""
    return llama3.layer_nk(fields(model), layer)


def label(model: str) -> str:
    """The model's name in titles: "Llama-70B", "Qwen2-72B"."""
    return f"Llama-{model}" if model in LLAMA else model
