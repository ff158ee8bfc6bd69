"""grpcio's settings for every process of the system, set before grpc is first imported (each service package's
``__init__`` imports this module first).

``GRPC_EXPERIMENTS=-event_engine_client,-event_engine_listener`` (unless the environment sets it): grpcio 1.85's
EventEngine client and listener hand every call between threads (a poller thread reads the socket, then wakes the
caller through the completion queue): 4 voluntary context switches per unary call against 1 with them off. On the
H200 host (16 cores; H200 run 16, ``bench/results/h200-run16/probe_grpc.py``) a trivial unary call between two
processes took 586 / 524 us with them and 233 / 288 us without (the client's CPU 281 / 240 -> 86 / 140 us a call),
the cache's Match of 2 tokens 794 / 802 -> 522 / 530 us. Set ``GRPC_EXPERIMENTS`` (even to "") to choose otherwise.
"""

import os

EXPERIMENTS = "-event_engine_client,-event_engine_listener"

os.environ.setdefault("GRPC_EXPERIMENTS", EXPERIMENTS)
