"""The trailer of a Generate error status that the scheduler counted in its request metrics.

The scheduler sets it on every error status it ends a Generate call with (``scheduler_svc/service.py``); the gateway
reads it to leave such an error out of its own ``codeserve:request_errors`` count (``gateway/generation.py``), so
each request is counted once. An error without it came from gRPC's transport (no scheduler answered).
"""

COUNTED_MARK = ("codeserve-counted", "generate_errors")  # (key, value) of the trailing metadata


def counted_by_scheduler(trailing_metadata) -> bool:
    """True when ``trailing_metadata`` (a call's trailers: (key, value) pairs, or None) carries the mark."""
    return COUNTED_MARK in tuple(trailing_metadata or ())
