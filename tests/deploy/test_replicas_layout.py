"""``--replicas N``: each process's name, port, pool, owner and device (launcher/replicas.py, launcher/ports.py),
one replica exactly as a stack without replicas, and the usage errors of a layout that cannot run."""

from __future__ import annotations

import subprocess
import sys

import pytest

import launcher.replicas
from launcher.__main__ import parse
from launcher.config import StackConfig, commands
from launcher.ports import service_ports
from launcher.replicas import devices
from launcher.validate import check
from tests.deploy.launched import ROOT


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_one_replica_keeps_the_names_and_ports_of_a_stack_without_replicas() -> None:
    argv = commands(StackConfig(), "/m", python="python")
    assert list(argv) == ["cache", "worker", "scheduler", "gateway"]
    assert service_ports(StackConfig()) == {"cache": 50051, "worker": 50052, "scheduler": 50053, "gateway": 8000}
    assert (flag(argv["worker"], "--worker-id"), flag(argv["worker"], "--device")) == ("worker-0", "auto")
    assert (flag(argv["scheduler"], "--pool-id"), flag(argv["scheduler"], "--owner")) == ("default", "scheduler-0")
    assert flag(argv["gateway"], "--scheduler") == "127.0.0.1:50053" and "--replica" not in argv["gateway"]


def test_three_replicas_share_one_cache_with_their_own_worker_scheduler_pool_and_owner() -> None:
    cfg = StackConfig(replicas=3, device="cpu")
    argv = commands(cfg, "/m", python="python")
    assert list(argv) == ["cache", "worker-0", "scheduler-0", "worker-1", "scheduler-1", "worker-2", "scheduler-2",
                          "gateway"]
    assert service_ports(cfg) == {"cache": 50051, "worker-0": 50052, "scheduler-0": 50053, "worker-1": 50054,
                                  "scheduler-1": 50055, "worker-2": 50056, "scheduler-2": 50057, "gateway": 8000}
    for i in range(3):
        worker, scheduler = argv[f"worker-{i}"], argv[f"scheduler-{i}"]
        assert flag(worker, "--listen") == f"127.0.0.1:{50052 + 2 * i}" and flag(worker, "--worker-id") == f"worker-{i}"
        assert flag(worker, "--device") == "cpu"
        assert flag(scheduler, "--worker") == flag(worker, "--listen")
        assert flag(scheduler, "--cache") == "127.0.0.1:50051"
        assert (flag(scheduler, "--pool-id"), flag(scheduler, "--owner")) == (f"pool-{i}", f"scheduler-{i}")
    replicas = [v for f, v in zip(argv["gateway"], argv["gateway"][1:]) if f == "--replica"]
    assert replicas == [f"scheduler=127.0.0.1:{50053 + 2 * i},cache=127.0.0.1:50051,pool=pool-{i}" for i in range(3)]
    assert "--scheduler" not in argv["gateway"]


@pytest.mark.parametrize("device, cuda, want", [
    ("cpu", 4, ["cpu", "cpu"]),
    ("cuda", 0, ["cuda:0", "cuda:1"]),
    ("cuda:1", 2, ["cuda:1", "cuda:1"]),  # both replicas share one GPU
    ("auto", 2, ["cuda:0", "cuda:1"]),
    ("auto", 8, ["cuda:0", "cuda:1"]),
    ("auto", 0, ["cpu", "cpu"]),
])
def test_devices_are_picked_per_replica(device: str, cuda: int, want: list[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher.replicas, "cuda_device_count", lambda: cuda)
    assert devices(StackConfig(replicas=2, device=device)) == want


def test_given_devices_are_taken_as_given_and_one_replica_keeps_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher.replicas, "cuda_device_count", lambda: pytest.fail("no CUDA probe needed"))
    assert devices(StackConfig(replicas=2, devices="cuda:0, cuda:0")) == ["cuda:0", "cuda:0"]
    assert devices(StackConfig(replicas=1, device="auto")) == ["auto"]


def test_auto_with_fewer_gpus_than_replicas_is_refused_naming_the_way_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher.replicas, "cuda_device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"only 1 CUDA device\(s\); give --devices .*cuda:0,cuda:0,cuda:0"):
        devices(StackConfig(replicas=3))


@pytest.mark.parametrize("argv, message", [
    (["--replicas", "0"], "--replicas must be >= 1 (got 0)"),
    (["--replicas", "2", "--devices", "cpu"], "--devices names 1 device(s) ('cpu') for --replicas 2"),
    (["--replicas", "2", "--devices", "cpu,gpu1"], "--devices: 'gpu1' is not cpu, cuda or cuda:N"),
    (["--replicas", "2", "--device", "cpu", "--worker-port", "60052", "--scheduler-port", "60054"],
     "worker-1 60054 is also scheduler-0"),
    (["--replicas", "3", "--device", "cpu", "--worker-port", "65533", "--scheduler-port", "65534"],
     "scheduler-1's port 65536 (--scheduler-port + 2 x its replica index) is outside 0..65535"),
])
def test_a_layout_that_cannot_run_is_a_usage_error_before_anything_starts(argv: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "launcher", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_replicas_from_flags_and_every_replica_command_passes_its_services_parser() -> None:
    cfg = parse(["--replicas", "2", "--devices", "cpu,cpu", "--chunk-size", "64"])
    assert (cfg.replicas, cfg.devices, cfg.chunk_size) == (2, "cpu,cpu", 64)
    check(cfg)
    assert all(flag(commands(cfg, "/m")[f"scheduler-{i}"], "--chunk-size") == "64" for i in range(2))


def test_cuda_devices_the_machine_lacks_are_named_before_anything_starts() -> None:
    from launcher.replicas import missing_cuda

    assert missing_cuda(["cpu", "cpu"], 0) is None and missing_cuda(["cuda:0", "cuda:1"], 2) is None
    assert missing_cuda(["cuda:0", "cuda:0"], 1) is None
    assert missing_cuda(["cuda:0", "cuda:1"], 0) == (
        "the workers' devices (cuda:0, cuda:1) need 2 CUDA device(s), but this machine has 0: give --device cpu (or "
        "--devices cpu,...) to run on the CPU")
    assert "need 4 CUDA device(s), but this machine has 2" in missing_cuda(["cuda:3"], 2)
    assert "(cuda) need 1" in missing_cuda(["cuda"], 0)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA (the CI machine)")
def test_cuda_devices_on_a_machine_without_cuda_are_a_usage_error() -> None:
    """It started the cache, then each worker failed with a traceback saying --device cuda (found by the reviewer)."""
    done = subprocess.run([sys.executable, "-m", "launcher", "--replicas", "2", "--devices", "cuda:0,cuda:1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "the workers' devices (cuda:0, cuda:1) need 2 CUDA device(s), but this machine has 0" in done.stderr
    assert "starting" not in done.stdout
