"""Stop-string matching with hold-back: no fragment of a stop string that may still match is ever released."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StopResult:
    """Text that may be streamed now, and the stop string that matched (None while none has)."""

    text: str
    matched: str | None = None


class StopStringMatcher:
    """Feeds text deltas, releases text that cannot be part of a stop string, detects the first match.

    ``stops``: non-empty strings (ValueError on an empty one). On a match the released text ends just
    before the stop string (or includes it when ``no_stop_trim``) and nothing after it is released.
    """

    def __init__(self, stops: tuple[str, ...] | list[str], no_stop_trim: bool = False) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self._stops = tuple(stops)
        self._keep = no_stop_trim
        self._held = ""
        self.matched: str | None = None

    def push(self, text: str) -> StopResult:
        """Adds a delta; returns what may be streamed now. After a match, further pushes release nothing."""
        if self.matched is not None:
            return StopResult("", self.matched)
        buf = self._held + text
        if not self._stops:
            self._held = ""
            return StopResult(buf)
        # The stop that completes first wins (the earliest end, then the earliest start): the same answer
        # whatever the chunking of the text, and the point where generation stops.
        best: tuple[int, int, str] | None = None
        for stop in self._stops:
            idx = buf.find(stop)
            if idx >= 0 and (best is None or (idx + len(stop), idx) < best[:2]):
                best = (idx + len(stop), idx, stop)
        if best is not None:
            _, idx, stop = best
            self.matched = stop
            self._held = ""
            return StopResult(buf[: idx + len(stop)] if self._keep else buf[:idx], stop)
        hold = self._hold_length(buf)
        self._held = buf[len(buf) - hold:] if hold else ""
        return StopResult(buf[: len(buf) - hold])

    @property
    def holding(self) -> bool:
        """True when pushed text is held back (it may still become a stop string)."""
        return bool(self._held)

    @property
    def active(self) -> bool:
        """True when there are stop strings to match."""
        return bool(self._stops)

    def mark(self) -> tuple[str, str | None]:
        """A point to ``rewind`` to (pushes after it are undone)."""
        return self._held, self.matched

    def rewind(self, mark: tuple[str, str | None]) -> None:
        """Undoes the pushes made since ``mark``."""
        self._held, self.matched = mark

    def _hold_length(self, buf: str) -> int:
        """Longest suffix of ``buf`` that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buf)), longest, -1):
                if buf.endswith(stop[:k]):
                    longest = k
                    break
        return longest

    def flush(self) -> str:
        """Releases held text when the request ends for another reason (it did not become a stop string)."""
        if self.matched is not None:
            return ""
        held, self._held = self._held, ""
        return held
