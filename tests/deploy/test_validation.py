"""Out-of-range settings are refused before anything starts, and Ctrl-C / SIGTERM during start-up stops what was
started.

Each service's own parser refuses a value out of its range with a usage error (exit 2) naming the flag (a service
started by hand or by compose refuses the same values); ``python -m launcher`` runs those parsers on the command
lines it would give the services, so it exits 2 naming its setting with no service process started and no log
folder made. Was: only types were checked; e.g. ``--max-body-bytes -1`` made every request a 413 (GET /health too)
and the launcher waited 180 s, and a start-up could not be interrupted.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from launcher.config import StackConfig
from launcher.ports import free_ports
from launcher.validate import MODULES, check
from tests.deploy.launched import alive, wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOGS = ROOT / ".cache" / "logs"

# Launcher flag, value, what the error must say: every value the fresh-user review found accepted, and more.
OUT_OF_RANGE = [
    ("--max-body-bytes", "-1", "--max-body-bytes must be >= 1 (got -1)"),
    ("--max-n", "0", "--max-n must be >= 1 (got 0)"),
    ("--request-timeout", "-5", "--request-timeout must be a finite number > 0 (got -5.0)"),
    ("--request-timeout", "0", "--request-timeout must be a finite number > 0 (got 0.0)"),
    ("--request-timeout", "nan", "--request-timeout must be a finite number > 0 (got nan)"),
    ("--request-timeout", "inf", "--request-timeout must be a finite number > 0 (got inf)"),
    ("--drain-seconds", "-1", "--drain-seconds must be a finite number >= 0 (got -1.0)"),
    ("--worker-stall-timeout", "-1", "--worker-stall-timeout must be a finite number >= 0 (got -1.0)"),
    ("--probe-timeout", "0", "--probe-timeout must be a finite number > 0 (got 0.0)"),
    ("--probe-interval", "-1", "--probe-interval must be a finite number >= 0 (got -1.0)"),
    ("--probe-interval", "nan", "--probe-interval must be a finite number >= 0 (got nan)"),
    ("--lease-seconds", "0", "--lease-seconds must be > 0 (got 0.0)"),
    ("--kv-fraction", "2", "--kv-fraction must be in (0, 1] (got 2.0)"),
    ("--kv-fraction", "0", "--kv-fraction must be in (0, 1] (got 0.0)"),
    ("--decode-steps", "-1", "--decode-steps must be in 0..2147483647 (got -1)"),
    ("--policy", "xyz", "argument --policy: invalid choice: 'xyz'"),
    ("--dtype", "int8", "argument --dtype: invalid choice: 'int8'"),
    ("--device", "gpu", "argument --device: must be cpu, cuda, cuda:N or auto (got 'gpu')"),
    ("--attention", "fast", "argument --attention: invalid choice: 'fast'"),
    ("--http-port", "70000", "--http-port must be in 0..65535 (got 70000)"),
    ("--cache-port", "-1", "--cache-port must be in 0..65535 (got -1)"),
    ("--health-timeout", "0", "--health-timeout must be a finite number > 0 (got 0.0)"),
    ("--max-queued-requests", "0", "--max-queued-requests must be in 1..2147483647 (got 0)"),
    ("--max-queued-requests", "2147483648", "--max-queued-requests must be in 1..2147483647 (got 2147483648)"),
    ("--max-running-requests", "0", "--max-running-requests must be in 1..2147483647 (got 0)"),
    ("--max-running-requests", "99999999999999999999",
     "--max-running-requests must be in 1..2147483647 (got 99999999999999999999)"),
    ("--max-queued-tokens", "-1", "--max-queued-tokens must be in 0..9223372036854775807 (got -1)"),
    ("--chunk-size", "0", "--chunk-size must be in 1..2147483647 (got 0)"),
    ("--chunk-size", "4294967296", "--chunk-size must be in 1..2147483647 (got 4294967296)"),
    ("--outage-timeout", "-3", "--outage-timeout must be a finite number > 0 (got -3.0)"),
    ("--progress-timeout", "0", "--progress-timeout must be a finite number > 0 (got 0.0)"),
    ("--page-size", "0", "--page-size must be >= 1 (got 0)"),
    ("--kv-tokens", "0", "--kv-tokens must be >= the page size 1 (got 0)"),
    ("--cuda-graph-max-batch", "-1", "--cuda-graph-max-batch must be >= 0 (got -1)"),
    ("--extend-graph-max-tokens", "-2", "--extend-graph-max-tokens must be >= 0 (got -2)"),
    ("--splitk-rows", "257", "--splitk-rows must be in [0, 256] (got 257)"),
]


def run_launcher(*flags: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m launcher`` on free ports with ``flags``, CPU; its output captured."""
    ports = [a for name, port in zip(("http", "cache", "worker", "scheduler"), free_ports(4)) for a in (f"--{name}-port", str(port))]
    return subprocess.run([sys.executable, "-m", "launcher", "--device", "cpu", *ports, *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def log_dirs_of(pid: int, since: float = 0.0) -> list[pathlib.Path]:
    """The launcher run's log folders (``.cache/logs/<time>-<pid>``), those changed at or after ``since`` (epoch
    seconds; a checkout that served before may hold a folder of an earlier run whose pid was the same)."""
    return sorted(d for d in LOGS.glob(f"*-{pid}") if d.stat().st_mtime >= since) if LOGS.exists() else []


@pytest.mark.parametrize("flag, value, message", OUT_OF_RANGE, ids=[f"{f}={v}" for f, v, _ in OUT_OF_RANGE])
def test_the_launcher_refuses_an_out_of_range_setting_before_starting_anything(flag: str, value: str,
                                                                               message: str) -> None:
    started = time.time() - 1.0  # the file system's time stamps may lag the clock a little
    done = subprocess.Popen([sys.executable, "-m", "launcher", "--device", "cpu", flag, value], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = done.communicate(timeout=60)
    assert done.returncode == 2, (out, err)
    assert "python -m launcher: error: " + message in err, err
    assert "starting" not in out and out == "", out  # the start-up line is never printed
    assert log_dirs_of(done.pid, since=started) == []  # no service log: no service was started


def test_an_out_of_range_setting_in_the_yaml_file_is_refused_the_same_way(tmp_path: pathlib.Path) -> None:
    yml = tmp_path / "deploy.yaml"
    yml.write_text("max_body_bytes: -1\n")
    done = run_launcher("--config", str(yml))
    assert done.returncode == 2 and "--max-body-bytes must be >= 1 (got -1)" in done.stderr, done.stderr
    assert done.stdout == ""


def test_the_edges_of_each_range_are_accepted() -> None:
    """0 means off / auto / a free port where the services say so; kv_fraction 1 is the whole free memory."""
    check(StackConfig(http_port=0, cache_port=65535, worker_stall_timeout=0.0, probe_interval=0.0, decode_steps=0,
                      drain_seconds=0.0, max_queued_tokens=0, cuda_graph_max_batch=0, kv_fraction=1.0,
                      request_timeout=0.001, device="cuda:1", seed=-1))
    check(StackConfig())
    check(StackConfig(http_port=0, cache_port=0, worker_port=0, scheduler_port=0))  # free ports may all be 0
    check(StackConfig(max_running_requests=2**31 - 1, chunk_size=2**31 - 1, max_queued_requests=2**31 - 1,
                      max_queued_tokens=2**63 - 1))  # the wire types' limits
    with pytest.raises(ValueError, match=re.escape("--worker-port 18051 is also --cache-port: each service needs "
                                                   "its own port")):
        check(StackConfig(cache_port=18051, worker_port=18051))
    with pytest.raises(ValueError, match=re.escape("--model-path /nonexistent: no config.json there")):
        check(StackConfig(model_path="/nonexistent"))
    with pytest.raises(ValueError, match=re.escape("--seed must be in [-2**63, 2**64) (got 18446744073709551616)")):
        check(StackConfig(seed=2**64))


# Service, its own argv (after ``python -m MODULE``), what its parser must say: each service refuses by itself.
SERVICE_CASES = [
    ("cache", ["--lease-seconds", "nan"], "--lease-seconds must be > 0 (got nan)"),
    ("cache", ["--drain-seconds", "-1"], "--drain-seconds must be >= 0 (got -1.0)"),
    ("worker", ["--model-path", "m", "--kv-fraction", "inf"], "--kv-fraction must be in (0, 1] (got inf)"),
    ("worker", ["--model-path", "m", "--page-size", "4", "--kv-tokens", "3"],
     "--kv-tokens must be >= the page size 4 (got 3)"),
    ("worker", ["--model-path", "m", "--device", "cuda:x"], "argument --device: must be cpu, cuda, cuda:N or auto"),
    ("scheduler", ["--model-path", "m", "--worker-stall-timeout", "-1"],
     "--worker-stall-timeout must be a finite number >= 0 (got -1.0)"),
    ("scheduler", ["--model-path", "m", "--connect-timeout", "nan"],
     "--connect-timeout must be a finite number >= 0 (got nan)"),
    ("scheduler", ["--model-path", "m", "--lease-seconds", "0"], "--lease-seconds must be a finite number > 0 (got 0.0)"),
    ("gateway", ["--model-path", "m", "--port", "65536"], "--port must be in 0..65535 (got 65536)"),
    ("gateway", ["--model-path", "m", "--max-body-bytes", "0"], "--max-body-bytes must be >= 1 (got 0)"),
    ("gateway", ["--model-path", "m", "--health-timeout", "inf"], "--health-timeout must be a finite number > 0 (got inf)"),
]


@pytest.mark.parametrize("service, argv, message", SERVICE_CASES, ids=[f"{s}:{a[-2]}={a[-1]}" for s, a, _ in SERVICE_CASES])
def test_each_service_parser_refuses_out_of_range_values_by_itself(service: str, argv: list[str], message: str,
                                                                   capsys: pytest.CaptureFixture) -> None:
    module = __import__(MODULES[service] + ".__main__", fromlist=["parse_args"])
    with pytest.raises(SystemExit) as exc:
        module.parse_args(argv)
    assert exc.value.code == 2
    assert f"python -m {MODULES[service]}: error: {message}" in capsys.readouterr().err


def test_a_service_started_by_hand_exits_2_on_an_out_of_range_value() -> None:
    done = subprocess.run([sys.executable, "-m", "scheduler_svc", "--model-path", "m", "--worker-stall-timeout", "-1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--worker-stall-timeout must be a finite number >= 0 (got -1.0)" in done.stderr


def children(pid: int) -> dict[int, str]:
    """PID -> command line of the live child processes of ``pid`` (Linux /proc)."""
    found = {}
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited meanwhile: not a child to wait for
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found[int(proc.name)] = cmd
    return found


def with_worker(procs: dict[int, str]) -> dict[int, str] | None:
    """``procs`` when one of them is the worker, else None."""
    return procs if any("worker_svc" in cmd for cmd in procs.values()) else None


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_start_up_stops_what_was_started(tmp_path: pathlib.Path, sig: signal.Signals) -> None:
    """Sent once the cache serves and the worker is loading: the launcher stops the cache and the worker and exits
    0 (as after start-up) within 10 s; neither the scheduler nor the gateway is started. Was: the signal was only
    looked at after start-up (up to 180 s per service)."""
    ports = [a for name, port in zip(("http", "cache", "worker", "scheduler"), free_ports(4)) for a in (f"--{name}-port", str(port))]
    out = tmp_path / "launcher.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "launcher", "--device", "cpu", "--dtype", "float32",
                                 "--kv-tokens", "4096", *ports], cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
    started: dict[int, str] = {}
    try:
        log_dir = wait_for(lambda: next(iter(log_dirs_of(proc.pid)), None), 120, "the run's log folder")
        wait_for(lambda: (log_dir / "cache.log").exists() and '"serving"' in (log_dir / "cache.log").read_text(),
                 120, "the cache's serving line")
        started = wait_for(lambda: with_worker(children(proc.pid)), 60, "the worker process")
        assert len(started) == 2 and any("cache_svc" in v for v in started.values()), started
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # as a terminal's Ctrl-C: the launcher's process group
        else:
            proc.send_signal(sig)
        sent = time.monotonic()
        code = proc.wait(timeout=10)
        took = time.monotonic() - sent
        text = out.read_text()
        assert code == 0, text
        assert "interrupted while worker was starting; stopping what was started" in text, text
        assert "codeserve is serving" not in text, text
        assert re.search(r"stopped: \{'worker': -?\d+, 'cache': 0\}", text), text
        assert not (log_dir / "scheduler.log").exists() and not (log_dir / "gateway.log").exists()
        assert [pid for pid in started if alive(pid)] == [], f"left running after {took:.1f} s: {started}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in started:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
