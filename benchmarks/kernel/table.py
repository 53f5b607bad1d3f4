"""The kernel table a kernel-vs-cuBLAS run writes (distgemm.runtime.kernel_table's format): per
measured shape the kernel to run, the dtype's default for shapes no row is near, the merge of
the tables of several GPUs' parts of one run, and the table of stored runs. Pure (no torch, no
GPU): records in, a table document out; benchmarks/kernel/report.py reads the records."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.kernel.report import configs_of, cublas_name, cublas_rank, derived, stored_runs
from distgemm.runtime import kernel_table as kernel_table_module

# A kernel table row keeps the model's pick unless the fastest variant beats it by more than this
# (the spread of repeated steady-state windows of one kernel, docs/tuning.md): a choice is not
# changed on noise.
TABLE_MARGIN = 0.01


def table_pick(ms: dict[str, float], incumbent: str, variants: Sequence[str]) -> str:
    """The variant a kernel table row names among ``variants`` (all timed in ``ms``): the fastest,
    unless ``incumbent`` is within TABLE_MARGIN of it (a choice is not changed on noise)."""
    fastest = min(variants, key=lambda v: ms[v])
    return incumbent if ms[incumbent] <= (1.0 + TABLE_MARGIN) * ms[fastest] else fastest


def table_defaults(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bf16 default of a kernel table (what serves the GEMMs no row is near): the cuBLASLt
    rank whose time over the wave model's pick has the lowest median over the rows that timed
    both, where that median is below 1 - TABLE_MARGIN, i.e. where on the measured shapes it beats
    the model by more than the margin at the median; none (the model decides) otherwise. Rows
    without "model" and "ms" (a table stored without its times) take no part."""
    timed = [r for r in rows if r.get("dtype") == "bf16" and r.get("model") in r.get("ms", {})]
    ratios: dict[int, list[float]] = {}
    for r in timed:
        for v, t in r["ms"].items():
            rank = cublas_rank(v)
            if rank is not None:
                ratios.setdefault(rank, []).append(t / r["ms"][r["model"]])
    medians = {rank: statistics.median(q) for rank, q in ratios.items()}
    if not medians:
        return []
    rank = min(medians, key=lambda a: (medians[a], a))
    if medians[rank] >= 1.0 - TABLE_MARGIN:
        return []
    measured = dict(
        rule=f"median time over the model's pick below {1.0 - TABLE_MARGIN:g}",
        shapes=len(ratios[rank]),
        median_over_model={cublas_name(a): round(m, 4) for a, m in sorted(medians.items())},
        worst_over_model=round(max(ratios[rank]), 4),
    )
    return [dict(dtype="bf16", kernel="cublaslt", algo=rank, measured=measured)]


def kernel_table(records: Sequence[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """A kernel table (distgemm.runtime.kernel_table's format) from a run's records: one row per
    measured shape, the fastest timed variant, or the model's pick where that is within
    TABLE_MARGIN of it, with the model's pick and the times; and the default (table_defaults).
    Shapes not measured, or without every variant timed, get no row."""
    rows = []
    for rec in records:
        d = derived(rec)
        ms, model = rec.get("ms", {}), rec.get("model_config")
        if rec.get("status") != "ok" or not d["fastest_config"] or not model or not ms.get(model):
            continue
        pick = table_pick(ms, model, configs_of(rec))
        rank = cublas_rank(pick)
        rows.append(
            dict(
                dtype="bf16", m=rec["m"], n=rec["n"], k=rec["k"],
                kernel="cublaslt" if rank is not None else pick,
                algo=rank if rank is not None else 0,
                model=model,
                ms={v: round(t, 5) for v, t in ms.items()},
            )
        )  # fmt: skip
    return kernel_table_module.document(
        meta.get("device", ""), table_measured(meta), rows, table_defaults(rows)
    )


def table_measured(meta: dict[str, Any]) -> dict[str, Any]:
    """How a run's kernel table was measured, from the run's meta."""
    keys = ("date", "torch", "args", "cublaslt_version", "timing")
    return dict({k: meta.get(k) for k in keys}, margin=TABLE_MARGIN)


def merge_tables(tables: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One kernel table from several of one GPU model (each a part of the shapes, measured on its
    own GPU of one machine): the rows of all, a shape measured twice keeping its first row, and the
    first table's provenance with the number of parts and, under "merged", the date and
    arguments of every other run (and of the runs each table had merged in already). ValueError
    for tables of different GPU models."""
    gpus = sorted({t["gpu"] for t in tables})
    if len(gpus) != 1:
        raise ValueError(f"the tables were measured on different GPU models: {gpus}")
    seen, rows = set(), []
    for t in tables:
        for r in t["rows"]:
            key = (r["dtype"], r["m"], r["n"], r["k"]) + tuple(
                r.get(f, False) for f in ("scale_a_rows", "scale_b_rows", "fast_accum")
            )  # an fp8 row's key has its scale kinds and accumulation too
            if key not in seen:
                seen.add(key)
                rows.append(r)
    out = dict(tables[0], rows=rows, defaults=table_defaults(rows))
    first = tables[0].get("measured") or {}
    merged = list(first.get("merged", []))  # runs merged into the first table earlier
    for t in tables[1:]:  # the other runs' provenance (e.g. fp8 rows merged into a bf16 table)
        m = t.get("measured") or {}
        if m and m.get("args") != first.get("args"):
            merged.append({f: m[f] for f in ("date", "args") if f in m})
        merged.extend(e for e in m.get("merged", []) if e not in merged)
    out["measured"] = dict(first, parts=len(tables), **({"merged": merged} if merged else {}))
    return out


def table_of_runs(paths: Sequence[str]) -> dict[str, Any]:
    """The kernel table of stored runs (parts of one list, in the order given): the first run's
    provenance, with the number of parts and the files read."""
    runs, records = stored_runs(paths)
    doc = kernel_table(records, runs[0]["meta"])
    doc["measured"].update(parts=len(runs), records=[os.path.basename(p) for p in paths])
    return doc
