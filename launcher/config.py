"""The launcher's settings and the exact command line of each service (one source for local mode,
tests and the docker-compose check).

Every flag of every service is either passed by the launcher (``PASSED``: a StackConfig field of the same
name, given to the services listed; ``commands`` also sets the addresses and the model path) or deliberately
left at the service's own default (``NOT_EXPOSED``, with the reason, printed by ``python -m launcher --help``).
``tests/deploy/test_launcher_flags.py`` reads each service's ``--help`` and fails on a flag in neither.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
from dataclasses import dataclass

import yaml

from launcher.ports import service_ports
from launcher.replicas import Replica, devices, layout

SERVICES = ("cache", "worker", "scheduler", "gateway")

HELP = {
    "model_path": "HF GPTBigCode checkpoint directory (default: the embedded default model)",
    "model_name": "served model name (default: the checkpoint directory's name)",
    "bind_host": "address every service binds (loopback by default)",
    "http_port": "gateway HTTP port",
    "cache_port": "cache service gRPC port",
    "worker_port": "worker gRPC port",
    "scheduler_port": "scheduler gRPC port (the public gRPC API)",
    "replicas": "data-parallel replicas: N workers, each with its own scheduler and KV pool (all pools in the one "
                "cache service), one gateway routing over them (ports: replica i's worker and scheduler listen on "
                "--worker-port / --scheduler-port + 2 i)",
    "devices": "the worker device of each replica, comma-separated (e.g. cuda:0,cuda:1; one may repeat: replicas "
               "sharing a GPU); default: --device for one replica, else cuda:0..N-1 when CUDA is present (--device "
               "cuda:K: all on cuda:K), else the CPU",
    "start_timeout": "seconds each service may take to become ready at start-up or restart (a worker's first "
                     "start on a GPU compiles flashinfer's kernels, ~2.5 min, and a 15B model loads 31 GB)",
    "device": "cpu, cuda, cuda:N or auto (CUDA when available)",
    "dtype": "float32, float16, bfloat16 or auto",
    "attention": "auto, torch or flashinfer (auto: flashinfer on CUDA when it imports)",
    "kv_tokens": "KV pool capacity in tokens (default: the worker's, from free memory)",
    "kv_fraction": "fraction of free device memory after weights given to the KV pool",
    "page_size": "tokens per KV page",
    "seed": "seed of the worker's generator for unseeded sampling",
    "cuda_graph_max_batch": "decode batches up to this size replay CUDA graphs (flashinfer on CUDA only; 0 = off)",
    "extend_graph_max_tokens": "other batches of up to this many tokens replay piecewise CUDA graphs, attention eager "
                               "between them (flashinfer on CUDA only; 0 = off)",
    "splitk_rows": "CUDA: projections of batches up to this many rows through the split-K Triton GEMM (default: 16 "
                   "for models of n_embd <= 1024, else 0; 0 = cuBLAS for all)",
    "extend_whole_graph": "extends of one request up to --extend-graph-max-tokens tokens replay one CUDA graph of "
                          "the whole forward (flashinfer on CUDA only): true or false (default true; false runs the worker "
                          "with its --no-extend-whole-graph)",
    "pdl": "CUDA: the worker's Triton kernels as programmatic dependent launches: true or false (--pdl false runs "
           "the worker with its --no-pdl)",
    "chunk_size": "prefill tokens per scheduling round (chunked prefill)",
    "max_running_requests": "requests running at once, at most",
    "max_queued_requests": "waiting requests, at most; beyond it HTTP 429",
    "max_queued_tokens": "waiting prompt tokens, at most; beyond it HTTP 429 (the scheduler's own default is 0 = "
                         "no bound; the launcher and compose bound it)",
    "policy": "waiting-queue order: fcfs or lpm (longest prefix match first)",
    "progress_timeout": "seconds without a completed batch, while work waits, before the scheduler is NOT_SERVING",
    "outage_timeout": "seconds the cache or worker may stay unreachable before the scheduler fails queued and "
                      "running requests with UNAVAILABLE (HTTP 503)",
    "worker_stall_timeout": "seconds the worker may leave its health checks unanswered (a frozen process) before the "
                            "scheduler fails its requests with UNAVAILABLE (HTTP 503) and new ones at once; 0 = off",
    "decode_steps": "decode steps per Forward (multi-step decode); 0 = auto: 8 on a CUDA worker, 1 otherwise",
    "overlap": "overlapped decode (the scheduler sends decode Forward N+1 before processing N): true or false "
               "(--overlap false runs the scheduler with its --no-overlap)",
    "overlap_mode": "when overlapped decode sends Forward N+1: queued (at once: it waits at the worker behind N; an "
                    "arrival's extend that reaches the worker first still goes first) or just-in-time (when N's reply "
                    "is in)",
    "lease_seconds": "the scheduler's session lease at the cache, in seconds (given to both: the scheduler asks "
                     "for it, the cache uses it for sessions that ask for none)",
    "drain_seconds": "on SIGTERM / Ctrl-C: seconds requests in flight may take to finish, at the gateway and at "
                     "the scheduler; the launcher waits this + 10 s for each before SIGKILL",
    "routing": "how the gateway spreads requests over the replicas: cache_aware (the least of uncached prompt "
               "tokens, asked of the cache, + weighted queued tokens + weighted requests), round_robin or least_load "
               "(one replica: not routed)",
    "api_key": "require 'Authorization: Bearer KEY' at the gateway (also read from CODESERVE_API_KEY)",
    "max_body_bytes": "largest HTTP request body the gateway accepts, in bytes; larger: 413",
    "max_n": "largest n (completions per prompt) the gateway accepts; larger: 400",
    "request_timeout": "seconds a generation may take at the gateway before it fails with 503 and the scheduler "
                       "aborts it (default: no limit)",
    "health_timeout": "seconds /health_generate may take",
    "probe_interval": "seconds between the gateway's scheduler health probes (0 = off)",
    "probe_timeout": "a scheduler that does not answer a probe within this many seconds is unreachable: /ready "
                     "503, new requests 503 at once, requests in flight end with 503",
}


@dataclass(frozen=True)
class StackConfig:
    """Settings of a local deployment. Ports are TCP ports on ``bind_host`` (loopback by default);
    ``model_path`` None means the embedded default model. Token counts are in tokens (KV slots), times in
    seconds, sizes in bytes. Each service setting has the name and default of the service's flag.

    Raises ValueError naming the setting when a value has the wrong type, or when both kv_tokens and
    kv_fraction are given (the worker takes one).
    """

    model_path: str | None = None
    model_name: str | None = None
    bind_host: str = "127.0.0.1"
    http_port: int = 8000
    cache_port: int = 50051
    worker_port: int = 50052
    scheduler_port: int = 50053
    replicas: int = 1
    devices: str | None = None
    start_timeout: float = 600.0
    # worker
    device: str = "auto"
    dtype: str = "auto"
    attention: str = "auto"
    kv_tokens: int | None = None
    kv_fraction: float | None = None
    page_size: int = 1
    seed: int = 0
    cuda_graph_max_batch: int = 256
    extend_graph_max_tokens: int = 1024
    extend_whole_graph: bool = True
    splitk_rows: int | None = None
    pdl: bool = True
    # scheduler
    chunk_size: int = 512
    max_running_requests: int = 64
    max_queued_requests: int = 1024
    max_queued_tokens: int = 524288
    policy: str = "fcfs"
    progress_timeout: float = 30.0
    outage_timeout: float = 30.0
    worker_stall_timeout: float = 10.0
    decode_steps: int = 0
    overlap: bool = True
    overlap_mode: str = "queued"
    # scheduler and cache; scheduler and gateway
    lease_seconds: float = 30.0
    drain_seconds: float = 5.0
    # gateway
    routing: str = "cache_aware"
    api_key: str | None = None
    max_body_bytes: int = 16 * 1024 * 1024
    max_n: int = 16
    request_timeout: float | None = None
    health_timeout: float = 10.0
    probe_interval: float = 0.5
    probe_timeout: float = 2.0

    def __post_init__(self) -> None:
        """A switch (``overlap``, ``pdl``, ``extend_whole_graph``) given as text (the launcher's
        flags are strings): true/false, yes/no, 1/0, on/off. An int given for a float setting becomes a float, a path
        given for a text setting its text."""
        words = {"true": True, "yes": True, "1": True, "on": True, "false": False, "no": False, "0": False, "off": False}
        for name in ("overlap", "pdl", "extend_whole_graph"):
            text = getattr(self, name)
            if isinstance(text, str):
                if text.lower() not in words:
                    raise ValueError(f"{name} must be true or false, got {text!r}")
                object.__setattr__(self, name, words[text.lower()])
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), value_type(f)
            if value is None and f.type.endswith("| None"):
                continue
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, f.name, float(value))
            elif kind is str and isinstance(value, os.PathLike):
                object.__setattr__(self, f.name, os.fspath(value))
            elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"{f.name} must be {kind.__name__}, got {value!r}")
        if self.kv_tokens is not None and self.kv_fraction is not None:
            raise ValueError("give kv_tokens or kv_fraction, not both (the worker sizes its KV pool from one)")

    @classmethod
    def from_yaml(cls, path: pathlib.Path, **overrides: object) -> "StackConfig":
        """Reads a YAML mapping of field names (dashes or underscores); raises ValueError on unknown keys."""
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a mapping of settings, got {type(raw).__name__}")
        values = {str(k).replace("-", "_"): v for k, v in raw.items()}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{path}: unknown settings {unknown}; known: {sorted(known)}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def value_type(f: dataclasses.Field) -> type:
    """The Python type of a StackConfig field's value (its annotation without ``| None``): int, float, bool or str."""
    return {"int": int, "float": float, "bool": bool, "str": str}[f.type.split(" |")[0]]


# The settings each service receives as ``--<name with dashes> VALUE`` (None: the flag is left out; a bool is a
# switch with the same default at the service as here, passed only when it differs: ``--<name>`` when True,
# ``--no-<name>`` when False).
PASSED: dict[str, tuple[str, ...]] = {
    "cache": ("lease_seconds",),
    "worker": ("device", "dtype", "page_size", "attention", "kv_tokens", "kv_fraction", "seed", "cuda_graph_max_batch",
               "extend_graph_max_tokens", "extend_whole_graph", "splitk_rows", "pdl"),
    "scheduler": ("max_running_requests", "chunk_size", "policy", "max_queued_requests", "max_queued_tokens",
                  "progress_timeout", "outage_timeout", "worker_stall_timeout", "lease_seconds", "drain_seconds", "decode_steps", "overlap",
                  "overlap_mode"),
    "gateway": ("model_name", "routing", "api_key", "max_body_bytes", "max_n", "request_timeout", "health_timeout",
                "probe_interval", "probe_timeout", "drain_seconds"),
}

# Flags the launcher sets from its own layout (addresses, the model, each replica's names and device:
# launcher/replicas.py, launcher/ports.py). The worker's --device is a setting (PASSED) that ``commands`` replaces by
# the replica's device.
PLACED: dict[str, tuple[str, ...]] = {
    "cache": ("--listen",),
    "worker": ("--listen", "--model-path", "--worker-id"),
    "scheduler": ("--listen", "--cache", "--worker", "--model-path", "--pool-id", "--owner"),
    "gateway": ("--host", "--port", "--scheduler", "--replica", "--model-path"),
}

ROUTER_TUNING = ("a weight or period of the router's cost (gateway.router; its defaults are what the routing "
                 "benchmark, bench/router_bench.py, ran with); one replica is not routed")

ADAPTIVE_STEPS = ("adaptive decode steps stay on (scheduler_svc/step_budget.py); tests/scheduler/arrival_sim.py "
                  "--no-adaptive-steps runs the loop without them for the A/B")

MIXED_CHUNK = ("mixed chunks stay off (they cost throughput on the H200, run 6); bench/serve_bench's mixed phase "
               "runs the scheduler with them for the A/B")

EARLY_MATCH = ("an arrival's admission Match sent by the servicer thread (docs/scheduler.md); bench/editor_bench's "
               "--scheduler-flags=--no-early-match is its A/B (bench/README.md, run 16)")
DELIVER_AFTER_SEND = ("a chained decode's stream messages handed over once the next Forward is sent (docs/scheduler.md); "
                      "tests/scheduler/arrival_sim.py --no-deliver-after-send and bench/serve_bench "
                      "--scheduler-flags are its A/B")
CHAIN_AFTER_EXTEND = ("the first decode Forward chained behind the extend that ends every prefill (docs/scheduler.md); "
                      "bench/serve_bench --scheduler-flags=--no-chain-after-extend is its A/B")
CHAIN_ADMISSIONS = ("the overlapped chain goes on through admissions (docs/scheduler.md); bench/serve_bench's "
                    "nochain phase runs the scheduler without it for the A/B")

GATEWAY_IO = ("the gateway serves on asyncio and h11 (its defaults); uvloop and httptools only for bench/serve_bench's "
              "A/B (--gateway-flags, bench/README.md run 23)")
GATEWAY_WORKERS = ("one gateway process until several are measured on the GPU (gateway/workers.py, session 25): "
                   "bench/serve_bench --gateway-flags=--workers=N is the A/B")
ARRIVAL_GATE = ("arrivals wait for a reply once two extends are queued at the worker (scheduler_svc/arrival_gate.py); "
                "off only for bench/serve_bench's A/B (--scheduler-flags=--no-arrival-gate)")
CHUNK_PIPELINE = ("chunked prefill pipelined stays on (the next extend sent while one runs: bench/README.md); "
                  "bench/serve_bench's nopipe phase runs the scheduler without it for the A/B")

RAGGED_PREFILL = ("flashinfer's ragged prefill stays on (its default; H200 run 12: 2,048-token prefill 16.6 -> 12.1 ms, "
                  "8,192 44.1 -> 41.1 ms): python -m worker_svc.bench --no-ragged-prefill and bench/serve_bench "
                  "--worker-flags=--no-ragged-prefill run the worker without it for an A/B")

PREPARE_AHEAD = ("a chained decode Forward's step metadata stays built while the Forward ahead runs (its default; H200 "
                 "run 13: 1B chained K = 8 steps 1.58 -> 1.49 ms at B = 1, 2.66 -> 2.30 at B = 64): python -m "
                 "worker_svc.bench times both, bench/serve_bench --worker-flags=--no-prepare-ahead runs without it")

LAUNCH_BEHIND = ("a chained decode Forward is launched behind the Forward ahead on the device (its default; H200 run "
                 "17): bench/serve_bench --worker-flags=--no-launch-behind runs without it for the A/B")

EXTEND_AHEAD = ("an eager extend of fresh prompts stays validated and laid out while the Forward ahead runs (its "
                "default; run 19 call 2, H100, 1B c64 x 3 rounds: 17,573 / 17,062 against 16,755 / 15,846 tok/s): "
                "bench/serve_bench --worker-flags=--no-extend-ahead runs without it for the A/B")

EXTEND_BEHIND = ("an eager extend of fresh prompts is launched behind the extend ahead of it, before that one's "
                 "read-back and commit (its default): bench/serve_bench --worker-flags=--no-extend-behind runs "
                 "without it for the A/B")

# Service flags the launcher leaves at the service's default, and why.
NOT_EXPOSED: dict[str, dict[str, str]] = {
    "cache": {
        "--drain-seconds": "the cache stops last, after the scheduler: no RPC is in flight (2 s grace)",
        "--log-level": "every service logs JSON at info to the run's log folder; the worker and scheduler have "
                       "no level flag, so one launcher flag could not mean the same for all",
    },
    "worker": {
        "--resident-rows": "the worker picks per model (auto: build.auto_resident_rows, as measured on an H100, run 31); "
                           "the flag is an A/B switch for bench/serve_bench --worker-flags and worker_svc.bench",
        "--resident-mm-rows": "the worker picks per model (auto: build.auto_resident_mm_rows, as measured on an H100, "
                              "run 32); the flag is an A/B switch for bench/serve_bench --worker-flags and worker_svc.bench",
        "--decode-attention": "the worker picks per model (auto: build.triton_decode_max_batch, as measured on the "
                              "H200); the flag is an A/B switch for bench/serve_bench --worker-flags",
        "--extend-attention": "the worker picks per extend graph bucket (auto: fa2 up to 128 tokens, as measured "
                              "on the H200, run 14); the flag is an A/B switch for bench/editor_bench --worker-flags",
        "--ragged-prefill": RAGGED_PREFILL,
        "--no-ragged-prefill": RAGGED_PREFILL,
        "--prepare-ahead": PREPARE_AHEAD,
        "--no-prepare-ahead": PREPARE_AHEAD,
        "--launch-behind": LAUNCH_BEHIND,
        "--no-launch-behind": LAUNCH_BEHIND,
        "--launch-lead-steps": ("1 (its default) is the measured trade: 2 took ~50 ms of decode gaps off an H100 c256 "
                                "phase but cost c64 ~1.1k tok/s (session 29, bench/README.md); an A/B switch for "
                                "bench/serve_bench --worker-flags"),
        "--hold-commit-ms": ("off (its default) until a GPU run measures it (session 33 wrote it from run 33's c256 "
                             "timeline); an A/B switch for bench/serve_bench --worker-flags"),
        "--switch-interval-us": ("CODESERVE_SWITCH_INTERVAL_US in the launcher's environment sets every service's alike "
                                 "(common/switch_interval.py); the worker's own is an A/B switch for bench/serve_bench "
                                 "--worker-flags"),
        "--extend-ahead": EXTEND_AHEAD,
        "--no-extend-ahead": EXTEND_AHEAD,
        "--extend-behind": EXTEND_BEHIND,
        "--no-extend-behind": EXTEND_BEHIND,
    },
    "scheduler": {
        "--connect-timeout": "the launcher starts the scheduler only once the cache and worker are SERVING",
        "--chain-depth": ("1 (its default): 2 (N+2 sent before N is applied, scheduler_svc/chain.py chain_ahead) "
                          "measured even on an H100's c256, 27,295 against 27,280 tok/s over 7 / 9 runs (session 33, "
                          "bench/README.md); an A/B switch for bench/serve_bench --scheduler-flags"),
        "--mixed-chunk": MIXED_CHUNK,
        "--no-mixed-chunk": MIXED_CHUNK,
        "--chunk-pipeline": CHUNK_PIPELINE,
        "--no-chunk-pipeline": CHUNK_PIPELINE,
        "--chain-admissions": CHAIN_ADMISSIONS,
        "--no-chain-admissions": CHAIN_ADMISSIONS,
        "--arrival-gate": ARRIVAL_GATE,
        "--no-arrival-gate": ARRIVAL_GATE,
        "--chain-after-extend": CHAIN_AFTER_EXTEND,
        "--no-chain-after-extend": CHAIN_AFTER_EXTEND,
        "--adaptive-steps": ADAPTIVE_STEPS,
        "--no-adaptive-steps": ADAPTIVE_STEPS,
        "--early-match": EARLY_MATCH,
        "--no-early-match": EARLY_MATCH,
        "--deliver-after-send": DELIVER_AFTER_SEND,
        "--no-deliver-after-send": DELIVER_AFTER_SEND,
    },
    "gateway": {
        "--log-level": "as the cache's --log-level",
        "--route-queued-weight": ROUTER_TUNING,
        "--route-requests-weight": ROUTER_TUNING,
        "--pending-ttl": ROUTER_TUNING,
        "--load-interval": ROUTER_TUNING,
        "--cache-probe-timeout": ROUTER_TUNING,
        "--loop": GATEWAY_IO,
        "--http": GATEWAY_IO,
        "--workers": GATEWAY_WORKERS,
    },
}


def flag_value(value: object) -> str:
    """A setting as a command-line value: 30.0 -> "30", 0.5 -> "0.5" (exact: repr, not 6 digits), else str()."""
    if isinstance(value, float):
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    return str(value)


def passed_flags(cfg: StackConfig, service: str) -> list[str]:
    """``--flag value`` pairs of the settings ``PASSED`` to ``service``, None values left out, then the switches
    that differ from their default (``--flag`` / ``--no-flag``)."""
    argv: list[str] = []
    switches: list[str] = []
    defaults = {f.name: f.default for f in dataclasses.fields(StackConfig)}
    for name in PASSED[service]:
        value, flag = getattr(cfg, name), name.replace("_", "-")
        if isinstance(value, bool):
            switches += [] if value == defaults[name] else ["--" + flag if value else "--no-" + flag]
        elif value is not None:
            argv += ["--" + flag, flag_value(value)]
    return argv + switches


def commands(cfg: StackConfig, model_path: str, python: str = sys.executable,
             ports: dict[str, int] | None = None) -> dict[str, list[str]]:
    """The argv of each service process, by process name, in start order: cache, each replica's worker and
    scheduler (``launcher.replicas``: ``worker``, ``scheduler`` for one replica), gateway. ``ports``: the port
    of each process (default: ``launcher.ports.service_ports(cfg)``; a stack passes the ones it resolved).
    Raises ValueError as ``launcher.replicas.devices`` does."""
    host = cfg.bind_host
    ports = service_ports(cfg) if ports is None else ports
    cache = f"{host}:{ports['cache']}"
    argv = {"cache": [python, "-m", "cache_svc", "--listen", cache] + passed_flags(cfg, "cache")}
    worker_flags = passed_flags(cfg, "worker")
    replicas = layout(cfg.replicas)
    for r, device in zip(replicas, devices(cfg)):
        worker, scheduler = f"{host}:{ports[r.worker]}", f"{host}:{ports[r.scheduler]}"
        argv[r.worker] = ([python, "-m", "worker_svc", "--listen", worker, "--model-path", model_path,
                           "--worker-id", r.worker_id] + with_value(worker_flags, "--device", device))
        argv[r.scheduler] = ([python, "-m", "scheduler_svc", "--listen", scheduler, "--cache", cache,
                              "--worker", worker, "--model-path", model_path, "--pool-id", r.pool_id,
                              "--owner", r.owner] + passed_flags(cfg, "scheduler"))
    argv["gateway"] = ([python, "-m", "gateway", "--host", host, "--port", str(ports["gateway"])]
                       + gateway_replica_flags(replicas, host, ports) + ["--model-path", model_path]
                       + passed_flags(cfg, "gateway"))
    return argv


def gateway_replica_flags(replicas: list[Replica], host: str, ports: dict[str, int]) -> list[str]:
    """The gateway's flags naming the replicas it routes over: ``--scheduler ADDR`` for one replica (as without
    replicas), else one ``--replica scheduler=ADDR,cache=ADDR,pool=ID`` per replica."""
    if len(replicas) == 1:
        return ["--scheduler", f"{host}:{ports[replicas[0].scheduler]}"]
    cache = f"{host}:{ports['cache']}"
    return [a for r in replicas
            for a in ("--replica", f"scheduler={host}:{ports[r.scheduler]},cache={cache},pool={r.pool_id}")]


def with_value(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` (``--flag value`` pairs) with ``flag``'s value replaced by ``value``."""
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def not_exposed_help() -> str:
    """The --help epilog: which service gets which setting, and the service flags left at their defaults."""
    lines = ["Each setting is the service flag of the same name and default, given to:"]
    lines += [f"  {service}: " + ", ".join("--" + n.replace("_", "-") for n in names) for service, names in PASSED.items()]
    lines += ["Service flags the launcher leaves at the service's default:"]
    lines += [f"  {service} {flag}: {why}" for service, flags in NOT_EXPOSED.items() for flag, why in flags.items()]
    lines += ["The launcher sets addresses, --model-path, and each replica's --worker-id, --pool-id, --owner and "
              "--device (one replica: worker-0, default, scheduler-0, --device; replica i of N > 1: worker-i, "
              "pool-i, scheduler-i, --devices' i-th) itself."]
    return "\n".join(lines)
