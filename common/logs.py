"""Structured JSON logs (structlog) for every service."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(service: str, level: str = "INFO") -> structlog.stdlib.BoundLogger:
    """Configures structlog to print one JSON object per line on stderr and returns a logger bound
    to ``service``. Safe to call more than once."""
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, level.upper()), format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        # one write() a line (PrintLogger's print() makes two: the text, then the newline): the processes of a
        # gateway of --workers share stderr, and two lines must not interleave into one
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    return structlog.get_logger().bind(service=service)
