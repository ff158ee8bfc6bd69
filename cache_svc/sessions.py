"""Scheduler sessions with leases, and the log of operation ids that makes mutating calls idempotent."""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from cache_svc.errors import FailedPrecondition, InvalidArgument, NotFound


@dataclass
class Session:
    """A scheduler session: owner name, lease, and the requests it registered (request_id -> pool_id)."""

    session_id: str
    owner: str
    lease_seconds: float
    expires_at: float
    requests: dict[str, str] = field(default_factory=dict)


class SessionTable:
    """Live sessions by id and by owner; ended sessions are remembered (bounded) so a stale id gets
    FAILED_PRECONDITION with the reason instead of NOT_FOUND.

    ``clock()`` returns seconds (monotonic). Not thread safe (``CacheCore`` serialises access).
    """

    def __init__(self, clock: Callable[[], float], default_lease_seconds: float, remember_ended: int = 10_000) -> None:
        if default_lease_seconds <= 0:
            raise InvalidArgument(f"lease seconds must be > 0, got {default_lease_seconds}")
        self.clock = clock
        self.default_lease_seconds = default_lease_seconds
        self.live: dict[str, Session] = {}
        self.by_owner: dict[str, str] = {}
        self.ended: OrderedDict[str, str] = OrderedDict()  # session_id -> why it ended
        self._remember = remember_ended

    def open(self, owner: str, lease_seconds: float) -> tuple[Session, Session | None]:
        """Opens a session for ``owner`` (lease 0 = default). Returns (new, replaced or None); the caller
        releases the replaced session's requests."""
        if not owner:
            raise InvalidArgument("owner must be non-empty")
        if lease_seconds < 0:
            raise InvalidArgument(f"lease_seconds must be >= 0, got {lease_seconds}")
        lease = lease_seconds or self.default_lease_seconds
        old = None
        old_id = self.by_owner.get(owner)
        if old_id is not None:
            old = self.live.pop(old_id)
            self._end(old_id, f"session {old_id} of {owner!r} was replaced by a newer session")
        session = Session(uuid.uuid4().hex, owner, lease, self.clock() + lease)
        self.live[session.session_id] = session
        self.by_owner[owner] = session.session_id
        return session, old

    def get(self, session_id: str) -> Session:
        """The live session. Raises InvalidArgument (empty id), FailedPrecondition (expired or replaced:
        open a new session and requeue), NotFound (never seen)."""
        if not session_id:
            raise InvalidArgument("session_id must be non-empty")
        session = self.live.get(session_id)
        if session is not None:
            return session
        why = self.ended.get(session_id)
        if why is not None:
            raise FailedPrecondition(why)
        raise NotFound(f"unknown session {session_id!r}")

    def renew(self, session_id: str) -> float:
        """Extends the lease by its length from now; returns seconds left."""
        session = self.get(session_id)
        session.expires_at = self.clock() + session.lease_seconds
        return session.lease_seconds

    def expire(self) -> list[Session]:
        """Ends and returns sessions whose lease ran out (the caller releases their requests)."""
        now = self.clock()
        gone = [s for s in self.live.values() if s.expires_at <= now]
        for s in gone:
            del self.live[s.session_id]
            del self.by_owner[s.owner]
            self._end(s.session_id, f"session {s.session_id} of {s.owner!r} expired (lease {s.lease_seconds}s not renewed)")
        return gone

    def _end(self, session_id: str, why: str) -> None:
        self.ended[session_id] = why
        while len(self.ended) > self._remember:
            self.ended.popitem(last=False)


class OpLog:
    """First results of mutating operations by op id (the last ``capacity`` ops, and results of at most
    ``max_ints`` integers (slot ids) in all; oldest dropped first, the newest always kept).

    ``lookup(op_id, fingerprint)`` returns the stored result, None when unseen, and raises InvalidArgument
    when the op id was used for a different call. Only the fingerprint's hash is kept (a call's token ids
    would otherwise be retained 4096 times over). Failed calls are not recorded (they change no request;
    a retry runs again).
    """

    def __init__(self, capacity: int = 4096, max_ints: int = 4_000_000) -> None:
        self._entries: OrderedDict[str, tuple[int, Any, int]] = OrderedDict()
        self._capacity = capacity
        self._max_ints = max_ints
        self._ints = 0

    def lookup(self, op_id: str, fingerprint: Any) -> Any | None:
        if not op_id:
            raise InvalidArgument("op_id must be non-empty (it makes retries safe)")
        entry = self._entries.get(op_id)
        if entry is None:
            return None
        if entry[0] != hash(fingerprint):
            raise InvalidArgument(f"op_id {op_id!r} was already used for a different call")
        return entry[1]

    def record(self, op_id: str, fingerprint: Any, result: Any, weight: int) -> None:
        """Stores ``result`` under ``op_id``; ``fingerprint`` must be hashable (tuples, frozen dataclasses);
        ``weight``: the integers ``result`` holds (slot ids), counted against ``max_ints``."""
        old = self._entries.pop(op_id, None)
        if old is not None:
            self._ints -= old[2]
        self._entries[op_id] = (hash(fingerprint), result, weight)
        self._ints += weight
        while len(self._entries) > 1 and (len(self._entries) > self._capacity or self._ints > self._max_ints):
            self._ints -= self._entries.popitem(last=False)[1][2]
