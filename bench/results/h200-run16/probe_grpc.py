# A trivial unary call (grpc.health.v1 Check) between two processes against a raw TCP echo: latency, client CPU and voluntary context switches a call, the server's CPU.
import os, sys, time, socket, subprocess, resource
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
if sys.argv[1] == "server":
    from concurrent import futures
    from grpc_health.v1 import health
    s = grpc.server(futures.ThreadPoolExecutor(8))
    hs = health.HealthServicer(); health_pb2_grpc.add_HealthServicer_to_server(hs, s)
    s.add_insecure_port("127.0.0.1:50999"); s.start()
    time.sleep(12); r = resource.getrusage(resource.RUSAGE_SELF); print("server cpu s", r.ru_utime + r.ru_stime, "vol ctx", r.ru_nvcsw, "invol", r.ru_nivcsw, flush=True)
elif sys.argv[1] == "echo":
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); l.bind(("127.0.0.1", 50998)); l.listen(); c, _ = l.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        d = c.recv(100)
        if not d: break
        c.sendall(d)
else:
    e = subprocess.Popen([sys.executable, os.path.abspath(__file__), "echo"])
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "server"]); time.sleep(1.5)
    s = socket.create_connection(("127.0.0.1", 50998)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    xs = []
    for _ in range(2000):
        t = time.perf_counter(); s.sendall(b"x" * 20); s.recv(100); xs.append(time.perf_counter() - t)
    xs.sort(); print("raw socket p50 %.0f us" % (xs[1000]*1e6))
    ch = grpc.insecure_channel("127.0.0.1:50999"); st = health_pb2_grpc.HealthStub(ch)
    req = health_pb2.HealthCheckRequest()
    for _ in range(100): st.Check(req)
    r0 = resource.getrusage(resource.RUSAGE_SELF); xs = []
    for _ in range(2000):
        t = time.perf_counter(); st.Check(req); xs.append(time.perf_counter() - t)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    xs.sort()
    print("grpc p50 %.0f us p10 %.0f p90 %.0f; client cpu/call %.0f us, vol ctx/call %.1f" % (xs[1000]*1e6, xs[200]*1e6, xs[1800]*1e6,
          (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / 2000 * 1e6, (r1.ru_nvcsw - r0.ru_nvcsw) / 2000))
    p.wait(); e.kill()
