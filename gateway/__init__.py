"""HTTP gateway: OpenAI-compatible and SGLang-native endpoints in front of the scheduler's gRPC API."""
