"""Starts cache, worker, scheduler and gateway as separate processes (local mode)."""

import common.grpc_env  # noqa: F401  (first: grpcio's settings before grpc is imported)
