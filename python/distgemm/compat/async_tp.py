"""The one switch for torch's async-TP: distgemm's drop-ins as the CUDA kernels of symm_mem's ops.

torch's micro-pipeline TP pass (``torch._inductor.config._micro_pipeline_tp = True``, what
torchtitan's ``enable_async_tensor_parallel`` sets) rewrites all-gather + matmul and matmul +
reduce-scatter in compiled graphs into calls of ``torch.ops.symm_mem``'s fused ops. ``install()``
registers a router as the CUDA kernel of the four of them in torch's dispatcher, so those graphs,
and eager calls of the ops, reach distgemm::

    torch.ops.symm_mem.<op>(args)           compiled graph or eager; the dispatcher picks CUDA
      router(<op>)                          this module's kernel, with torch's kernel kept
        reason = <op>'s reason(args)        compat.symm_mem / symm_mem_fp8: distgemm's own rules;
                                            TypeError / ValueError from its checks is a reason
        None   -> the distgemm drop-in      (under no_grad, as torch's op has no autograd)
        reason -> torch's CUDA kernel, the one the dispatcher held before install()

=================================== ======================================================
torch.ops.symm_mem op               served by
=================================== ======================================================
fused_all_gather_matmul             compat.symm_mem.fused_all_gather_matmul
fused_matmul_reduce_scatter         compat.symm_mem.fused_matmul_reduce_scatter
fused_all_gather_scaled_matmul      compat.symm_mem_fp8.fused_all_gather_scaled_matmul
fused_scaled_matmul_reduce_scatter  compat.symm_mem_fp8.fused_scaled_matmul_reduce_scatter
=================================== ======================================================

Every routed call is counted per process: ``routing_stats()`` gives, per op, the calls distgemm
served and those it gave back to torch with each reason (``reset_routing_stats()`` starts
over); the first call with a new reason is logged at INFO (logger ``distgemm.compat.async_tp``).
``install()`` also sets ``compat.gather_rewrite``'s graph rewrite as inductor's post-grad custom
pre-pass (chaining any set before), so that torch's pass fuses the sequence all-gather of a
batch-1 shard too, which DTensor emits in a form the pass does not match.
``uninstall()`` removes the router and the rewrite; torch's kernels are the active ones again.
Both are idempotent. ``DISTGEMM_ASYNC_TP=1`` at the import of ``distgemm.compat`` calls
``install()``.

Only the CUDA key is taken: the Meta kernels (shapes and strides under torch.compile) stay
torch's, and the drop-ins return torch's strides. The router decides per call, on every rank the
same (the rules read shapes, dtypes, devices and the group size), so every rank of a collective
takes the same side.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import warnings
from collections.abc import Callable, Mapping

import torch

from .. import _core
from . import gather_rewrite, symm_mem, symm_mem_fp8

__all__ = [
    "ENV",
    "OpRouting",
    "RoutingStats",
    "install",
    "installed",
    "make_router",
    "reset_routing_stats",
    "routing_stats",
    "uninstall",
]

ENV = "DISTGEMM_ASYNC_TP"  # "1": install() at the import of distgemm.compat; "0" or unset: not
NAMESPACE = "symm_mem"
DISPATCH_KEY = "CUDA"
NEEDS = "the switch needs torch's symm_mem fused ops and torch.library.get_kernel (torch >= 2.11)"
_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Route:
    """How the router serves one op: ``reason(*args, **kwargs)`` (the op's arguments) says why
    distgemm cannot (None: it can), ``serve(*args, **kwargs)`` is distgemm's drop-in."""

    reason: Callable[..., str | None]
    serve: Callable


# op name in torch.ops.symm_mem -> its route; read at every call (a test may swap an entry).
ROUTES: dict[str, Route] = {
    "fused_all_gather_matmul": Route(symm_mem.all_gather_matmul_reason, symm_mem.all_gather_matmul),
    "fused_matmul_reduce_scatter": Route(
        symm_mem.matmul_reduce_scatter_reason, symm_mem.matmul_reduce_scatter
    ),
    "fused_all_gather_scaled_matmul": Route(
        symm_mem_fp8.all_gather_scaled_matmul_reason,
        symm_mem_fp8.all_gather_scaled_matmul,
    ),
    "fused_scaled_matmul_reduce_scatter": Route(
        symm_mem_fp8.scaled_matmul_reduce_scatter_reason,
        symm_mem_fp8.scaled_matmul_reduce_scatter,
    ),
}


@dataclasses.dataclass(frozen=True)
class OpRouting:
    """One op's routed calls: ``served`` by distgemm, ``fallbacks`` (reason -> calls) given to
    torch's kernel."""

    served: int
    fallbacks: Mapping[str, int]

    @property
    def fallen_back(self) -> int:
        return sum(self.fallbacks.values())


@dataclasses.dataclass(frozen=True)
class RoutingStats:
    """What the router did in this process: whether it is installed, and per op (every op of
    ``ROUTES``) its OpRouting."""

    installed: bool
    ops: Mapping[str, OpRouting]

    @property
    def served(self) -> int:
        return sum(o.served for o in self.ops.values())

    @property
    def fallen_back(self) -> int:
        return sum(o.fallen_back for o in self.ops.values())


_lock = threading.Lock()
_served: dict[str, int] = {}
_fallbacks: dict[str, dict[str, int]] = {}
_library: torch.library.Library | None = None
_known_impls: set[str] = set()  # torch.library's record of python kernels that install() shadows


def _record(name: str, reason: str | None) -> None:
    with _lock:
        if reason is None:
            _served[name] = _served.get(name, 0) + 1
            return
        reasons = _fallbacks.setdefault(name, {})
        first = reason not in reasons
        reasons[reason] = reasons.get(reason, 0) + 1
    if first:
        _log.info("symm_mem::%s goes to torch's kernel: %s", name, reason)


def _reason(name: str, args, kwargs) -> str | None:
    """Why distgemm does not serve this call of op ``name``, None when it does."""
    try:
        reason = ROUTES[name].reason(*args, **kwargs)
    except (TypeError, ValueError) as ex:  # torch's kernel decides (and raises its own error)
        return f"distgemm's checks refuse the arguments: {ex}"
    if reason is None and not getattr(_core, "cuda_runtime", False):
        return f"distgemm was built without the CUDA runtime ({_core.cuda_runtime_reason})"
    return reason


def make_router(name: str, original) -> Callable:
    """The kernel ``install()`` registers for op ``name`` (with ``with_keyset=True``): distgemm's
    drop-in where its rules allow, else ``original.call_boxed(keyset, *args, **kwargs)`` (torch's
    kernel, as ``torch.library.get_kernel`` returns it); each call counted (routing_stats)."""
    if name not in ROUTES:
        raise ValueError(f"symm_mem::{name} is not routed; the routed ops are {sorted(ROUTES)}")

    def router(keyset, *args, **kwargs):
        reason = _reason(name, args, kwargs)
        _record(name, reason)
        if reason is not None:
            return original.call_boxed(keyset, *args, **kwargs)
        with torch.no_grad():
            return ROUTES[name].serve(*args, **kwargs)

    router.__name__ = router.__qualname__ = f"distgemm_{name}"
    return router


def install() -> None:
    """Make distgemm's drop-ins the CUDA kernels of torch.ops.symm_mem's four fused ops in this
    process (see the module's docstring); idempotent. RuntimeError when this torch lacks one of
    the ops or its CUDA kernel (nothing is installed then)."""
    global _library, _known_impls
    # Defines torch.ops.symm_mem's ops and registers torch's kernels (the pass imports it too).
    import torch.distributed._symmetric_memory  # noqa: F401

    with _lock:
        if _library is not None:
            return
        if not hasattr(torch.library, "get_kernel"):
            raise RuntimeError(f"torch {torch.__version__} lacks torch.library.get_kernel: {NEEDS}")
        originals = {}
        for name in ROUTES:
            qualname = f"{NAMESPACE}::{name}"
            if not torch._C._dispatch_has_kernel_for_dispatch_key(qualname, DISPATCH_KEY):
                missing = f"no {DISPATCH_KEY} kernel for {qualname}"
                raise RuntimeError(f"torch {torch.__version__} has {missing}: {NEEDS}")
            originals[name] = torch.library.get_kernel(qualname, DISPATCH_KEY)
        keys = {f"{NAMESPACE}/{name}/{DISPATCH_KEY}" for name in ROUTES}
        _known_impls = keys & torch.library._impls
        library = torch.library.Library(NAMESPACE, "IMPL")
        with warnings.catch_warnings():  # the override is the point: no warning about it
            warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered")
            for name, original in originals.items():
                router = make_router(name, original)
                # allow_override: torch 2.11 refuses to replace a python kernel without it
                library.impl(name, router, DISPATCH_KEY, with_keyset=True, allow_override=True)
        _library = library
        _install_gather_rewrite()


def _install_gather_rewrite() -> None:
    """gather_rewrite's pass as inductor's post-grad custom pre-pass, chaining the one set before
    (so that torch's pass also fuses the all-gathers of batch-1 sequence-parallel shards)."""
    import torch._inductor.config as inductor_config

    current = inductor_config.post_grad_custom_pre_pass
    if not isinstance(current, gather_rewrite.GatherRewritePass):
        inductor_config.post_grad_custom_pre_pass = gather_rewrite.GatherRewritePass(current)


def _uninstall_gather_rewrite() -> None:
    """Put back the pre-pass that install() found, where ours is still the one set."""
    import torch._inductor.config as inductor_config

    current = inductor_config.post_grad_custom_pre_pass
    if isinstance(current, gather_rewrite.GatherRewritePass):
        inductor_config.post_grad_custom_pre_pass = current.chained


def uninstall() -> None:
    """Remove the router: torch's own kernels serve the ops again; idempotent. The counts stay
    (``reset_routing_stats`` clears them)."""
    global _library
    with _lock:
        if _library is None:
            return
        _library._destroy()
        _library = None
        _uninstall_gather_rewrite()
        # _destroy forgets torch.library's record of the kernels it shadowed (same keys): restore
        torch.library._impls.update(_known_impls)


def installed() -> bool:
    return _library is not None


def routing_stats() -> RoutingStats:
    """The router's counts in this process since it started or reset_routing_stats()."""
    with _lock:
        ops = {
            name: OpRouting(_served.get(name, 0), dict(_fallbacks.get(name, {}))) for name in ROUTES
        }
        return RoutingStats(_library is not None, ops)


def reset_routing_stats() -> None:
    with _lock:
        _served.clear()
        _fallbacks.clear()


def install_from_env() -> bool:
    """``install()`` when ``DISTGEMM_ASYNC_TP=1``; whether it did. ValueError for any value but
    1, 0 or empty."""
    value = os.environ.get(ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{ENV}={value!r}: 1 routes torch's async-TP ops to distgemm, 0 does not")
    if value == "1":
        install()
    return value == "1"
