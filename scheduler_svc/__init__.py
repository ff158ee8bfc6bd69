import common.grpc_env  # noqa: F401  (first: grpcio's settings before grpc is imported)
