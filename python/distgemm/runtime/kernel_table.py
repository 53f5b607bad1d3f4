"""The machine's kernel table: which GEMM kernel (one of distgemm's configurations, or cuBLASLt
with the rank of its algorithm) runs each shape, measured per GPU model and handed to the
runtime, which consults it wherever a GEMM leaves its kernel unset (kernel/kernel_table.hpp has
the lookup: same dtype, N and K, the nearest M within 2x; elsewhere the table's default for the
dtype, else the wave model decides).

A table is JSON: ``{"format": "distgemm-kernel-table", "version": 1, "gpu": <torch device
name>, "measured": {how}, "rows": [{"dtype", "m", "n", "k", "kernel": <configuration name> |
"cublaslt", "algo": <cuBLASLt rank>, "model": <the wave model's pick>, "ms": {variant: ms}}],
"defaults": [{"dtype", "kernel", "algo", "measured": {how it was chosen}}]}``; an fp8 (e4m3)
row also has ``scale_a_rows``, ``scale_b_rows`` and ``fast_accum``, which the lookup matches.
A default serves the GEMMs of its dtype that no row is near (benchmarks/kernel/table.py's
table_defaults chooses it from the rows' times); "model", "ms" and "defaults" are optional.
The package ships the tables of the GPUs it was measured on
(``distgemm/data/kernels/<gpu stem>.json``); ``benchmarks.kernel.kernel_vs_cublas --table OUT``
writes one from a run (``benchmarks.fp8.fp8_kernel_vs_scaled_mm --cublas --table OUT`` its fp8
rows). ``DISTGEMM_KERNEL_TABLE`` names another file, or "off" for none.
``DISTGEMM_KERNEL_TABLE_PLANS`` says which plans consult it: "all" (the default: single GEMMs
and the steps of every plan) or "one-rank" (single GEMMs and one-rank plans; distgemm's kernels
for every step of a plan of several ranks).
``DISTGEMM_CUBLASLT_ROW_BUCKETS``: "off" (the default: cuBLASLt's heuristic chooses for every row
count) or "on" (a cuBLASLt GEMM runs the algorithm of its row bucket, the rows rounded up to 3
significant bits, so that new token counts ask the heuristic less often; it costs steady-state
speed on some rows inside a bucket: runtime/gemm_cublaslt.cpp, docs/tuning.md).

Pure data, plus ``install``, which hands a table to ``_core`` once per process, and
``plan_kernel``, which says what the installed table runs for a plan's step (the cost model
prices that kernel).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import threading
from collections.abc import Iterator
from typing import Any

from .. import _core
from .machine import gpu_stem

__all__ = [
    "FORMAT", "VERSION", "TABLE_ENV", "PLANS_ENV", "PLANS", "ROW_BUCKETS_ENV", "ROW_BUCKETS",
    "SHIPPED_DIR", "document", "fp8_kernel", "load", "shipped_path", "runtime_rows", "plans_scope",
    "row_buckets", "install", "plan_kernel", "priced_as", "DISTGEMM", "CUBLASLT",
]  # fmt: skip

FORMAT, VERSION = "distgemm-kernel-table", 1
TABLE_ENV = "DISTGEMM_KERNEL_TABLE"  # a table file, or "off"
PLANS_ENV = "DISTGEMM_KERNEL_TABLE_PLANS"  # which plans consult the table: one of PLANS
PLANS = ("all", "one-rank")  # the first is the default
ROW_BUCKETS_ENV = "DISTGEMM_CUBLASLT_ROW_BUCKETS"  # one of ROW_BUCKETS
ROW_BUCKETS = ("off", "on")  # the first is the default
SHIPPED_DIR = pathlib.Path(__file__).resolve().parent.parent / "data" / "kernels"
DTYPES = ("bf16", "fp16", "e4m3")
# What an fp8 (e4m3) row also names: its GEMM's scale kinds and accumulation (the lookup matches
# them; kernel/kernel_table.hpp's fp8_kind_of).
FP8_FLAGS = ("scale_a_rows", "scale_b_rows", "fast_accum")
CUBLASLT = "cublaslt"
DISTGEMM = "distgemm"  # plan_kernel's answer for any of distgemm's own configurations

_lock = threading.Lock()
_installed: dict[str, Any] = {}  # what install() settled: see install
_plan_rows: list[dict[str, Any]] = []  # the rows plans of several ranks consult (scope "all")
_plan_kernels: dict[tuple[str, int, int, int], str] = {}  # plan_kernel's answers for _plan_rows
_plan_version = [0]  # bumped whenever _plan_rows is replaced


def check_rows(rows: Any, source: str) -> list[dict[str, Any]]:
    """``rows`` validated (ValueError naming ``source``, the row and the constraint)."""
    if not isinstance(rows, list):
        raise ValueError(f"{source}: 'rows' must be a list, got {type(rows).__name__}")
    names, fp8_names = kernel_names(False), kernel_names(True)
    out = []
    for i, r in enumerate(rows):
        where = f"{source}: row {i}"
        if not isinstance(r, dict):
            raise ValueError(f"{where} must be an object, got {type(r).__name__}")
        if r.get("dtype") not in DTYPES:
            raise ValueError(f"{where}: dtype {r.get('dtype')!r} is not one of {DTYPES}")
        for dim in ("m", "n", "k"):
            v = r.get(dim)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{where}: {dim} must be an integer >= 1, got {v!r}")
        fp8 = r["dtype"] == "e4m3"
        kernel, algo = _kernel(r, where, fp8_names if fp8 else names)
        row = {"dtype": r["dtype"], "m": r["m"], "n": r["n"], "k": r["k"], "kernel": kernel,
               "algo": algo}  # fmt: skip
        if "model" in r:  # the wave model's pick when the row was measured
            if r["model"] not in names:
                raise ValueError(f"{where}: model {r['model']!r} is not one of {sorted(names)}")
            row["model"] = r["model"]
        if "ms" in r:  # the times the row was chosen on
            ms = r["ms"]
            if not isinstance(ms, dict) or not all(
                isinstance(v, str) and isinstance(t, (int, float)) and t > 0 for v, t in ms.items()
            ):
                raise ValueError(f"{where}: ms must map variant names to times > 0, got {ms!r}")
            row["ms"] = dict(ms)
        if fp8:
            for flag in FP8_FLAGS:
                if not isinstance(r.get(flag, False), bool):
                    raise ValueError(f"{where}: {flag} must be true or false, got {r[flag]!r}")
                row[flag] = r.get(flag, False)
            fast_kernel = fp8_kernel(row["fast_accum"])
            if row["kernel"] not in (CUBLASLT, fast_kernel):
                raise ValueError(
                    f"{where}: kernel {row['kernel']!r} with fast_accum={row['fast_accum']}: "
                    f"distgemm's fp8 kernel of that accumulation is {fast_kernel!r}"
                )
        out.append(row)
    return out


def kernel_names(fp8: bool) -> set[str]:
    """The kernels a row of 16-bit (or fp8) GEMMs may name: distgemm's configurations and
    cuBLASLt."""
    configs = (
        _core.gemm_config_names("e4m3") if fp8 else _core.gemm_config_names("bf16", stream_k=True)
    )
    return set(configs) | {CUBLASLT}


def _kernel(r: dict[str, Any], where: str, allowed: set[str]) -> tuple[str, int]:
    """A row's or default's (kernel, algo): a name of ``allowed``, with cuBLASLt's rank (0 for
    one of distgemm's kernels); ValueError naming ``where`` and the constraint."""
    if r.get("kernel") not in allowed:
        raise ValueError(
            f"{where}: kernel {r.get('kernel')!r} is not one of {sorted(allowed)} "
            f"(dtype {r['dtype']})"
        )
    algo = r.get("algo", 0)
    if r["kernel"] == CUBLASLT and (not isinstance(algo, int) or algo < 0):
        raise ValueError(f"{where}: algo must be an integer >= 0, got {algo!r}")
    return r["kernel"], algo if r["kernel"] == CUBLASLT else 0


def check_defaults(defaults: Any, source: str) -> list[dict[str, Any]]:
    """A table's ``defaults`` validated: at most one per dtype, each a kernel as a row names it
    (ValueError naming ``source``, the entry and the constraint)."""
    if not isinstance(defaults, list):
        raise ValueError(f"{source}: 'defaults' must be a list, got {type(defaults).__name__}")
    names = kernel_names(False)
    out, seen = [], set()
    for i, d in enumerate(defaults):
        where = f"{source}: default {i}"
        if not isinstance(d, dict):
            raise ValueError(f"{where} must be an object, got {type(d).__name__}")
        if d.get("dtype") not in ("bf16", "fp16"):
            raise ValueError(f"{where}: dtype {d.get('dtype')!r} is not bf16 or fp16")
        if d["dtype"] in seen:
            raise ValueError(f"{where}: a second default for {d['dtype']}")
        seen.add(d["dtype"])
        kernel, algo = _kernel(d, where, names)
        out.append(dict(dtype=d["dtype"], kernel=kernel, algo=algo,
                        measured=d.get("measured", {})))  # fmt: skip
    return out


def fp8_kernel(fast_accum: bool) -> str:
    """distgemm's fp8 kernel of an accumulation mode (the one an fp8 row may name besides
    cuBLASLt)."""
    return _core.gemm_config_names("e4m3")[1 if fast_accum else 0]


def document(
    gpu: str,
    measured: dict[str, Any],
    rows: list[dict[str, Any]],
    defaults: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A table file's content: the format, the GPU model, how it was measured, the rows and the
    dtypes' defaults."""
    return dict(format=FORMAT, version=VERSION, gpu=gpu, measured=measured, rows=rows,
                defaults=list(defaults or []))  # fmt: skip


def load(path: str | os.PathLike) -> dict[str, Any]:
    """The table in ``path``, its rows validated; ValueError saying what is wrong."""
    p = pathlib.Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"kernel table {p}: cannot be read ({e})") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"kernel table {p}: not a {FORMAT} file")
    if data.get("version") != VERSION:
        raise ValueError(f"kernel table {p}: version {data.get('version')!r}, expected {VERSION}")
    if not isinstance(data.get("gpu"), str) or not data["gpu"]:
        raise ValueError(f"kernel table {p}: 'gpu' must name the GPU model it was measured on")
    data["rows"] = check_rows(data.get("rows"), str(p))
    data["defaults"] = check_defaults(data.get("defaults", []), str(p))
    return data


def shipped_path(gpu: str) -> pathlib.Path:
    """Where the package keeps the table of GPU model ``gpu`` (it may not exist)."""
    return SHIPPED_DIR / f"{gpu_stem(gpu)}.json"


def table_for(gpu: str) -> tuple[dict[str, Any] | None, str]:
    """The table that serves GPU model ``gpu`` and where it came from: ``DISTGEMM_KERNEL_TABLE``'s
    file ("off": none), else the shipped one, else none. A named file measured on another GPU
    model is refused (ValueError): its choices are another machine's."""
    env = os.environ.get(TABLE_ENV, "")
    if env.lower() == "off":
        return None, f"{TABLE_ENV}=off"
    if env:
        table = load(env)
        if table["gpu"] != gpu:
            raise ValueError(
                f"{TABLE_ENV}={env} was measured on {table['gpu']!r}, not on this GPU ({gpu!r}): "
                "a kernel table holds one GPU model's measurements"
            )
        return table, env
    path = shipped_path(gpu)
    if not path.exists():
        return None, f"no table shipped for {gpu!r} ({path.name})"
    return load(path), str(path)


def runtime_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    """What ``_core.set_kernel_table`` takes of a loaded table: its rows, then each default as a
    row of any shape (kernel/kernel_table.hpp consults it where no row is near)."""
    keys = ("dtype", "kernel", "algo")
    return list(table["rows"]) + [
        dict({k: d[k] for k in keys}, any_shape=True) for d in table.get("defaults", [])
    ]


def _switch(env: str, values: tuple[str, ...]) -> str:
    """The value of the environment variable ``env``, one of ``values`` (unset or empty: the
    first); ValueError naming the variable and its values for any other."""
    value = os.environ.get(env, "") or values[0]
    if value not in values:
        raise ValueError(f"{env}={value!r} is not one of {values}")
    return value


def plans_scope() -> str:
    """Which plans consult the table (``DISTGEMM_KERNEL_TABLE_PLANS``, default "all")."""
    return _switch(PLANS_ENV, PLANS)


def row_buckets() -> str:
    """Whether cuBLASLt GEMMs share their row bucket's algorithm (``DISTGEMM_CUBLASLT_ROW_BUCKETS``,
    default "off")."""
    return _switch(ROW_BUCKETS_ENV, ROW_BUCKETS)


def install(device) -> dict[str, Any]:
    """Hands the table of ``device``'s GPU model to the runtime, once per process (the GPUs of
    one node are of one model), for the plans ``plans_scope`` names, with ``row_buckets``'s
    setting. Returns {"source", "rows" (measured rows), "defaults" (e.g. "bf16: cublaslt:0"),
    "gpu", "plans", "row_buckets"}; {} without the CUDA
    runtime, for a CPU device or under a torch without CUDA. With no table the runtime keeps the
    wave model's choices."""
    import torch

    if (
        not getattr(_core, "cuda_runtime", False)
        or getattr(device, "type", "cuda") != "cuda"
        or not torch.cuda.is_available()
    ):
        return {}  # no CUDA runtime, a CPU device or a torch without CUDA: no kernel to choose
    with _lock:
        if _installed:
            return dict(_installed)
        scope, buckets = plans_scope(), row_buckets()
        _core.set_cublaslt_row_buckets(buckets == "on")
        gpu = torch.cuda.get_device_properties(device).name
        table, source = table_for(gpu)
        rows = runtime_rows(table) if table else []
        _core.set_kernel_table(rows, all_plans=scope == "all")
        _set_plan_rows(rows if scope == "all" else [])
        defaults = [f"{d['dtype']}: {d['kernel']}" + (f":{d['algo']}" if d["kernel"] == CUBLASLT
                    else "") for d in (table or {}).get("defaults", [])]  # fmt: skip
        _installed.update(source=source, rows=len(table["rows"]) if table else 0,
                          defaults=defaults, gpu=gpu, plans=scope, row_buckets=buckets)  # fmt: skip
        return dict(_installed)


def installed() -> dict[str, Any]:
    """What ``install`` settled ({} before it ran): for memory_stats-style reports."""
    with _lock:
        return dict(_installed)


def plan_kernel(dtype: str, m: int, n: int, k: int) -> str:
    """Which kernel a plan of several ranks runs for its sub-GEMM m x n x k of ``dtype`` ("bf16"
    or "fp16") under the installed table: CUBLASLT where the table's row near the shape, or
    else its default for the dtype, is cuBLASLt; DISTGEMM otherwise, and wherever plans of
    several ranks do not consult a table (none installed, scope "one-rank"). The lookup is the
    runtime's own (``_core.kernel_table_row``), so the cost model prices what runs; each
    shape's answer is kept until the rows change."""
    key = (dtype, m, n, k)
    with _lock:
        if key in _plan_kernels:
            return _plan_kernels[key]
        rows, version = list(_plan_rows), _plan_version[0]
    hit = _core.kernel_table_row(rows, dtype, m, n, k) if rows else None
    kernel = CUBLASLT if hit is not None and rows[hit]["kernel"] == CUBLASLT else DISTGEMM
    with _lock:
        if version == _plan_version[0]:  # not replaced meanwhile (install, priced_as)
            _plan_kernels[key] = kernel
    return kernel


def _set_plan_rows(rows: list[dict[str, Any]]) -> None:
    """Replaces the rows plan_kernel consults, and its answers (the caller holds _lock)."""
    _plan_rows[:] = rows
    _plan_kernels.clear()
    _plan_version[0] += 1


@contextlib.contextmanager
def priced_as(table: dict[str, Any] | None) -> Iterator[None]:
    """Within it, ``plan_kernel`` answers as if ``table`` (a loaded table; None: none) were
    installed for every plan, while the runtime's own table stays as it is: host-only, for
    pricing stored runs of another machine (``benchmarks.sweep.fit_path_model``)."""
    with _lock:
        saved = list(_plan_rows)
        _set_plan_rows(runtime_rows(table) if table else [])
    try:
        yield
    finally:
        with _lock:
            _set_plan_rows(saved)
