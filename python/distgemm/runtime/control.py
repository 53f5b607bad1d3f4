"""The control plane of a Communicator: bounded all-gathers of small picklable objects (host
names, IPC handles, plan signatures) among a group's ranks through the job's key-value store."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any


class ExchangeTimeout(Exception):
    """A control exchange did not complete in time. ``missing``: the group ranks whose entry is
    absent; empty when every rank arrived but another had already given up waiting."""

    def __init__(self, missing: list[int]):
        super().__init__(
            f"ranks {missing} did not arrive"
            if missing
            else "another rank gave up waiting before this rank arrived"
        )
        self.missing = missing


class ExchangeMismatch(Exception):
    """The ranks reached different exchanges (``whats[r]``: what rank r exchanged): they are
    out of step."""

    def __init__(self, whats: list[str]):
        super().__init__(f"ranks exchanged different things: {whats}")
        self.whats = whats


# Control exchanges created per set of global ranks in this process. Creating a Communicator is
# collective over its members, so every member counts the same and the key prefixes agree.
_EXCHANGES_PER_RANKS: dict[tuple[int, ...], int] = {}


class ControlExchange:
    """All-gather of small picklable objects among the members of one group, through the job's
    key-value store (torchrun's TCPStore), every wait bounded.

    Why not a gloo group: a gloo group made with ``use_local_synchronization`` is named after
    its ranks and the number of live groups, so a group created after another was destroyed
    reuses the old name, and a rank that arrives early can read the old group's addresses from
    the store and fail to connect ("Connection refused") when the ranks reach a new
    Communicator seconds apart. Store keys here are unique per exchange instead: a prefix
    per (ranks, n-th exchange object for them in this process) and a sequence number. Each rank
    deletes its key of the previous exchange once every rank has posted the next one (by then
    every rank has read it), so the store holds at most two exchanges' keys per group.
    """

    def __init__(self, store, global_ranks: Sequence[int], rank: int, timeout_s: float):
        ranks = tuple(int(r) for r in global_ranks)
        n = _EXCHANGES_PER_RANKS[ranks] = _EXCHANGES_PER_RANKS.get(ranks, 0) + 1
        self.store, self.size, self.rank, self.timeout_s = store, len(ranks), rank, timeout_s
        self.prefix = f"distgemm/ctl/{'-'.join(map(str, ranks))}/{n}"
        self.seq = 0

    def _key(self, seq: int, rank) -> str:
        return f"{self.prefix}/{seq}/{rank}"

    def all_gather(self, obj: Any, what: str = "", timeout_s: float | None = None) -> list[Any]:
        """Every rank's ``obj``, in rank order. ExchangeTimeout when a rank did not arrive in
        time, on every rank that gets here (also one that arrives after another gave up);
        ExchangeMismatch when the ranks exchanged different ``what``s."""
        import pickle

        self.seq += 1
        keys = [self._key(self.seq, r) for r in range(self.size)]
        self.store.set(keys[self.rank], pickle.dumps((what, obj)))
        try:
            self.store.wait(keys, datetime.timedelta(seconds=timeout_s or self.timeout_s))
            arrived = True
        except Exception:  # the store reports a timeout as RuntimeError / DistStoreError
            arrived = False
        # One outcome for every rank: the first rank past its wait settles the exchange with a
        # compare-and-set ("ok": all arrived; "late": it timed out) and every rank follows it, so
        # a rank arriving just after another gave up raises too instead of going on alone.
        verdict = self.store.compare_set(
            self._key(self.seq, "verdict"), "", "ok" if arrived else "late"
        )
        if verdict != b"ok":
            raise ExchangeTimeout([r for r, k in enumerate(keys) if not self.store.check([k])])
        # One round trip for every rank's entry where the store has multi_get (TCPStore does).
        multi_get = getattr(self.store, "multi_get", None)
        raw = multi_get(keys) if multi_get is not None else [self.store.get(k) for k in keys]
        objs = unpack(raw, what)
        if self.seq > 1:  # every rank has read exchange seq-1: it posted to this one
            mine = [self.rank, "verdict"] if self.rank == 0 else [self.rank]
            delete_keys(self.store, [self._key(self.seq - 1, k) for k in mine])
        return objs

    def close(self) -> None:
        """Nothing to release: the store belongs to the job."""


def unpack(raw: Sequence[bytes], what: str) -> list[Any]:
    """The ranks' objects from their pickled ``(what, obj)`` posts, in rank order;
    ExchangeMismatch when the ranks exchanged different ``what``s."""
    import pickle

    got = [pickle.loads(v) for v in raw]
    if any(w != what for w, _ in got):
        raise ExchangeMismatch([w for w, _ in got])
    return [o for _, o in got]


def delete_keys(store, keys: Sequence[str]) -> None:
    """Delete ``keys`` from ``store`` (a store without deletion keeps them)."""
    for k in keys:
        try:
            store.delete_key(k)
        except Exception:  # a store without deletion: the key just stays
            pass


def default_store():
    """The store the default process group was set up with (torchrun's TCPStore)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()
