"""worker_svc: owns the device, GPTBigCode weights and KV pool tensors; runs extend/decode and sampling."""

import common.grpc_env  # noqa: F401  (first: grpcio's settings before grpc is imported)
