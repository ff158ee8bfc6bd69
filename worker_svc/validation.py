"""Checks a whole forward batch before anything runs; the first problem found raises WorkerError.

Nothing is mutated here, and the engine calls this before touching the KV pool or its request table, so
a rejected batch changes nothing and the worker keeps serving.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

from worker_svc.model.config import ModelConfig
from worker_svc.types import ForwardItem, WorkerError

RESERVED_SLOT = 0


class HeldState(NamedTuple):
    """A request state as ``validate_batch`` reads it, for a table not committed yet (what a pending Forward's commit
    will leave, or a continuation row's length): ``slots`` only for its length."""

    slots: range
    last_token: int | None = None
    stopped: bool = False


def _bad(msg: str) -> WorkerError:
    return WorkerError("INVALID_ARGUMENT", msg)


def _check_slots(rid: str, what: str, slots: Sequence[int], pool_slots: int) -> None:
    if slots and (min(slots) < 1 or max(slots) >= pool_slots):
        bad = next(s for s in slots if s < 1 or s >= pool_slots)
        reason = "is the reserved slot 0" if bad == RESERVED_SLOT else f"is outside the pool [1, {pool_slots - 1}]"
        raise _bad(f"request {rid!r}: {what} slot id {bad} {reason}")


def _check_tokens(rid: str, what: str, ids: Sequence[int], vocab: int) -> None:
    if ids and (min(ids) < 0 or max(ids) >= vocab):
        bad = next(t for t in ids if t < 0 or t >= vocab)
        raise _bad(f"request {rid!r}: {what} token id {bad} is outside the vocabulary [0, {vocab - 1}]")


def _duplicate_slot(slots: Sequence[int], earlier: set[int]) -> int:
    """The first slot of ``slots`` that is in ``earlier`` or repeats within ``slots`` (one is known to)."""
    seen = earlier
    for s in slots:
        if s in seen:
            return s
        seen.add(s)
    raise AssertionError("no duplicate slot")  # callers call this only after the set size said there is one


def _check_multistep(it: ForwardItem, vocab: int) -> None:
    """An item of a batch with multi-step decode: a sampling decode item without per-step host work."""
    rid = it.request_id
    n = 1 if it.input_from_last_sample else len(it.input_ids)
    if n != 1 or not it.sample:
        raise _bad(f"request {rid!r}: a multi-step decode batch takes decode items only (1 input id, sample=true), "
                   f"got {len(it.input_ids)} input ids, sample={it.sample}")
    if it.return_prompt_logprobs or it.top_logprobs_num > 0 or it.sampling.has_penalties:
        raise _bad(f"request {rid!r}: multi-step decode does not take prompt logprobs, top_logprobs_num or "
                   f"penalties (send decode_steps 1)")


def _check_from_last(it: ForwardItem, known: Mapping[str, object]) -> None:
    """An ``input_from_last_sample`` item: a decode item whose input is the token this worker
    sampled last for a request it knows."""
    rid = it.request_id
    if it.input_ids or it.has_prefix:
        raise _bad(f"request {rid!r}: input_from_last_sample takes no input_ids and no prefix "
                   f"(got {len(it.input_ids)} input ids, has_prefix={it.has_prefix})")
    if not it.sample or it.return_prompt_logprobs:
        raise _bad(f"request {rid!r}: input_from_last_sample needs sample=true and no prompt logprobs")
    if rid not in known:
        raise WorkerError("NOT_FOUND", f"request {rid!r} is not known to this worker (input_from_last_sample)")
    if known[rid].last_token is None:
        raise _bad(f"request {rid!r}: input_from_last_sample but its previous Forward sampled no token")


def validate_batch(items: Sequence[ForwardItem], expected_epoch: str, epoch: str, cfg: ModelConfig,
                   pool_slots: int, known: Mapping[str, object], stored_hidden: Mapping[str, object]) -> None:
    """Raises WorkerError for the first invalid item; returns None when the batch may run.

    ``known`` maps request id -> state with ``len(state.slots)`` tokens, ``last_token`` (the token sampled
    last, or None) and ``stopped`` (its last Forward ended at a stop token: an ``input_from_last_sample``
    item is skipped, so its predicted position is not checked); ``stored_hidden`` holds the ids whose
    previous chunk kept its last hidden row (needed for input_ids[0]'s prompt logprob).
    """
    if expected_epoch != epoch:
        raise WorkerError("FAILED_PRECONDITION",
                          f"expected_epoch {expected_epoch!r} != worker epoch {epoch!r} (worker restarted: re-register the pool)")
    if not items:
        raise _bad("empty forward batch")
    seen_ids: set[str] = set()
    new_slots: set[int] = set()
    multi = any(it.decode_steps > 1 for it in items)
    for index, it in enumerate(items):
        rid = it.request_id
        if not rid:
            raise _bad("empty request_id")
        if rid in seen_ids:
            raise _bad(f"request {rid!r} appears twice in one batch")
        seen_ids.add(rid)
        if it.input_from_last_sample:
            _check_from_last(it, known)
        n = 1 if it.input_from_last_sample else len(it.input_ids)
        if n == 0:
            raise _bad(f"request {rid!r}: no input_ids")
        steps = it.decode_steps
        if steps < 1:
            raise _bad(f"request {rid!r}: decode_steps {steps} < 0")
        if multi:
            _check_multistep(it, cfg.vocab_size)
        n_slots = steps if steps > 1 else n
        if len(it.slot_ids) != n_slots:
            what = f"{steps} decode steps" if steps > 1 else f"{n} input_ids"
            raise _bad(f"request {rid!r}: {len(it.slot_ids)} slot_ids for {what}")
        if it.position_start < 0:
            raise _bad(f"request {rid!r}: position_start {it.position_start} < 0")
        last = it.position_start + n_slots - 1
        if last >= cfg.n_positions:
            raise _bad(f"request {rid!r}: position {last} (position_start {it.position_start} + {n_slots} tokens) "
                       f">= n_positions {cfg.n_positions}")
        _check_tokens(rid, "input", it.input_ids, cfg.vocab_size)
        _check_tokens(rid, "stop", it.stop_token_ids, cfg.vocab_size)
        _check_slots(rid, "new", it.slot_ids, pool_slots)
        before = len(new_slots)
        new_slots.update(it.slot_ids)
        if len(new_slots) != before + len(it.slot_ids):  # a slot of an earlier item, or twice in this one
            earlier = {s for other in items[:index] for s in other.slot_ids}
            raise _bad(f"request {rid!r}: slot id {_duplicate_slot(it.slot_ids, earlier)} is written twice in one batch")
        if it.has_prefix:
            if len(it.prefix_slot_ids) != it.position_start:
                raise _bad(f"request {rid!r}: {len(it.prefix_slot_ids)} prefix_slot_ids but position_start "
                           f"{it.position_start}")
            if len(it.prefix_token_ids) != it.position_start:
                raise _bad(f"request {rid!r}: {len(it.prefix_token_ids)} prefix_token_ids but position_start "
                           f"{it.position_start}")
            _check_slots(rid, "prefix", it.prefix_slot_ids, pool_slots)
            _check_tokens(rid, "prefix", it.prefix_token_ids, cfg.vocab_size)
            overlap = set(it.prefix_slot_ids) & set(it.slot_ids)
            if overlap:
                raise _bad(f"request {rid!r}: new slot ids {sorted(overlap)[:4]} are also prefix slots")
        else:
            if rid not in known:
                raise WorkerError("NOT_FOUND", f"request {rid!r} is not known to this worker and has_prefix is false "
                                               f"(send has_prefix with its prefix after a retract or restart)")
            held = len(known[rid].slots)
            skipped = it.input_from_last_sample and known[rid].stopped
            if it.position_start != held and not skipped:
                raise _bad(f"request {rid!r}: position_start {it.position_start} but the worker holds {held} "
                           f"tokens for it")
        if it.prompt_len < 0:
            raise _bad(f"request {rid!r}: prompt_len {it.prompt_len} < 0")
        if not 0 <= it.top_logprobs_num <= cfg.vocab_size:
            raise _bad(f"request {rid!r}: top_logprobs_num {it.top_logprobs_num} outside [0, {cfg.vocab_size}]")
        reason = it.sampling.validate()
        if reason:
            raise _bad(f"request {rid!r}: {reason}")
        if it.return_prompt_logprobs and it.position_start > 0 and (it.has_prefix or rid not in stored_hidden):
            raise _bad(f"request {rid!r}: prompt logprobs from position {it.position_start} need the previous chunk "
                       f"computed on this worker with return_prompt_logprobs (no cached prefix for echo logprobs)")
