"""The launcher's settings and the exact command line of each service (one source for local mode,
tests and the docker-compose check)."""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from dataclasses import dataclass

import yaml

SERVICES = ("cache", "worker", "scheduler", "gateway")

HELP = {
    "model_path": "HF GPTBigCode checkpoint directory (default: the embedded default model)",
    "model_name": "served model name (default: the checkpoint directory's name)",
    "bind_host": "address every service binds (loopback by default)",
    "http_port": "gateway HTTP port",
    "cache_port": "cache service gRPC port",
    "worker_port": "worker gRPC port",
    "scheduler_port": "scheduler gRPC port (the public gRPC API)",
    "device": "cpu, cuda, cuda:N or auto (CUDA when available)",
    "dtype": "float32, float16, bfloat16 or auto",
    "attention": "auto, torch or flashinfer (auto: flashinfer on CUDA when it imports)",
    "kv_tokens": "KV pool capacity in tokens (default: the worker's, from free memory)",
    "kv_fraction": "fraction of free device memory after weights given to the KV pool",
    "page_size": "tokens per KV page",
    "chunk_size": "prefill tokens per scheduling round (chunked prefill)",
    "max_running_requests": "requests running at once, at most",
    "max_queued_requests": "waiting requests, at most; beyond it HTTP 429",
    "max_queued_tokens": "waiting prompt tokens, at most; beyond it HTTP 429",
    "policy": "waiting-queue order: fcfs or lpm (longest prefix match first)",
    "progress_timeout": "seconds without a completed batch, while work waits, before the scheduler is NOT_SERVING",
    "lease_seconds": "the scheduler's session lease at the cache, in seconds",
    "overlap": "overlapped decode (the scheduler sends decode Forward N+1 before processing N); false: --no-overlap",
    "api_key": "require 'Authorization: Bearer KEY' at the gateway (also read from CODESERVE_API_KEY)",
}


@dataclass(frozen=True)
class StackConfig:
    """Settings of a local deployment. Ports are TCP ports on ``bind_host`` (loopback by default);
    ``model_path`` None means the embedded default model. Token counts are in tokens (KV slots)."""

    model_path: str | None = None
    model_name: str | None = None
    bind_host: str = "127.0.0.1"
    http_port: int = 8000
    cache_port: int = 50051
    worker_port: int = 50052
    scheduler_port: int = 50053
    device: str = "auto"
    dtype: str = "auto"
    attention: str = "auto"
    kv_tokens: int | None = None
    kv_fraction: float | None = None
    page_size: int = 1
    chunk_size: int = 512
    max_running_requests: int = 64
    max_queued_requests: int = 1024
    max_queued_tokens: int = 524288
    policy: str = "fcfs"
    progress_timeout: float = 30.0
    lease_seconds: float = 30.0
    overlap: bool = True
    api_key: str | None = None

    def __post_init__(self) -> None:
        """``overlap`` given as text (the launcher's flags are strings): true/false, yes/no, 1/0, on/off."""
        if isinstance(self.overlap, str):
            words = {"true": True, "yes": True, "1": True, "on": True, "false": False, "no": False, "0": False, "off": False}
            if self.overlap.lower() not in words:
                raise ValueError(f"overlap must be true or false, got {self.overlap!r}")
            object.__setattr__(self, "overlap", words[self.overlap.lower()])

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


def commands(cfg: StackConfig, model_path: str, python: str = sys.executable) -> dict[str, list[str]]:
    """The argv of each service, in start order (cache, worker, scheduler, gateway)."""
    host = cfg.bind_host
    worker = [python, "-m", "worker_svc", "--listen", f"{host}:{cfg.worker_port}", "--model-path", model_path,
              "--device", cfg.device, "--dtype", cfg.dtype, "--page-size", str(cfg.page_size),
              "--attention", cfg.attention, "--worker-id", "worker-0"]
    if cfg.kv_tokens is not None:
        worker += ["--kv-tokens", str(cfg.kv_tokens)]
    if cfg.kv_fraction is not None:
        worker += ["--kv-fraction", f"{cfg.kv_fraction:g}"]
    gateway = [python, "-m", "gateway", "--host", host, "--port", str(cfg.http_port),
               "--scheduler", f"{host}:{cfg.scheduler_port}", "--model-path", model_path]
    if cfg.model_name:
        gateway += ["--model-name", cfg.model_name]
    if cfg.api_key:
        gateway += ["--api-key", cfg.api_key]
    return {
        "cache": [python, "-m", "cache_svc", "--listen", f"{host}:{cfg.cache_port}",
                  "--lease-seconds", f"{cfg.lease_seconds:g}"],
        "worker": worker,
        "scheduler": [python, "-m", "scheduler_svc", "--listen", f"{host}:{cfg.scheduler_port}",
                      "--cache", f"{host}:{cfg.cache_port}", "--worker", f"{host}:{cfg.worker_port}",
                      "--model-path", model_path, "--pool-id", "default",
                      "--max-running-requests", str(cfg.max_running_requests), "--chunk-size", str(cfg.chunk_size),
                      "--policy", cfg.policy, "--max-queued-requests", str(cfg.max_queued_requests),
                      "--max-queued-tokens", str(cfg.max_queued_tokens),
                      "--progress-timeout", f"{cfg.progress_timeout:g}"] + ([] if cfg.overlap else ["--no-overlap"]),
        "gateway": gateway,
    }
