"""The machine constants behind the cost model: one calibration per GPU model, TP and NVLink
topology, stored as JSON, and the lookup of the one that prices a communicator's calls.

A calibration (``python -m distgemm.tune --calibrate``, ``distgemm.calibrate``) measures the
constants on the deployment's GPUs; the package ships those of the machines it was measured on
(``distgemm/data/machines/*.json``). The lookup, for a GPU model, TP and topology:

1. the calibration of exactly that key (``DISTGEMM_CALIBRATION``'s file or directory, else
   ``~/.cache/distgemm/machines``, first; then the shipped ones);
2. else one of the same GPU model and topology at other TPs, with its TP-dependent terms
   predicted (``MachineConstants.at_tp``: the collectives' latency on a line through the TPs
   measured, by ring hops; the copy engine's aggregate bandwidth with more peers than measured
   stays at the most peers measured);
3. else none: the cost model then keeps the collective path (never slower than it).

Pure data and arithmetic: no torch (``local_key`` imports it to read the device); ``_core`` for
the names of our all-reduce's algorithms.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .. import _core

__all__ = [
    "MachineKey",
    "MachineConstants",
    "ReduceConstants",
    "load",
    "find",
    "CALIBRATION_ENV",
    "SHIPPED_DIR",
    "FUSED_PATHS",
    "FUSED_KERNELS",
    "fused_constants_key",
]

FORMAT, VERSION = "distgemm-machine-constants", 1
CALIBRATION_ENV = "DISTGEMM_CALIBRATION"  # a calibration file, or a directory of them
SHIPPED_DIR = pathlib.Path(__file__).resolve().parent.parent / "data" / "machines"
# Where a calibration goes and is found when DISTGEMM_CALIBRATION names no directory.
USER_DIR = pathlib.Path("~/.cache/distgemm/machines").expanduser()
TRANSPORTS = ("all_gather", "epilogue", "copy")
COLLECTIVES = ("all_gather", "reduce_scatter")
NVML_NVLINK_MAX_LINKS = 18  # nvml.h's NVML_NVLINK_MAX_LINKS (Hopper: 18 links)
# The all-reduce algorithms a calibration prices: NCCL's and our kernel's (runtime/allreduce.py).
ALL_REDUCES = ("nccl", *_core.ALLREDUCE_ALGORITHMS)
# The fused GEMM + all-reduce as paths of gemm_all_reduce, each with its tail (_core.FUSED_TAILS):
# "fused" the one-shot tail, "fused_two_shot" the two-shot one (the CUTLASS kernel's only). The
# decode model prices each as a candidate of the same name.
FUSED_PATHS = {"fused": "one_shot", "fused_two_shot": "two_shot"}
# The keys of the fused constants (fused_constants_key): each kernel with the one-shot tail, and
# the CUTLASS kernel with the two-shot tail. A calibration that did not price one leaves it out.
FUSED_KERNELS = ("decode", "cutlass", "cutlass_two_shot")


def fused_constants_key(m: int, tail: str) -> str:
    """The key of the fused constants that price m tokens with ``tail``: the kernel that runs
    them (``_core.fused_kernel``), suffixed by any tail but the one-shot."""
    kernel = _core.fused_kernel(m)
    return kernel if tail == "one_shot" else f"{kernel}_{tail}"


@dataclass(frozen=True)
class ReduceConstants:
    """The constants of ``gemm_all_reduce`` at the token counts a calibration measured (ms, bytes,
    flops; per rank), where the GEMM streams its weight and the all-reduce is latency bound:

    - ``mm``: torch.mm, (launch ms, ms per byte of its operands and result, ms per flop);
    - ``all_reduce``: per algorithm (``ALL_REDUCES``), (latency ms, ms per byte of the vector);
    - ``fused``: per fused kernel and tail (``FUSED_KERNELS``), its overhead over torch.mm:
      (fixed ms, ms per byte of the weight, ms per token and partial, ms per byte pushed to the
      peers: the result times TP - 1 times the partials); a key absent is never offered;
    - ``fused_resident_ctas``: per fused kernel (``_core.fused_kernel``: "decode", "cutlass"),
      its CTAs resident at once on the machine, from which ``_core.fused_splits`` gives the
      partials per rank of a tile's sum; a kernel absent is priced with one partial per tile;
    - ``max_tokens``, ``max_bytes``: the most tokens and the largest all-reduce measured; the
      model prices nothing beyond them;
    - ``choice_error``: as ``MachineConstants.choice_error``, for the gains over mm + NCCL of
      every candidate together;
    - ``candidate_errors``: the same per candidate (``reduce_cost.error_key`` names:
      "collective/one_shot", ..., and per fused kernel and tail "fused/decode", "fused/cutlass",
      "fused/cutlass_two_shot"; an earlier file's "fused", "fused_two_shot" are read too), each
      the margin that candidate needs (absent: choice_error).
    """

    mm: tuple[float, float, float]
    all_reduce: dict[str, tuple[float, float]]
    fused: dict[str, tuple[float, float, float, float]]
    max_tokens: int
    max_bytes: int
    choice_error: float
    candidate_errors: dict[str, float] = field(default_factory=dict)
    fused_resident_ctas: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "mm": list(self.mm),
            "all_reduce": {k: list(v) for k, v in self.all_reduce.items()},
            "fused": {k: list(v) for k, v in self.fused.items()},
            "max_tokens": self.max_tokens,
            "max_bytes": self.max_bytes,
            "choice_error": self.choice_error,
            "candidate_errors": dict(self.candidate_errors),
            "fused_resident_ctas": dict(self.fused_resident_ctas),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ReduceConstants:
        return cls(
            mm=_triple(d["mm"]),
            all_reduce={k: _pair(v) for k, v in d["all_reduce"].items()},
            fused={k: tuple(float(x) for x in v) for k, v in d["fused"].items()},
            max_tokens=int(d["max_tokens"]),
            max_bytes=int(d["max_bytes"]),
            choice_error=float(d["choice_error"]),
            candidate_errors={k: float(v) for k, v in d.get("candidate_errors", {}).items()},
            fused_resident_ctas={k: int(v) for k, v in d.get("fused_resident_ctas", {}).items()},
        )

    def problem(self) -> str | None:
        """Why these constants cannot price anything (None: they can)."""
        if "nccl" not in self.all_reduce:
            return "reduce.all_reduce has no NCCL constants (the baseline)"
        unknown = (set(self.all_reduce) - set(ALL_REDUCES)) | (set(self.fused) - set(FUSED_KERNELS))
        if unknown:
            return f"reduce names unknown algorithms or kernels {sorted(unknown)}"
        if any(len(v) != 4 for v in self.fused.values()):
            return "reduce.fused needs 4 constants per kernel and tail"
        if self.max_tokens < 1 or self.max_bytes < 1:
            return (
                f"reduce.max_tokens {self.max_tokens} and max_bytes {self.max_bytes} must be >= 1"
            )
        if not 0 <= self.choice_error < 1:
            return f"reduce.choice_error {self.choice_error} is not in [0, 1)"
        bad = {k: v for k, v in self.candidate_errors.items() if not 0 <= v < 1}
        if bad:
            return f"reduce.candidate_errors {bad} are not in [0, 1)"
        bad = {k: v for k, v in self.fused_resident_ctas.items() if v < 1}
        if bad:
            return f"reduce.fused_resident_ctas {bad} must be at least 1"
        return None


@dataclass(frozen=True)
class MachineKey:
    """What a calibration is keyed by: the GPU's model name (``torch.cuda`` device name), the
    TP, and the NVLink topology seen from one GPU (e.g. "nvlink18": 18 active NVLinks; "pcie")."""

    gpu: str
    tp: int
    topology: str

    def slug(self) -> str:
        """A file name stem for this key (named in every model choice's ``why``: computed once
        per key)."""
        return _slug(self.gpu, self.tp, self.topology)


def gpu_stem(gpu: str) -> str:
    """A file name stem for a GPU model name: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"
    (the machine files' and the kernel tables' names start with it)."""
    stem = "".join(c if c.isalnum() else "-" for c in gpu.lower()).strip("-")
    while "--" in stem:
        stem = stem.replace("--", "-")
    return stem


@functools.lru_cache(maxsize=64)
def _slug(gpu: str, tp: int, topology: str) -> str:
    return f"{gpu_stem(gpu)}-tp{tp}-{topology}"


@dataclass(frozen=True)
class MachineConstants:
    """The cost model's constants of one machine key (ms, bytes, flops; per rank).

    - ``slots``: CTAs of one GEMM kernel resident at once (the wave model's slots).
    - ``gemm_launch_ms``, ``gemm_ms_per_k``: our kernel, ``launch + k * (full * tiles / slots +
      wave * waves)`` per tile width {128: (full, wave), 256: (...)}.
    - ``mm_launch_ms``, ``mm_flops_per_ms``: torch's GEMM (cuBLAS), ``launch + flops / rate``.
    - ``copy_latency_ms``, ``copy_bytes_per_ms``: a copy-engine peer copy, ``latency + bytes /
      bandwidth``; entry p-1 is the aggregate bandwidth into one GPU when p peers send at once.
    - ``nccl``: per collective (latency ms, ms per byte moved per rank, share of the GEMM time
      added on the collective path).
    - ``overlap``: the overlapped plan beyond its GEMMs, per transport (ms per step, share of the
      steps' GEMM time, ms per byte moved per rank); the share is at least
      ``calibration_fit.OVERLAP_SHARE_FLOOR``, every other constant at least 0.
    - ``choice_error``: how far the model over-predicts the overlapped plan's gain over the
      collective path in the calibration's own runs, as a share of the collective time (root
      mean square of the over-predictions, each weighted by its collective ms,
      ``calibration_fit.over_prediction``): the choice takes a predicted gain only beyond it
      (less the tolerated loss, ``cost_model``).
    - ``reduce``: ``gemm_all_reduce`` at decode token counts (``ReduceConstants``), or None
      where the calibration did not measure it (the model then keeps mm + NCCL there).
    - ``steps_by_table``: whether the calibration's overlapped runs had steps on cuBLASLt by the
      machine's kernel table (``calibration_fit``): only then does the model price a plan's
      steps as the installed table runs them; otherwise as distgemm's kernel, the kernel its
      overlap terms were fitted with.
    - ``meta``: where the numbers come from (command, date, device, versions, the fit's errors).
    """

    key: MachineKey
    slots: int
    gemm_launch_ms: float
    gemm_ms_per_k: dict[int, tuple[float, float]]
    mm_launch_ms: float
    mm_flops_per_ms: float
    copy_latency_ms: float
    copy_bytes_per_ms: tuple[float, ...]
    nccl: dict[str, tuple[float, float, float]]
    overlap: dict[str, tuple[float, float, float]]
    choice_error: float
    reduce: ReduceConstants | None = None
    steps_by_table: bool = False
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def link_bytes_per_ms(self, peers: int = 1) -> float:
        """Aggregate copy-engine bandwidth into one GPU from ``peers`` peers at once (the most
        peers measured where more are asked)."""
        bw = self.copy_bytes_per_ms
        return bw[min(max(peers, 1), len(bw)) - 1]

    def at_tp(self, tp: int, others: list[MachineConstants] = ()) -> MachineConstants:
        """These constants predicted at ``tp``: the per-GPU terms (GEMMs, copy engine, overlap)
        as they are, the collectives' latency on the line through (hops, latency) of this and
        ``others`` (the same GPU and topology at other TPs; hops = TP - 1), never below the
        least measured; from this one alone, its latency (NCCL's small-message protocols do not
        pay per hop what its ring would: keeping the latency under-prices the collective path,
        so the prediction leans to the baseline)."""
        if tp == self.key.tp:
            return self
        nccl = {
            name: (_on_line([(c.key.tp, c.nccl[name][0]) for c in (self, *others)], tp), b, sh)
            for name, (_, b, sh) in self.nccl.items()
        }
        measured = sorted(c.key.tp for c in (self, *others))
        return replace(
            self,
            key=replace(self.key, tp=tp),
            nccl=nccl,
            reduce=self._reduce_at(tp, others),
            meta={**self.meta, "predicted_from_tp": measured},
        )

    def _reduce_at(self, tp: int, others) -> ReduceConstants | None:
        """``reduce`` predicted at ``tp`` as the collectives are: each all-reduce's latency and
        each fused kernel's fixed cost on the line through the TPs measured (those of ``others``
        that have reduce constants), the per-byte and per-flop terms as they are."""
        if self.reduce is None:
            return None
        known = [c for c in (self, *others) if c.reduce is not None]
        all_reduce = {
            a: (_on_line([(c.key.tp, c.reduce.all_reduce[a][0]) for c in known
                          if a in c.reduce.all_reduce], tp), per_byte)
            for a, (_, per_byte) in self.reduce.all_reduce.items()
        }  # fmt: skip
        fused = {
            f: (_on_line([(c.key.tp, c.reduce.fused[f][0]) for c in known
                          if f in c.reduce.fused], tp), *rest)
            for f, (_, *rest) in self.reduce.fused.items()
        }  # fmt: skip
        return replace(self.reduce, all_reduce=all_reduce, fused=fused)

    # -- JSON ------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["gemm_ms_per_k"] = {str(t): list(v) for t, v in self.gemm_ms_per_k.items()}
        d["nccl"] = {k: list(v) for k, v in self.nccl.items()}
        d["overlap"] = {k: list(v) for k, v in self.overlap.items()}
        d["copy_bytes_per_ms"] = list(self.copy_bytes_per_ms)
        d["reduce"] = self.reduce.to_json() if self.reduce is not None else None
        return {"format": FORMAT, "version": VERSION, **d}

    @classmethod
    def from_json(cls, d: dict[str, Any], source: str = "") -> MachineConstants:
        """Constants from their JSON form; ValueError naming ``source`` and the problem."""
        where = source or "machine constants"
        if d.get("format") != FORMAT or d.get("version") != VERSION:
            raise ValueError(
                f"{where}: not a {FORMAT} file of version {VERSION} "
                f"(format {d.get('format')!r}, version {d.get('version')!r})"
            )
        try:
            key = MachineKey(str(d["key"]["gpu"]), int(d["key"]["tp"]), str(d["key"]["topology"]))
            mc = cls(
                key=key,
                slots=int(d["slots"]),
                gemm_launch_ms=float(d["gemm_launch_ms"]),
                gemm_ms_per_k={int(t): _pair(v) for t, v in d["gemm_ms_per_k"].items()},
                mm_launch_ms=float(d["mm_launch_ms"]),
                mm_flops_per_ms=float(d["mm_flops_per_ms"]),
                copy_latency_ms=float(d["copy_latency_ms"]),
                copy_bytes_per_ms=tuple(float(x) for x in d["copy_bytes_per_ms"]),
                nccl={k: _triple(d["nccl"][k]) for k in COLLECTIVES},
                overlap={k: _triple(d["overlap"][k]) for k in TRANSPORTS},
                choice_error=float(d["choice_error"]),
                reduce=ReduceConstants.from_json(d["reduce"]) if d.get("reduce") else None,
                steps_by_table=bool(d.get("steps_by_table", False)),
                meta=dict(d.get("meta", {})),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: missing or malformed field: {type(e).__name__}: {e}") from e
        problem = mc.problem()
        if problem:
            raise ValueError(f"{where}: {problem}")
        return mc

    def problem(self) -> str | None:
        """Why these constants cannot price anything (None: they can)."""
        if self.key.tp < 1 or self.slots < 1:
            return f"tp {self.key.tp} and slots {self.slots} must be >= 1"
        if set(self.gemm_ms_per_k) != {128, 256}:
            return f"gemm_ms_per_k has tiles {sorted(self.gemm_ms_per_k)}, not [128, 256]"
        rates = [self.mm_flops_per_ms, *self.copy_bytes_per_ms]
        if not self.copy_bytes_per_ms or min(rates) <= 0:
            return "the GEMM rate and every copy bandwidth must be positive"
        if not 0 <= self.choice_error < 1:
            return f"choice_error {self.choice_error} is not in [0, 1)"
        return self.reduce.problem() if self.reduce is not None else None

    def save(self, path: str | os.PathLike) -> None:
        pathlib.Path(path).write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")


def _on_line(points: list[tuple[int, float]], tp: int) -> float:
    """A latency at ``tp`` from (TP, latency) points: on the line through the fewest and the
    most ring hops (TP - 1) measured, never below the least measured; the one point's latency
    where only one TP was measured (small-message protocols do not pay per hop what a ring
    would: keeping it under-prices the baseline collective, so predictions lean to it)."""
    pts = sorted({(t - 1, y) for t, y in points})
    if len(pts) < 2:
        return pts[0][1]
    (x0, y0), (x1, y1) = pts[0], pts[-1]
    slope = (y1 - y0) / (x1 - x0) if x1 != x0 else 0.0
    return max(y1 + slope * (tp - 1 - x1), min(y for _, y in pts))


def _pair(v) -> tuple[float, float]:
    a, b = v
    return float(a), float(b)


def _triple(v) -> tuple[float, float, float]:
    a, b, c = v
    return float(a), float(b), float(c)


def load(path: str | os.PathLike) -> MachineConstants:
    """The constants in the file at ``path``; ValueError naming it when it is not one."""
    p = pathlib.Path(path)
    try:
        d = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"machine constants {p}: cannot be read: {e}") from e
    return MachineConstants.from_json(d, str(p))


def _files(directory: pathlib.Path) -> list[pathlib.Path]:
    return sorted(directory.glob("*.json")) if directory.is_dir() else []


def calibration_dir() -> pathlib.Path:
    """The directory of this user's calibrations: ``DISTGEMM_CALIBRATION`` where it names a
    directory, else USER_DIR."""
    env = os.environ.get(CALIBRATION_ENV)
    return pathlib.Path(env) if env and pathlib.Path(env).is_dir() else USER_DIR


def candidates() -> list[MachineConstants]:
    """Every calibration the lookup sees: ``DISTGEMM_CALIBRATION``'s file where it names one,
    the calibration directory's files (``calibration_dir``), then the shipped ones. A file that
    cannot be read is an error naming it."""
    out: list[MachineConstants] = []
    env = os.environ.get(CALIBRATION_ENV)
    if env and not pathlib.Path(env).is_dir():
        out.append(load(env))
    out += [load(f) for f in _files(calibration_dir())]
    out += [load(f) for f in _files(SHIPPED_DIR)]
    return out


def find(key: MachineKey, pool: list[MachineConstants] | None = None) -> MachineConstants | None:
    """The constants that price calls on ``key``: the first of ``pool`` (default
    ``candidates()``) with exactly that key; else those of the same GPU and topology at the TP
    nearest to ``key.tp`` (the larger on a tie), predicted at ``key.tp``; else None."""
    pool = candidates() if pool is None else pool
    for mc in pool:
        if mc.key == key:
            return mc
    same = [mc for mc in pool if (mc.key.gpu, mc.key.topology) == (key.gpu, key.topology)]
    if not same:
        return None
    by_tp = {mc.key.tp: mc for mc in reversed(same)}  # the first file of each TP wins
    nearest = min(by_tp, key=lambda t: (abs(t - key.tp), -t))
    others = [mc for t, mc in by_tp.items() if t != nearest]
    return by_tp[nearest].at_tp(key.tp, others)


def local_key(device, tp: int) -> MachineKey:
    """The key of a communicator's machine: ``device``'s model name, ``tp``, and its topology
    (``topology``)."""
    import torch

    return MachineKey(torch.cuda.get_device_properties(device).name, tp, topology(device))


def topology(device) -> str:
    """The NVLink topology seen from ``device``: "nvlink<N>" with N its active NVLinks, "pcie"
    with none, "unknown" where the driver's NVML library cannot say. NVML through ctypes: the
    library ships with the driver, its Python module does not always."""
    import ctypes

    import torch

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return "unknown"
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        handle = ctypes.c_void_p()
        if nvml.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle)) != 0:
            return "unknown"
        links, state = 0, ctypes.c_int()
        for link in range(NVML_NVLINK_MAX_LINKS):
            if nvml.nvmlDeviceGetNvLinkState(handle, link, ctypes.byref(state)) != 0:
                break  # past the device's last link, or no NVLink at all
            links += state.value == 1
        return f"nvlink{links}" if links else "pcie"
    except (OSError, AttributeError):
        return "unknown"


_FOUND: dict[tuple, MachineConstants | None] = {}


def constants_for(device, tp: int) -> MachineConstants | None:
    """``find(local_key(device, tp))``, looked up once per device, TP and
    ``DISTGEMM_CALIBRATION`` value in a process; None off CUDA devices."""
    import torch

    if getattr(device, "type", "cuda") != "cuda" or not torch.cuda.is_available():
        return None
    memo = (getattr(device, "index", device), tp, os.environ.get(CALIBRATION_ENV))
    if memo not in _FOUND:
        _FOUND[memo] = find(local_key(device, tp))
    return _FOUND[memo]
