"""The control exchange among ranks on one host: all-gathers through a shared-memory file, with the
store exchange (``control.ControlExchange``) for its setup and for objects too large for a slot.

Why: a store exchange costs every rank about five round trips to the store's server (set, wait,
the verdict, get, delete), a few hundred us that a first call of a new shape pays in full. Here
a rank writes its object into its slot of a file every rank has mapped and reads the others'
slots: no round trip, no server. ``SharedMemoryExchange.all_gather`` keeps the store exchange's
contract: every rank's object in rank order; ``ExchangeTimeout`` (naming the absent ranks) on
every rank when one does not arrive in time, also on one that arrives after another gave up;
``ExchangeMismatch`` when the ranks exchanged different things.

The file: for each rank two slots (by the parity of the exchange's sequence number), each a
header (sequence number, payload bytes, flags, CRC-32 of these and the payload) and
``SLOT_PAYLOAD_BYTES`` of payload, then two verdict words (sequence number, verdict), again by
parity. Parity suffices: a rank posts exchange n + 2 only after every rank posted n + 1, which
each does only after it has read every slot of exchange n and its verdict.
- **Arrival**: the writer stores the payload, then the header; a reader accepts a slot whose
  header carries this exchange's sequence number and whose CRC matches what it read. A slot
  read while being written (a header field or payload byte of exchange n - 2 beside those of
  n: the reader's loads may interleave with the writer's stores) fails the CRC and is read
  again.
- **Verdict**: the first rank past its wait (all arrived, or its timeout) writes "ok" or "late"
  under an exclusive ``flock`` of the file, and every rank follows what it finds there, as the
  store exchange's compare-and-set does.
- **Large objects**: a payload above ``SLOT_PAYLOAD_BYTES`` is set in the store first and its
  slot says so; readers get it from there. The writer deletes it once every rank has posted the
  next exchange (so has read it).

Made collectively by ``shared_memory_exchange`` (rank 0 creates the file, the others open it,
the store exchange checks that every rank mapped the same file; then rank 0 unlinks it, the
mappings stay). Where any rank cannot map it (another mount namespace, no /dev/shm) every rank
keeps the store exchange.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import pickle
import secrets
import struct
import tempfile
import time
import zlib
from typing import Any

from .control import ControlExchange, ExchangeTimeout, delete_keys, unpack

__all__ = ["SharedMemoryExchange", "shared_memory_exchange", "SLOT_PAYLOAD_BYTES", "CONTROL_ENV"]

# "store" makes every communicator keep the store exchange (a comparison, or a host whose
# shared memory the ranks cannot share); unset or "shm": the shared-memory exchange.
CONTROL_ENV = "DISTGEMM_CONTROL"
# A slot's payload: a plan signature or a set of IPC handles pickles to well under 1 KiB.
SLOT_PAYLOAD_BYTES = 16384
# A slot's header: sequence number, payload bytes, flags, CRC-32.
_HEADER = struct.Struct("<qIII")
_SLOT_BYTES = _HEADER.size + SLOT_PAYLOAD_BYTES
# A verdict: sequence number, verdict.
_VERDICT = struct.Struct("<qq")
_OK, _LATE = 1, 2
# Slot flags: the payload is the store key of the pickled object.
_IN_STORE = 1
# The file's first bytes: a token every rank checks, so that a rank that opened a different
# file at the same path (another mount namespace) is found.
_TOKEN_BYTES = 16
# Spin this long before sleeping between polls, then sleep from the first to the last bound.
_SPIN_S = 1e-3
_SLEEP_S = (2e-5, 1e-3)


def _file_bytes(size: int) -> int:
    return _TOKEN_BYTES + 2 * _VERDICT.size + 2 * size * _SLOT_BYTES


def _crc(seq: int, nbytes: int, flags: int, payload: bytes) -> int:
    """CRC-32 of a slot's header fields and payload: a header read while it was being written
    (a field of the previous exchange beside one of this) fails it too."""
    return zlib.crc32(payload, zlib.crc32(struct.pack("<qII", seq, nbytes, flags)))


class SharedMemoryExchange:
    """All-gather of small picklable objects among the members of one group on one host, through
    a shared-memory file every member has mapped (see the module docstring). ``store_exchange``
    carries the objects too large for a slot; ``seq`` counts this exchange's all-gathers."""

    def __init__(self, fd: int, mm: mmap.mmap, store_exchange: ControlExchange):
        self.fd, self.mm, self.store_exchange = fd, mm, store_exchange
        self.store, self.size = store_exchange.store, store_exchange.size
        self.rank, self.timeout_s = store_exchange.rank, store_exchange.timeout_s
        self.seq = 0
        self._stored: list[tuple[int, str]] = []  # (seq, store key) of this rank's large objects

    def _slot(self, rank: int, seq: int) -> int:
        return _TOKEN_BYTES + 2 * _VERDICT.size + ((seq & 1) * self.size + rank) * _SLOT_BYTES

    def _post(self, data: bytes) -> None:
        flags = 0
        if len(data) > SLOT_PAYLOAD_BYTES:
            key = f"{self.store_exchange.prefix}/large/{self.seq}/{self.rank}"
            self.store.set(key, data)
            self._stored.append((self.seq, key))
            data, flags = key.encode(), _IN_STORE
        off = self._slot(self.rank, self.seq)
        self.mm[off + _HEADER.size : off + _HEADER.size + len(data)] = data
        crc = _crc(self.seq, len(data), flags, data)
        _HEADER.pack_into(self.mm, off, self.seq, len(data), flags, crc)

    def _read(self, rank: int) -> tuple[bytes, int] | None:
        """Rank ``rank``'s (payload, flags) of this exchange, or None while it has not arrived."""
        off = self._slot(rank, self.seq)
        seq, n, flags, crc = _HEADER.unpack_from(self.mm, off)
        if seq != self.seq or n > SLOT_PAYLOAD_BYTES:
            return None
        data = self.mm[off + _HEADER.size : off + _HEADER.size + n]
        return (data, flags) if _crc(seq, n, flags, data) == crc else None

    def _settle(self, arrived: bool) -> bool:
        """The exchange's verdict, written by the first rank here: True for "ok"."""
        off = _TOKEN_BYTES + (self.seq & 1) * _VERDICT.size
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            seq, verdict = _VERDICT.unpack_from(self.mm, off)
            if seq != self.seq:
                verdict = _OK if arrived else _LATE
                _VERDICT.pack_into(self.mm, off, self.seq, verdict)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        return verdict == _OK

    def all_gather(self, obj: Any, what: str = "", timeout_s: float | None = None) -> list[Any]:
        """Every rank's ``obj``, in rank order (``ControlExchange.all_gather``'s contract)."""
        self.seq += 1
        self._post(pickle.dumps((what, obj)))
        got: list[tuple[bytes, int] | None] = [None] * self.size
        pending = list(range(self.size))
        start = time.monotonic()
        deadline = start + (timeout_s or self.timeout_s)
        sleep = _SLEEP_S[0]
        while True:
            for r in pending:
                got[r] = self._read(r)
            pending = [r for r in pending if got[r] is None]
            if not pending:
                break
            now = time.monotonic()
            if now >= deadline:
                break
            if now - start > _SPIN_S:
                time.sleep(sleep)
                sleep = min(2 * sleep, _SLEEP_S[1])
        if not self._settle(not pending):
            raise ExchangeTimeout(pending)
        raw = [  # every rank arrived
            self.store.get(data.decode()) if flags & _IN_STORE else data
            for data, flags in got  # type: ignore[misc]
        ]
        objs = unpack(raw, what)
        # Every rank has posted this exchange, so has read the earlier ones' large objects.
        stale = [key for seq, key in self._stored if seq < self.seq]
        self._stored = [(seq, key) for seq, key in self._stored if seq >= self.seq]
        delete_keys(self.store, stale)
        return objs

    def close(self) -> None:
        try:
            self.mm.close()
        finally:
            os.close(self.fd)


def _shared_dir() -> str:
    return (
        "/dev/shm"
        if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)
        else (tempfile.gettempdir())
    )


def shared_memory_exchange(
    store_exchange: ControlExchange,
) -> SharedMemoryExchange | ControlExchange:
    """The group's shared-memory exchange, made over ``store_exchange`` (collective: every rank
    of the group calls it at the same point, all on one host); ``store_exchange`` itself where a
    rank could not map the file or ``CONTROL_ENV`` says "store". Store exchanges of its own: two."""
    if os.environ.get(CONTROL_ENV, "shm") == "store":
        return store_exchange
    size, rank = store_exchange.size, store_exchange.rank
    nbytes = _file_bytes(size)
    fd, mm, path, problem = -1, None, None, None
    if rank == 0:
        token = secrets.token_bytes(_TOKEN_BYTES)
        try:
            path = os.path.join(_shared_dir(), f"distgemm-control-{secrets.token_hex(8)}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(fd, nbytes)
            mm = mmap.mmap(fd, nbytes)
            mm[:_TOKEN_BYTES] = token
        except OSError as e:
            problem = f"rank 0 could not create {path}: {e}"
        offer = None if problem else (path, token)
    else:
        offer = None
    offers = store_exchange.all_gather(offer, "control: shared-memory file")
    if rank != 0 and offers[0] is not None:
        path, token = offers[0]
        try:
            fd = os.open(path, os.O_RDWR)
            mm = mmap.mmap(fd, nbytes)
            if mm[:_TOKEN_BYTES] != token:
                problem = f"rank {rank} mapped another file at {path}"
        except (OSError, ValueError) as e:
            problem = f"rank {rank} could not map {path}: {e}"
    elif rank != 0:
        problem = "rank 0 made no file"
    problems = store_exchange.all_gather(problem, "control: shared-memory file mapped")
    if rank == 0 and path is not None and fd >= 0:
        try:
            os.unlink(path)  # every rank has mapped it or given up: nothing else will open it
        except OSError:
            pass
    if any(problems):
        if mm is not None:
            mm.close()
        if fd >= 0:
            os.close(fd)
        return store_exchange
    assert mm is not None
    return SharedMemoryExchange(fd, mm, store_exchange)
