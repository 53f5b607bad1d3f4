"""Tuning tables: a JSON file a deployment ships that fixes, per shape bucket, the path, the steps S
and the GEMM tile of ``path="auto"`` calls with ``steps=None``; its format, validation, the
process-wide active table and the lookup.

A table is written by ``python -m distgemm.tune`` (measured ahead of time on the deployment's
GPUs) and read from ``DISTGEMM_TUNING_TABLE`` at the first op call, or set with
``distgemm.load_tuning_table(path)``. Without one, ``runtime.cost_model`` decides. Format::

    {"format": "distgemm-tuning-table", "version": 1, "meta": {...},
     "entries": [{"op": "all_gather_gemm", "schedule": "ag_rotate_a", "tp": 2, "dtype": "bf16",
                  "n": 57344, "k": 8192, "tokens": 4096,
                  "path": "overlap", "steps": 2, "tile_n": 0,
                  "ms": {"collective": 3.06, "overlap/S2/auto": 3.04, ...}}, ...]}

``n``, ``k``: the op's global N and K (as ``path_choices()`` reports them). ``tokens``: the
bucket, a power of two; a call with M tokens (global M) takes the bucket ``2**floor(log2(M))``,
i.e. bucket b holds b .. 2b-1 tokens. ``path``: the faster of the collective path and the best
overlapped candidate; ``steps`` and ``tile_n`` (0: per GEMM by the kernel's wave model, 128,
256) are that overlapped candidate's, so they also serve ``path="overlap"`` calls. ``ms``: the
measured ms of every candidate (information; the choice is ``path``/``steps``/``tile_n``).
``meta`` is free-form (device, date, command) and not part of the table's digest.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import _core

__all__ = ["TableEntry", "TuningTable", "load_tuning_table", "active_table", "token_bucket"]

FORMAT, VERSION = "distgemm-tuning-table", 1
TABLE_ENV = "DISTGEMM_TUNING_TABLE"  # path of the table the first op call loads
OPS = {
    "all_gather_gemm": "all_gather",
    "gemm_reduce_scatter": "reduce_scatter",
    "gemm_all_reduce": "all_reduce",
}
DTYPES = ("bf16", "fp16")
PATHS = ("overlap", "collective")
TILES = (0, 128, 256)
_SCHEDULES = {d["name"]: d["collective"] for d in _core.schedules()}


def token_bucket(tokens: int) -> int:
    """The bucket of ``tokens`` (M >= 1): the largest power of two at or below it."""
    return 1 << (int(tokens).bit_length() - 1)


def candidate_name(path: str, steps: int = 0, tile_n: int = 0) -> str:
    """A candidate's key in ``ms``: "collective" or "overlap/S{steps}/{auto|n128|n256}"."""
    if path == "collective":
        return "collective"
    return f"overlap/S{steps}/{'auto' if tile_n == 0 else f'n{tile_n}'}"


@dataclass(frozen=True)
class TableEntry:
    op: str
    schedule: str
    tp: int
    dtype: str
    n: int
    k: int
    tokens: int
    path: str
    steps: int
    tile_n: int
    ms: dict[str, float] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> tuple:
        return (self.op, self.schedule, self.tp, self.dtype, self.n, self.k, self.tokens)

    def describe(self) -> str:
        return (
            f"{self.op} {self.schedule} TP={self.tp} {self.dtype} N={self.n} K={self.k} "
            f"tokens {self.tokens}..{2 * self.tokens - 1}"
        )


def _int(where: str, name: str, value, lo: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ValueError(f"{where}: {name}={value!r} is not an integer >= {lo}")
    return value


def _choice(where: str, name: str, value, allowed) -> Any:
    if value not in allowed:
        raise ValueError(f"{where}: {name}={value!r} is not one of {', '.join(map(repr, allowed))}")
    return value


def parse_entry(raw: Any, where: str) -> TableEntry:
    """One entry of a table file, validated; ValueError naming the field and the value."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: an entry must be an object, got {type(raw).__name__}")
    fields = ("op", "schedule", "tp", "dtype", "n", "k", "tokens", "path", "steps", "tile_n")
    for name in fields:
        if name not in raw:
            raise ValueError(f"{where}: the field {name!r} is missing")
    extra = sorted(set(raw) - set(fields) - {"ms"})
    if extra:
        raise ValueError(f"{where}: unknown field {extra[0]!r}")
    op = _choice(where, "op", raw["op"], tuple(OPS))
    schedule = raw["schedule"]
    if _SCHEDULES.get(schedule) != OPS[op]:
        fits = sorted(s for s, c in _SCHEDULES.items() if c == OPS[op])
        raise ValueError(
            f"{where}: schedule={schedule!r} is not a {OPS[op]} schedule (one of {', '.join(fits)})"
        )
    tp = _int(where, "tp", raw["tp"])
    if tp > 8:
        raise ValueError(f"{where}: tp={tp} is more than 8")
    tokens = _int(where, "tokens", raw["tokens"])
    if tokens & (tokens - 1):
        raise ValueError(f"{where}: tokens={tokens} is not a power of two (a bucket's first M)")
    steps = _int(where, "steps", raw["steps"])
    if steps % tp:
        raise ValueError(f"{where}: steps={steps} is not a multiple of tp={tp}")
    ms = raw.get("ms", {})
    if not isinstance(ms, dict):
        raise ValueError(f"{where}: ms must be an object of candidate -> ms, got {ms!r}")
    for name, v in ms.items():
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
        if not ok:
            raise ValueError(f"{where}: ms[{name!r}]={v!r} is not a positive number")
    return TableEntry(
        op=op,
        schedule=schedule,
        tp=tp,
        dtype=_choice(where, "dtype", raw["dtype"], DTYPES),
        n=_int(where, "n", raw["n"]),
        k=_int(where, "k", raw["k"]),
        tokens=tokens,
        path=_choice(where, "path", raw["path"], PATHS),
        steps=steps,
        tile_n=_choice(where, "tile_n", raw["tile_n"], TILES),
        ms={str(k): float(v) for k, v in ms.items()},
    )


class TuningTable:
    """A validated table: entries by (op, schedule, tp, dtype, n, k, token bucket)."""

    def __init__(self, entries: list[TableEntry], source: str = "<table>", meta=None):
        self.source, self.meta = source, dict(meta or {})
        self.entries: dict[tuple, TableEntry] = {}
        for i, e in enumerate(entries):
            if e.key in self.entries:
                raise ValueError(f"{source}: entries[{i}] repeats the bucket of {e.describe()}")
            self.entries[e.key] = e
        # What every rank compares at plan creation: the decisions, not the metadata.
        rows = sorted((list(e.key), e.path, e.steps, e.tile_n) for e in self.entries.values())
        self.digest = hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: Any, source: str = "<table>") -> TuningTable:
        if not isinstance(data, dict):
            raise ValueError(
                f"{source}: a tuning table is a JSON object, got {type(data).__name__}"
            )
        if data.get("format") != FORMAT:
            raise ValueError(f"{source}: format={data.get('format')!r} is not {FORMAT!r}")
        if data.get("version") != VERSION:
            raise ValueError(f"{source}: version={data.get('version')!r} is not {VERSION}")
        raw = data.get("entries")
        if not isinstance(raw, list):
            raise ValueError(f"{source}: entries={raw!r} is not a list")
        entries = [parse_entry(r, f"{source}: entries[{i}]") for i, r in enumerate(raw)]
        return cls(entries, source, data.get("meta"))

    @classmethod
    def load(cls, path: str | os.PathLike) -> TuningTable:
        p = pathlib.Path(path)
        try:
            data = json.loads(p.read_text())
        except OSError as e:
            raise ValueError(f"tuning table {p}: cannot be read ({e.strerror})") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"tuning table {p}: not JSON ({e})") from None
        return cls.from_dict(data, f"tuning table {p}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "meta": self.meta,
            "entries": [asdict(e) for e in sorted(self.entries.values(), key=lambda e: e.key)],
        }

    def save(self, path: str | os.PathLike) -> None:
        pathlib.Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    def lookup(self, op, schedule, tp, dtype, n, k, tokens) -> TableEntry | None:
        """The entry of the bucket holding ``tokens`` (global M), or None."""
        return self.entries.get((op, schedule, tp, dtype, n, k, token_bucket(tokens)))


# The process-wide table: None until the first lookup reads TABLE_ENV, then a TuningTable or
# False (none: the model decides).
_active: TuningTable | bool | None = None
_warned: set[tuple] = set()


def load_tuning_table(path: str | os.PathLike | None) -> TuningTable | None:
    """Make the table at ``path`` the one the ops use from now on (None: no table, the model
    decides); returns it. Validates the file (ValueError naming the field and the value). Load it
    on every rank before the first op call: plans already created keep their choices, and every
    rank's table digest must agree at plan creation (ValueError otherwise)."""
    global _active
    table = None if path is None else TuningTable.load(path)
    _active = table if table is not None else False
    _warned.clear()
    return table


def active_table() -> TuningTable | None:
    """The table the ops use: the loaded one, else the file named by ``DISTGEMM_TUNING_TABLE``
    (read once), else None."""
    global _active
    if _active is None:
        path = os.environ.get(TABLE_ENV)
        _active = TuningTable.load(path) if path else False
    return _active or None


def active_digest() -> str | None:
    """The active table's digest (None without a table): part of every plan signature. A table
    file that cannot be loaded gives its error instead of raising: the plan creation that read
    it has the same error as this rank's own, which every rank then reports."""
    try:
        table = active_table()
    except ValueError as e:
        return f"unreadable: {e}"
    return None if table is None else table.digest


def lookup(op, schedule, tp, dtype, n, k, tokens) -> TableEntry | None:
    table = active_table()
    return None if table is None else table.lookup(op, schedule, tp, dtype, n, k, tokens)


def warn_unusable(entry: TableEntry, m: int, why: str) -> None:
    """Warn once per entry that it does not fit a call's shape; the model then decides."""
    if entry.key in _warned:
        return
    _warned.add(entry.key)
    warnings.warn(
        f"distgemm tuning table: the entry for {entry.describe()} (steps={entry.steps}, "
        f"tile_n={entry.tile_n}) does not fit M={m}: {why}; the cost model decides for this "
        "bucket instead",
        RuntimeWarning,
        stacklevel=3,
    )
