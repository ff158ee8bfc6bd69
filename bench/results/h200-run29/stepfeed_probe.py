"""Session 29 probe: host time of the worker's arrival-path pieces for a 256-row, K = 8 decode Forward at context 1,152
on the accelerator's host (StepFeed with CUDA tensors; the protobuf -> item conversion), medians of 30."""
import statistics
import time

import numpy as np
import torch

from codeserve.v1 import worker_pb2
from worker_svc.service import item_from_proto
from worker_svc.step_feed import StepFeed

B, CTX, K = 256, 1152, 8
dev = torch.device("cuda")
rng = np.random.default_rng(0)
tables = [rng.integers(1, 1 << 20, CTX, dtype=np.int32) for _ in range(B)]
new = [list(range(1 + b * K, 1 + (b + 1) * K)) for b in range(B)]


def med(fn, n=30):
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return 1e3 * statistics.median(out)


def feed():
    return StepFeed(tables, new, [K] * B, dev, bucket=lambda n: n)


print(f"StepFeed host {med(feed):.3f} ms")
print(f"StepFeed host+device {med(lambda: (feed(), torch.cuda.synchronize())):.3f} ms")
busy = torch.empty(1 << 28, device=dev)  # keep the device busy (a copy queued ahead), as while a Forward runs
print(f"StepFeed host behind busy stream {med(lambda: (busy.mul_(1.0001), feed())):.3f} ms")
req = worker_pb2.ForwardRequest(items=[worker_pb2.ForwardItem(request_id=f"r{b}", position_start=CTX, slot_ids=new[b],
                                                              decode_steps=K, input_from_last_sample=True,
                                                              stop_token_ids=[0]) for b in range(B)])
data = req.SerializeToString()
print(f"parse {med(lambda: worker_pb2.ForwardRequest.FromString(data)):.3f} ms")
print(f"convert {med(lambda: [item_from_proto(m) for m in req.items]):.3f} ms")
print(f"pin 1.2 MB {med(lambda: torch.from_numpy(np.concatenate(tables)).pin_memory()):.3f} ms")
print(f"concat {med(lambda: np.concatenate(tables)):.3f} ms")
