import os, time
_f = None
def mark(rid, label):
    global _f
    if _f is None:
        _f = open(f"/tmp/abs_trace.{os.getpid()}.txt", "a", buffering=1)
    _f.write(f"{rid} {label} {time.perf_counter():.6f}\n")
