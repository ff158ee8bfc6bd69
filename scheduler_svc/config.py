"""The scheduler's settings (``SchedulerConfig``), read by the loop and handed to its parts."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_svc.overlap_mode import DEFAULT_OVERLAP_MODE, OVERLAP_MODES


@dataclass(frozen=True)
class SchedulerConfig:
    """Loop settings (tokens for sizes, seconds for times)."""

    pool_id: str = "default"
    max_running_requests: int = 64
    chunk_size: int = 512
    policy: str = "fcfs"
    max_queued_requests: int = 1024
    progress_timeout: float = 30.0
    outage_timeout: float = 30.0
    owner: str = "scheduler-0"
    lease_seconds: float = 30.0
    decode_steps: int = 1  # > 1: multi-step decode, up to this many steps per Forward (scheduler_svc/multistep.py)
    # fewer decode steps per Forward while arrivals come, so their first token waits less behind the Forward in
    # flight; decode_steps when none came recently (scheduler_svc/step_budget.py)
    adaptive_steps: bool = True
    overlap: bool = True  # steady decode sends Forward N+1 before processing N (scheduler_svc/scheduler.py)
    # the overlapped chain goes on through admissions (chain.can_chain): waiting requests admitted by the chain,
    # their first decode in the next continuation; off: an admission drains the decode in flight first
    chain_admissions: bool = True
    # the chain starts behind an extend that ends every prefill in flight: the first decode Forward is sent while
    # that extend runs (chain.can_chain), not after its reply is applied (H100 run 21: 14-18 ms idle each time)
    chain_after_extend: bool = True
    # arrivals admitted while a Forward runs wait, once two extends in flight are unanswered, for a reply or a
    # whole chunk of them (arrival_gate.py): a trickling burst is prefilled in full chunks, not one extend each
    arrival_gate: bool = True
    # when N+1 is sent (overlap_mode.OVERLAP_MODES): "queued" at once; "just-in-time" when N's reply is in
    overlap_mode: str = DEFAULT_OVERLAP_MODE
    # decode Forwards the chain keeps queued at the worker: 1 sends N+2 once N is applied; 2 sends it as soon as N's
    # reply is in, before N is applied, so it can be launched behind N+1 (chain.chain_ahead; "queued" mode only)
    chain_depth: int = 1
    # decoding requests ride in extend batches, one step each (vLLM's chunked prefill, SGLang's mixed chunk), so
    # a decode never stalls for a whole prefill (scheduler_svc/planner.py: Planner.extend). Off by default: on the
    # H200 it cut ITL p99 4-10x but cost 5% (c64) and 20% (c256) of throughput (bench/README.md, run 6)
    mixed_chunk: bool = False
    # chunked prefill pipelined: the next chunk of a long prompt is allocated and sent while the one before it runs
    # (scheduler_svc/chunk_ahead.py), so the worker does not idle between the chunks of one prompt
    chunk_pipeline: bool = True
    # an arrival's admission Match is sent by the Generate handler that received it, while it waits for the loop
    # (scheduler_svc/early_match.py; fcfs only)
    early_match: bool = True
    # the stream messages of a decode Forward applied by the chain are handed to their streams once the next Forward
    # is sent, not before its Allocate (scheduler_svc/outbox.py)
    deliver_after_send: bool = True

    def __post_init__(self) -> None:
        if self.overlap_mode not in OVERLAP_MODES:
            raise ValueError(f"overlap_mode must be one of {', '.join(OVERLAP_MODES)}, got {self.overlap_mode!r}")
        if self.chain_depth not in (1, 2):
            raise ValueError(f"chain_depth must be 1 or 2, got {self.chain_depth}")
