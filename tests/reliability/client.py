"""HTTP clients for the reliability tests: one native /generate call (streamed or not) reduced to an Outcome,
and a steady load of such calls on threads."""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class Outcome:
    """What one call ended with. status: HTTP status (0 = the connection failed or timed out); ids: output token
    ids; finish: finish_reason type ("" when none); error: error message (body or error event or exception);
    retry_after: the Retry-After header; seconds: wall time of the call; ended_at: time.monotonic() when it ended."""

    status: int = 0
    ids: list[int] = field(default_factory=list)
    finish: str = ""
    error: str = ""
    retry_after: str | None = None
    seconds: float = 0.0
    ended_at: float = 0.0
    prompt: list[int] = field(default_factory=list)
    max_new: int = 0

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error and self.finish in ("length", "stop")


def payload(ids: list[int], max_new: int, stream: bool, **params) -> dict:
    return {"input_ids": ids, "stream": stream,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True, **params}}


def generate(url: str, ids: list[int], max_new: int, stream: bool = True, timeout: float = 60.0,
             cancel_after: float | None = None, headers: dict | None = None, rid: str | None = None,
             streaming: threading.Event | None = None, cancel: threading.Event | None = None) -> Outcome:
    """One /generate call. ``cancel_after``: close the connection after that many seconds, waiting or mid-stream
    (a client that leaves); the outcome then has error "cancelled". ``streaming`` (stream=True): set when the
    first event with output tokens arrives (the request was admitted and is decoding), so a test can wait on
    that state instead of sampling the scheduler's load. ``cancel`` (stream=True): close the connection at the
    first event after it is set (mid-stream, on the test's signal); error "cancelled"."""
    out = Outcome(prompt=ids, max_new=max_new)
    t0 = time.monotonic()
    body = payload(ids, max_new, stream)
    if rid is not None:
        body["rid"] = rid
    read = timeout if cancel_after is None else cancel_after
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout, connect=5.0, read=read)) as client:
            with client.stream("POST", url + "/generate", json=body, headers=headers) as r:
                out.status = r.status_code
                out.retry_after = r.headers.get("retry-after")
                if r.status_code != 200:
                    r.read()
                    out.error = r.json()["error"]["message"]
                    return out
                if not stream:
                    r.read()
                    data = r.json()
                    out.ids, out.finish = data["output_ids"], (data["meta_info"]["finish_reason"] or {}).get("type", "")
                    return out
                for line in r.iter_lines():
                    if (cancel_after is not None and time.monotonic() - t0 > cancel_after
                            or cancel is not None and cancel.is_set()):
                        out.error = "cancelled"
                        return out
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        out.error = event["error"]["message"]
                        continue
                    out.ids = event["output_ids"]
                    out.finish = (event["meta_info"]["finish_reason"] or {}).get("type", "") or out.finish
                    if streaming is not None and out.ids:
                        streaming.set()
    except httpx.ReadTimeout as exc:
        out.error = "cancelled" if cancel_after is not None else f"ReadTimeout: {exc}"
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        out.ended_at = time.monotonic()
        out.seconds = out.ended_at - t0
    return out


class Load:
    """``clients`` threads each sending /generate calls back to back (prompts from ``prompts``, ``max_new`` tokens)
    until ``stop()``; every outcome is kept in ``outcomes`` with its start time (monotonic)."""

    def __init__(self, url: str, prompts: list[list[int]], max_new: int, clients: int = 4, stream: bool = True,
                 timeout: float = 60.0) -> None:
        self.url, self.prompts, self.max_new, self.stream, self.timeout = url, prompts, max_new, stream, timeout
        self.outcomes: list[tuple[float, Outcome]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def __enter__(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _client(self, i: int) -> None:
        rng = random.Random(i)
        while not self._stop.is_set():
            t = time.monotonic()
            out = generate(self.url, rng.choice(self.prompts), self.max_new, self.stream, self.timeout)
            with self._lock:
                self.outcomes.append((t, out))
            if not out.ok:
                time.sleep(0.05)

    def stop(self, timeout: float = 90.0) -> list[tuple[float, Outcome]]:
        """Stops after the calls in flight end; raises AssertionError when a client thread is still stuck."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in self._threads if t.is_alive()]
        assert not stuck, f"client threads still waiting after {timeout} s: {stuck}"
        return self.outcomes

    def count(self) -> int:
        with self._lock:
            return len(self.outcomes)
