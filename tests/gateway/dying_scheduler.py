"""A stand-in scheduler run as its own process, so a test can kill -9 it while a request is in flight:
``python -m tests.gateway.dying_scheduler PORT``. Generate prints "generating <request_id>" on stdout, sends one
message (one token, text "x") and then waits forever (until the process is killed). Prints "serving" once the gRPC
server listens."""

from __future__ import annotations

import sys
import threading

from codeserve.v1 import scheduler_pb2, scheduler_pb2_grpc
from common.grpc_server import start


class HangingScheduler(scheduler_pb2_grpc.SchedulerServicer):
    def Generate(self, request, context):
        print(f"generating {request.request_id}", flush=True)
        yield scheduler_pb2.GenerateResponse(request_id=request.request_id, token_ids=[5], text="x", prompt_tokens=1)
        threading.Event().wait()


def main() -> None:
    running = start(lambda srv: scheduler_pb2_grpc.add_SchedulerServicer_to_server(HangingScheduler(), srv),
          ["codeserve.v1.Scheduler"], f"127.0.0.1:{sys.argv[1]}")
    print("serving", flush=True)
    threading.Event().wait()
    running.server.stop(0)  # never reached; holds the server (a dropped server object stops listening)


if __name__ == "__main__":
    main()
