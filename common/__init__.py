"""Small pieces shared by every service: logging, gRPC server start-up, rich gRPC errors."""
