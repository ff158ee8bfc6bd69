"""Aborts at keystroke rate while Forwards are in flight: an adversarial run of the real loop.

Commit 0a11c38 lets ``RequestTable.abort(held=...)`` end an aborted running request as soon as no Forward in
flight holds it, while Forwards holding other requests are still in flight, and lets the chain
(``chain.can_chain``) and the extend sent behind (``chunk_ahead``) go on with the aborted requests left out.
That is the shape of change that failed in production elsewhere (SGLang #10833: requests finishing inside a
mixed batch leaked or were freed twice; #38981: an abort mid-prefill killed every rank). This test drives it as
editors do and checks the invariants, not timings.

Set-up: the real ``Scheduler.run`` loop in a thread, the real cache service (in-process gRPC server), and
``StrictWorker``, a simulated worker that runs each Forward in the worker's order (``worker_svc.ordering.
ForwardOrder``: ``after_seq``, ``before_seq``) after a short random delay (a seeded ``random.Random``, at most a
few ms) and keeps the state a real worker keeps: which requests it knows (registered by a ``has_prefix`` item,
dropped by ``release_request_ids`` or the Release RPC), how many tokens each holds, and what K/V each slot holds
(position and a hash of every token up to it). Several typist threads submit completions (short prompts within a
chunk, long ones of several chunks, all sharing a header and each typist's file so the radix cache is matched;
``max_new_tokens`` 1..20) and abort the previous one at a random moment: at once (before admission), after a
few ms (mid-prefill with chunks in flight, or mid-decode with a chained Forward in flight), after its first
token (mid-decode), after its end (nothing to abort), or never. Configurations: ``mixed_chunk`` off and on,
chunk sizes 16-64, ``decode_steps`` 1, 2 and 4 (multi-step), page size 1 and 16 (prompt lengths not page
multiples), a large pool and a small one (admissions wait, the tree is evicted, slots are reused); four seeds
each (about 0.2-0.9 s a case here).

Checked, with values:

- every stream ends (no hang: bounded waits), successfully, finish "abort" or "length"; one that was not
  aborted (never flagged, or flagged after it ended) streamed exactly its ``max_new_tokens`` tokens;
- the worker never sees an item of a request it does not know (a use-after-free: a release applied, or a
  Release RPC, before a Forward naming it), a ``has_prefix`` item for a request it knows, an item whose position
  is not the tokens it holds, or a prefix slot whose K/V is not that token at that position (the cache handed
  out slots that were never written, or were overwritten), an item of a request whose release was already sent
  (a Forward in flight still held it when it was ended), or a write into a slot that a request the worker still
  knows holds, unless that request's release was already sent on a Forward that this one runs ahead of
  (``before_seq``, overlap mode "queued": the cache freed the slots, the worker drops the ended request's state
  when that Forward starts; nothing names it again, so this is counted, ``overtaken``, not failed: it occurs
  before commit 0a11c38 too);
- no Forward sent names a request after that request's release was sent (on a Forward or the Release RPC);
- every request the worker knew is released exactly once per registration (``release_request_ids`` carried by
  Forwards plus ``release()`` calls), one it never knew never, and at the end the worker knows none;
- at the end nothing runs or waits, ``table.held() == 0``, every node of the radix tree names slots whose K/V
  are its tokens at their positions (no K/V cached for tokens never written), and after a flush
  ``available == capacity`` and ``check_integrity`` is clean.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
import structlog

from cache_svc.core import CacheCore
from codeserve.v1 import worker_pb2
from scheduler_svc.request import StreamEnd
from scheduler_svc.scheduler import Scheduler, SchedulerConfig
from tests.scheduler.cache_service import cache_service
from tests.scheduler.fake_worker import LaterReply, forward_response
from tests.scheduler.test_arrival_order import submitter
from worker_svc.ordering import ForwardOrder

TOKEN = 77  # every token the worker samples (the requests ignore EOS)
WAIT_S = 15.0  # bound for a condition that holds within milliseconds in a correct scheduler (not a measured time)
CAPACITY = 4096
SMALL_CAPACITY = 400
TYPISTS = 5
KEYSTROKES = 12  # completions per typist
MAX_DELAY_S = 0.002  # the worker's random delay before a Forward runs, and again while it runs, at most


def chain(prev: int, token: int) -> int:
    """The K/V identity of ``token`` after the context hashed in ``prev`` (K/V depend on all tokens before)."""
    return hash((prev, token))


class StrictWorker:
    """Stands in for WorkerClient (``info``, ``prepare``, ``send``, ``release``). Each Forward is served in a
    thread: a random delay, then the worker's order (``ForwardOrder``), then under the engine lock its releases
    and its items are applied to the simulated state, with every violation recorded in ``violations`` (the
    reply is still OK, so the run goes on and the test reports them all)."""

    def __init__(self, seed: int, page_size: int, capacity: int) -> None:
        self.epoch = ""
        self.page_size, self.capacity = page_size, capacity
        self.rng = random.Random(seed)
        self.order = ForwardOrder(timeout_s=WAIT_S)
        self.lock = threading.Lock()  # the engine (runs) and the send-side books
        self.violations: list[str] = []
        # run side (the worker's own state, in the order Forwards run)
        self.known: dict[str, dict] = {}  # rid -> {"held": tokens written, "h": hash per position, "slots"}
        self.kv: dict[int, tuple[int, int]] = {}  # slot -> (position, context hash) written there
        self.owner: dict[int, str] = {}  # slot -> the live request that wrote it
        self.runs = 0
        self.reused = 0  # writes into a slot written before (freed or evicted, then allocated again)
        # writes into a slot of a request whose release was sent on a Forward that this one runs ahead of
        # (before_seq): the cache freed the slots, the worker drops that request's state a little later
        self.overtaken = 0
        # send side (what the loop sent, in the order it sent it)
        self.registered: Counter = Counter()  # rid -> has_prefix items sent
        self.released: Counter = Counter()  # rid -> releases sent (release_request_ids + release())
        self.released_sent: set[str] = set()  # rids whose release was sent (and not registered again since)
        self.release_on: dict[str, str] = {}  # rid -> what carried its last release ("Forward <seq>", "Release RPC")
        self.order_of: dict[int, tuple[int, int]] = {}  # seq -> (after_seq, before_seq)
        self.unanswered: set[int] = set()
        self.released_in_flight = 0  # releases carried by a Forward sent while another one was in flight

    def info(self) -> worker_pb2.WorkerInfo:
        return worker_pb2.WorkerInfo(worker_id="strict", epoch="e1", model_name="strict", n_positions=2048,
                                     vocab_size=1000, eos_token_id=0, capacity_tokens=self.capacity,
                                     page_size=self.page_size, pool_slots=self.capacity + self.page_size)

    def prepare(self, items, seq: int, after_seq: int = 0, before_seq: int = 0) -> worker_pb2.ForwardRequest:
        return worker_pb2.ForwardRequest(expected_epoch=self.epoch, items=items, seq=seq, after_seq=after_seq,
                                         before_seq=before_seq)

    def _sent_release(self, rids, via: str) -> None:
        for rid in rids:
            self.released[rid] += 1
            if self.released[rid] > self.registered[rid]:
                self.violations.append(f"{via}: release #{self.released[rid]} of {rid}, registered "
                                       f"{self.registered[rid]} time(s) (a double release, or one never known)")
            self.released_sent.add(rid)
            self.release_on[rid] = via

    def send(self, request: worker_pb2.ForwardRequest) -> LaterReply:
        with self.lock:
            if self.unanswered:
                self.released_in_flight += len(request.release_request_ids)
            self.unanswered.add(request.seq)
            self.order_of[request.seq] = (request.after_seq, request.before_seq)
            self._sent_release(request.release_request_ids, f"Forward {request.seq}")
            for it in request.items:
                if it.has_prefix:
                    self.registered[it.request_id] += 1
                    self.released_sent.discard(it.request_id)
                elif it.request_id in self.released_sent:
                    self.violations.append(f"Forward {request.seq} names {it.request_id} after its release was sent")
            pre, during = self.rng.uniform(0, MAX_DELAY_S), self.rng.uniform(0, MAX_DELAY_S)
        pending = LaterReply()
        threading.Thread(target=self._serve, args=(request, pending, pre, during), daemon=True).start()
        return pending

    def release(self, request_ids) -> int:
        with self.lock:
            self._sent_release(request_ids, "Release RPC")
            for rid in request_ids:
                self._drop(rid)
        return len(request_ids)

    def _serve(self, request: worker_pb2.ForwardRequest, pending: LaterReply, pre: float, during: float) -> None:
        time.sleep(pre)
        self.order.insert_before(request.seq, request.before_seq, request.after_seq)
        self.order.wait_for(request.after_seq, request.seq)
        with self.lock:
            for rid in request.release_request_ids:
                self._drop(rid)
            for it in request.items:
                self._run_item(request.seq, it)
            self.runs += 1
        time.sleep(during)
        reply = forward_response(request.items, TOKEN)
        self.order.done(request.seq)
        with self.lock:
            self.unanswered.discard(request.seq)
        pending.answer(reply)

    def _drop(self, rid: str) -> None:
        state = self.known.pop(rid, None)
        if state is not None:
            for s in state["slots"]:
                if self.owner.get(s) == rid:
                    del self.owner[s]

    def _run_item(self, seq: int, it: worker_pb2.ForwardItem) -> None:
        rid, start = it.request_id, it.position_start
        where = f"Forward {seq} item {rid}@{start}"
        if it.has_prefix:
            if rid in self.known:
                self.violations.append(f"{where}: has_prefix for a request the worker knows")
            if len(it.prefix_slot_ids) != start or len(it.prefix_token_ids) != start:
                self.violations.append(f"{where}: prefix of {len(it.prefix_slot_ids)} slots / "
                                       f"{len(it.prefix_token_ids)} tokens")
            h, hashes = 0, []
            for pos, (slot, token) in enumerate(zip(it.prefix_slot_ids, it.prefix_token_ids)):
                h = chain(h, token)
                hashes.append(h)
                if self.kv.get(slot) != (pos, h):
                    self.violations.append(f"{where}: prefix slot {slot} (position {pos}) holds "
                                           f"{self.kv.get(slot)}, not token {token} there (K/V never written "
                                           f"or overwritten)")
                    break
            state = self.known[rid] = {"held": start, "h": hashes, "slots": list(it.prefix_slot_ids)}
        elif rid in self.released_sent:
            self.violations.append(f"{where}: runs after the request's release was sent on "
                                   f"{self.release_on[rid]} (a Forward in flight still held it)")
            return
        elif rid not in self.known:
            self.violations.append(f"{where}: the worker does not know the request (released, or never "
                                   f"registered: a use-after-free)")
            return
        else:
            state = self.known[rid]
        if state["held"] != start:
            self.violations.append(f"{where}: position {start}, the worker holds {state['held']} tokens")
            return
        steps = max(1, it.decode_steps)
        if it.input_from_last_sample:
            inputs = [TOKEN] * steps  # the last sample, then each step's sample (all TOKEN)
        elif steps > 1:
            inputs = list(it.input_ids[:1]) + [TOKEN] * (steps - 1)
        else:
            inputs = list(it.input_ids)
        if len(it.slot_ids) != len(inputs):
            self.violations.append(f"{where}: {len(it.slot_ids)} slots for {len(inputs)} tokens")
            return
        for token, slot in zip(inputs, it.slot_ids):
            other = self.owner.get(slot)
            if other is not None and other != rid and other in self.known:
                if other in self.released_sent:  # its release rides a Forward this one was inserted ahead of
                    self.overtaken += 1
                else:
                    self.violations.append(f"{where} (after/before {self.order_of[seq]}): writes slot {slot}, "
                                           f"which live request {other} holds (its release not sent)")
            pos = state["held"]
            h = chain(state["h"][-1] if state["h"] else 0, token)
            state["h"].append(h)
            self.reused += slot in self.kv
            self.kv[slot] = (pos, h)
            self.owner[slot] = rid
            state["slots"].append(slot)
            state["held"] += 1

    def check_tree(self, core: CacheCore) -> list[str]:
        """Every node of the radix tree names, at each depth, a slot whose K/V is that token at that position."""
        bad = []
        with core.lock, self.lock:
            tree = core._pool("default").tree
            for node in tree.nodes():
                tokens, slots = tree.path_key(node)
                h = 0
                for pos, (token, slot) in enumerate(zip(tokens, slots)):
                    h = chain(h, token)
                    if self.kv.get(slot) != (pos, h):
                        bad.append(f"tree node {node.id}: slot {slot} at position {pos} holds "
                                   f"{self.kv.get(slot)}, not token {token} (cached K/V never written)")
                        break
        return bad


@dataclass
class Completion:
    """One completion and what its stream delivered (read by its own thread)."""

    req: object
    max_new: int
    tokens: list[int] = field(default_factory=list)
    finish: str = ""
    end: object = None  # the StreamEnd
    flagged: bool = False  # sched.abort(...) returned True
    when: str = ""  # when its abort was asked (or "never")
    first: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)

    def read(self) -> None:
        try:
            while not isinstance(item := self.req.out.get(timeout=WAIT_S), StreamEnd):
                self.tokens.extend(item.token_ids)
                self.finish = item.finish_reason or self.finish
                if self.tokens:
                    self.first.set()
            self.end = item
        except Exception as exc:  # queue.Empty: the stream hung; recorded, asserted on below
            self.end = exc
        self.ended.set()


CONFIGS = [  # (scheduler settings, page size, pool capacity in tokens)
    pytest.param(dict(mixed_chunk=False, chunk_size=16, decode_steps=1), 1, CAPACITY, id="plain-c16-k1-p1"),
    pytest.param(dict(mixed_chunk=True, chunk_size=32, decode_steps=1), 1, CAPACITY, id="mixed-c32-k1-p1"),
    pytest.param(dict(mixed_chunk=False, chunk_size=64, decode_steps=4), 1, CAPACITY, id="plain-c64-k4-p1"),
    pytest.param(dict(mixed_chunk=True, chunk_size=16, decode_steps=4), 16, CAPACITY, id="mixed-c16-k4-p16"),
    # a small pool (the longest request fits): admissions wait for room, the tree is evicted and slots reused
    pytest.param(dict(mixed_chunk=True, chunk_size=32, decode_steps=2), 1, SMALL_CAPACITY, id="mixed-c32-k2-p1-small"),
]


@pytest.mark.parametrize("seed", [11, 23, 37, 41])
@pytest.mark.parametrize("cfg,page,capacity", CONFIGS)
def test_aborts_in_flight_keep_every_invariant(tokenizer, cfg, page, capacity, seed):
    with cache_service() as (core, cache):
        worker = StrictWorker(seed, page, capacity)
        log = structlog.wrap_logger(structlog.PrintLogger(), wrapper_class=structlog.make_filtering_bound_logger(30))
        sched = Scheduler(cache, worker, SchedulerConfig(max_running_requests=16, **cfg), log)
        sched.connect()
        submit = submitter(sched, tokenizer)
        loop = threading.Thread(target=sched.run, daemon=True)
        loop.start()
        try:
            completions = drive(sched, submit, seed)
            check(sched, core, worker, completions)
        finally:
            sched.stop("test over")
            loop.join(WAIT_S)


def drive(sched: Scheduler, submit, seed: int) -> list[Completion]:
    """TYPISTS threads, KEYSTROKES completions each, each aborting the one before at a random moment."""
    shared = random.Random(seed)
    header = [shared.randrange(100, 1000) for _ in range(40)]  # shared by every file
    done: list[Completion] = []
    lock = threading.Lock()

    def typist(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        head = header + [rng.randrange(100, 1000) for _ in range(rng.randint(10, 150))]
        tail = [rng.randrange(100, 1000) for _ in range(rng.randint(3, 12))]
        prev = None
        for k in range(KEYSTROKES):
            head += [rng.randrange(100, 1000) for _ in range(rng.randint(1, 3))]
            if rng.random() < 0.4:  # short: a few tokens of the header and a few of its own (within a chunk)
                prompt = header[:rng.randint(2, 12)] + [rng.randrange(100, 1000) for _ in range(rng.randint(1, 3))]
            else:  # long: several chunks, sharing the file so far with the previous keystroke
                prompt = head + tail
            c = Completion(submit(f"t{i}-{k}", prompt, rng.randint(1, 20)), 0)
            c.max_new = c.req.params.max_new_tokens
            threading.Thread(target=c.read, daemon=True).start()
            with lock:
                done.append(c)
            if rng.random() < 0.1:  # this one at once: most likely before its admission
                c.when = "now"
                c.flagged = sched.abort(c.req.rid, "cancelled")
            if prev is not None and not prev.when:
                abort_previous(sched, prev, rng)
            time.sleep(rng.uniform(0, 0.003))
            prev = c
        if prev is not None and not prev.when:
            prev.when = "never"

    threads = [threading.Thread(target=typist, args=(i,), daemon=True) for i in range(TYPISTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * WAIT_S)
        assert not t.is_alive(), "a typist hung"
    return done


def abort_previous(sched: Scheduler, prev: Completion, rng: random.Random) -> None:
    """Aborts ``prev`` at a random moment: at once, a few ms later, after its first token, after its end, never."""
    prev.when = rng.choice(["now", "soon", "soon", "first", "end", "never"])
    if prev.when == "soon":
        time.sleep(rng.uniform(0, 0.008))
    elif prev.when == "first":
        prev.first.wait(WAIT_S)
    elif prev.when == "end":
        prev.ended.wait(WAIT_S)
    if prev.when != "never":
        prev.flagged = sched.abort(prev.req.rid, "cancelled")


def check(sched: Scheduler, core: CacheCore, worker: StrictWorker, completions: list[Completion]) -> None:
    hung = [c.req.rid for c in completions if not c.ended.wait(WAIT_S)]
    assert not hung, f"streams never ended: {hung} (table: {[sched.table.where(c.req) for c in completions]})"
    for c in completions:
        rid = c.req.rid
        assert isinstance(c.end, StreamEnd) and c.end.code is None, f"{rid} ({c.when}): stream ended with {c.end!r}"
        assert c.finish in ("abort", "length"), f"{rid} ({c.when}): finish {c.finish!r}"
        assert set(c.tokens) <= {TOKEN}, f"{rid}: tokens {c.tokens}"
        if c.finish == "length" or not c.flagged:
            assert (c.finish, len(c.tokens)) == ("length", c.max_new), \
                f"{rid} (abort {c.when}, flagged {c.flagged}): {c.finish} after {len(c.tokens)} of {c.max_new} tokens"
        else:
            assert len(c.tokens) < c.max_new, f"{rid}: aborted after all its {c.max_new} tokens"
    deadline = time.monotonic() + WAIT_S
    while (sched.running or sched.waiting or sched.table.held() or worker.unanswered) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not sched.running and not sched.waiting and sched.table.held() == 0, \
        (f"not settled: running {[r.rid for r in sched.running]}, waiting {[r.rid for r in sched.waiting]}, "
         f"held {sched.table.held()}")
    assert not worker.unanswered, f"Forwards never answered: {sorted(worker.unanswered)}"
    deadline = time.monotonic() + WAIT_S  # an idle loop flushes the pending worker releases with one Release RPC
    while sched.table.releases.outstanding() and time.monotonic() < deadline:
        time.sleep(0.01)
    with worker.lock:
        violations = list(worker.violations)
        known = sorted(worker.known)
        unreleased = {rid: (n, worker.released[rid]) for rid, n in worker.registered.items() if worker.released[rid] != n}
        never = sorted(set(worker.released) - set(worker.registered))
    violations += worker.check_tree(core)
    assert violations == [], "\n".join(violations[:20])
    assert known == [], f"the worker still holds state of ended requests: {known}"
    assert unreleased == {}, f"(registrations, releases sent) per request, not equal: {unreleased}"
    assert never == [], f"released, never known at the worker: {never}"
    core.flush("test-flush", "default")
    status = core.pool_status("default")[0]
    assert core.check_integrity("default") == []
    assert status.counters.available == status.counters.capacity, f"leaked slots: {status.counters}"
    whens = Counter((c.when, c.finish, "decoding" if c.tokens else "no token") for c in completions)
    mid_prefill = sum(1 for c in completions if c.finish == "abort" and not c.tokens and worker.registered[c.req.rid])
    print(f"{len(completions)} completions, {worker.runs} Forwards, {worker.released_in_flight} releases sent with a "
          f"Forward in flight, {mid_prefill} aborted mid-prefill, {sum(c.req.retractions for c in completions)} "
          f"retractions, {worker.reused} slot reuses ({worker.overtaken} ahead of the release); {dict(sorted(whens.items()))}")
