"""CPU checks of what the entry cache does for entries recorded into callers' CUDA graphs.

distgemm.runtime.entry_cache: such an entry is never evicted nor dropped, nothing is evicted
during a capture, timeouts of the capture-only graphs are reported, and an entry gets one
capture-only graph, which pins its workspace."""

import collections
import types

import pytest

torch = pytest.importorskip("torch")

from distgemm import _core, ops  # noqa: E402
from distgemm.runtime import entry_cache as entries  # noqa: E402
from distgemm.runtime.paths.overlapped import OverlappedState  # noqa: E402
from distgemm.runtime.precision import Precision  # noqa: E402


class Graph:
    """A graph's error report, as _core.GraphLauncher.error() gives it."""

    def __init__(self, error=""):
        self.message = error

    def error(self):
        return self.message


def entry(captured=False, graphs=()):
    """An overlapped entry with these eager graphs (and a capture-only one where captured)."""
    state = OverlappedState(
        spec=None,
        precision=Precision(torch.bfloat16),
        beta=0.0,
        want_gathered=False,
        out_shape=torch.Size(),
        graphs=collections.OrderedDict((i, g) for i, g in enumerate(graphs)),
        capturer=Graph() if captured else None,
    )
    return entries.Entry(None, "overlap", {}, state)


def new_cache(syncs):
    """An entry cache whose communicator logs its device synchronisations in ``syncs``."""
    return entries.EntryCache(types.SimpleNamespace(synchronize=lambda: syncs.append(1)))


def fill(cache, captured_keys, n, with_graphs=()):
    for k in range(n):
        cache.insert(k, entry(captured=k in captured_keys, graphs=[Graph()] * (k in with_graphs)))


def test_the_least_recently_used_uncaptured_entry_is_evicted():
    syncs = []
    cache = new_cache(syncs)
    fill(cache, {0, 1}, entries.MAX_PLANS, with_graphs={2})
    assert cache.evictable() == 2
    cache.insert("new", entry())
    assert len(cache) == entries.MAX_PLANS
    assert 0 in cache and 1 in cache and 2 not in cache and "new" in cache
    assert syncs == [1]  # the device was synchronised before the evicted graphs went
    # An entry without instantiated graphs (its calls enqueued directly) goes without waiting.
    cache.insert("newer", entry())
    assert 3 not in cache and "newer" in cache and syncs == [1]


def test_captured_entries_are_kept_beyond_the_limit():
    syncs = []
    cache = new_cache(syncs)
    fill(cache, set(range(entries.MAX_PLANS)), entries.MAX_PLANS)
    assert cache.evictable() is None
    cache.insert("new", entry())
    assert len(cache) == entries.MAX_PLANS + 1 and syncs == []
    # Once the cache holds an uncaptured entry again, it is the one that goes.
    cache.insert("newer", entry())
    assert "new" not in cache and "newer" in cache and len(cache) == entries.MAX_PLANS + 1


def test_nothing_is_evicted_while_a_capture_is_in_progress():
    syncs = []
    cache = new_cache(syncs)
    fill(cache, set(), entries.MAX_PLANS)
    cache.insert("during", entry(), capturing=True)
    assert len(cache) == entries.MAX_PLANS + 1 and syncs == []
    cache.insert("after", entry())  # shrinks back to the limit (no graphs: no waiting)
    assert len(cache) == entries.MAX_PLANS and syncs == []
    assert 0 not in cache and 1 not in cache and "during" in cache


def test_a_captured_entry_is_never_dropped():
    syncs = []
    cache = new_cache(syncs)
    cache.insert("k", entry(captured=True))
    with pytest.raises(RuntimeError, match="freed only by Communicator.close"):
        cache.drop("k")
    assert "k" in cache and syncs == []
    cache.insert("u", entry(graphs=[Graph()]))
    cache.drop("u")
    assert "u" not in cache and syncs == [1]


def test_graph_error_reports_a_capture_only_graph():
    cache = new_cache([])
    cache.insert("a", entry(graphs=[Graph(), Graph()]))
    assert cache.launch_error() == ""
    captured = entry(captured=True, graphs=[Graph()])
    captured.state.capturer = Graph("device 0, entry barrier: barrier slot of device 1 ...")
    cache.insert("b", captured)
    assert cache.launch_error() == "device 0, entry barrier: barrier slot of device 1 ..."


def test_release_drops_the_capture_only_graphs():
    cache = new_cache([])
    e = entry(captured=True, graphs=[Graph()])
    cache.insert("k", e)
    cache.close()
    assert len(cache) == 0 and e.state.capturer is None and not e.state.graphs


def test_an_entry_gets_one_capture_only_graph_which_pins_its_workspace(monkeypatch):
    made = []

    def device_graph(*args, **kwargs):
        made.append((args, kwargs))
        return Graph()

    monkeypatch.setattr(_core, "GraphLauncher", device_graph, raising=False)
    a, w = torch.zeros(64, 32, dtype=torch.bfloat16), torch.zeros(24, 32, dtype=torch.bfloat16)
    spec = ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, a, w)
    ws = types.SimpleNamespace(order="order", pinned=False)
    e = entry().state
    e.spec, e.ws, e.setup = spec, ws, "setup"
    g = e.capture_graph((16, 32, 0, 48, 0, 0, 0))
    assert e.capture_graph((80, 96, 0, 112, 0, 0, 0)) is g  # any pointers: the same one
    want = {"capture_only": True, "scale_a": 0, "scale_b": 0}
    assert made == [((spec.plan, "setup", "order", 16, 32, 0, 48, 0), want)]
    assert ws.pinned and e.capturer is g and not e.graphs  # not an eager graph of the plan
