"""Gateway settings and the model facts the gateway validates against."""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

from scheduler_svc.validate import MAX_STOP_CHARS, MAX_STOP_STRINGS


@dataclass(frozen=True)
class ModelFacts:
    """Facts read from the checkpoint's config.json.

    n_positions: context limit in tokens (prompt + generated). vocab_size: number of embedding rows;
    token ids must be in [0, vocab_size).
    """

    n_positions: int
    vocab_size: int

    @staticmethod
    def from_model_dir(model_dir: pathlib.Path) -> "ModelFacts":
        """Reads ``model_dir/config.json``. Raises FileNotFoundError when it is missing and
        KeyError naming the field when n_positions or vocab_size is absent."""
        config_path = pathlib.Path(model_dir) / "config.json"
        config = json.loads(config_path.read_text())
        for key in ("n_positions", "vocab_size"):
            if key not in config:
                raise KeyError(f"{config_path} has no {key!r}")
        return ModelFacts(n_positions=int(config["n_positions"]), vocab_size=int(config["vocab_size"]))


@dataclass(frozen=True)
class GatewaySettings:
    """Everything the HTTP layer needs besides the scheduler client and the tokenizer.

    Limits protect the server from oversized requests; each violation is a 400 (413 for the body)
    naming the limit. Times are in seconds.
    """

    model_name: str
    model: ModelFacts
    api_key: str | None = None
    max_body_bytes: int = 16 * 1024 * 1024
    max_n: int = 16
    max_prompts: int = 256
    max_stop_strings: int = MAX_STOP_STRINGS  # the scheduler enforces the same limits on its public API
    max_stop_chars: int = MAX_STOP_CHARS
    max_logprobs: int = 20
    retry_after_s: int = 1
    health_timeout_s: float = 10.0
    request_timeout_s: float | None = None  # deadline of each Generate call (None: no deadline)
    probe_interval_s: float = 0.5  # scheduler health probe period (gateway.readiness; 0 = no probe)
    probe_timeout_s: float = 2.0   # its deadline; no answer within it = scheduler unreachable (503 at once)
    default_max_tokens: int = 16
    # routing across several replicas (gateway.router; unused with one replica)
    routing: str = "cache_aware"        # cache_aware | round_robin | least_load
    route_queued_weight: float = 1.0    # w_q: per queued prompt token
    route_requests_weight: float = 16.0  # w_r: per request the scheduler holds (running + waiting)
    pending_ttl_s: float = 2.0          # a pending entry's life (or until its request's first message)
    load_interval_s: float = 0.25       # GetLoad poll period per replica
    cache_probe_timeout_s: float = 0.5  # ProbePrefix deadline; a cache that misses it is routed as 0 cached
    native_default_max_new_tokens: int = 128
