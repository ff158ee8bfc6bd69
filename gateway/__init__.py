"""HTTP gateway: OpenAI-compatible and SGLang-native endpoints in front of the scheduler's gRPC API."""

import common.grpc_env  # noqa: F401  (first: grpcio's settings before grpc is imported)
