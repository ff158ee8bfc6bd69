"""docker-compose.yml must start what the local launcher starts: same services, same flags, same values
(except addresses and the model path), only the gateway's port published, health checks on all; and
docker-compose.replicas.yml what ``--replicas 2 --devices cuda:0,cuda:1`` starts, one GPU per worker."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest
import yaml

from launcher.config import SERVICES, StackConfig, commands

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLACE_DEPENDENT = {"--listen", "--cache", "--worker", "--scheduler", "--host", "--port", "--model-path"}
GPU_ONLY = {"--device", "--dtype", "--attention", "--kv-tokens", "--kv-fraction"}


def flags(argv: list[str]) -> dict[str, str]:
    """{"--flag": "value"} of an argv after ``python -m module``."""
    rest = argv[3:]
    assert len(rest) % 2 == 0, f"flags must come in pairs: {rest}"
    return dict(zip(rest[::2], rest[1::2]))


def load(*files: str) -> dict:
    merged: dict = {}
    for name in files:
        doc = yaml.safe_load((ROOT / name).read_text())
        for svc, spec in doc.get("services", {}).items():
            merged.setdefault(svc, {}).update(spec)
    return merged


def test_services_and_commands_agree_with_launcher() -> None:
    compose = load("docker-compose.yml")
    assert set(compose) == set(SERVICES)
    local = commands(StackConfig(), "/models/default-model", python="python")
    for name in SERVICES:
        argv = compose[name]["command"]
        assert argv[:3] == local[name][:3], f"{name}: runs {argv[:3]}, launcher runs {local[name][:3]}"
        got, want = flags(argv), flags(local[name])
        assert set(got) - GPU_ONLY == set(want) - GPU_ONLY, f"{name}: flags differ: {sorted(set(got) ^ set(want))}"
        for flag, value in want.items():
            if flag not in PLACE_DEPENDENT | GPU_ONLY:
                assert got[flag] == value, f"{name} {flag}: compose {got[flag]!r}, launcher {value!r}"
        assert got.get("--model-path", "/models/default-model") == "/models/default-model"


def test_addresses_point_at_services_and_ports_agree() -> None:
    compose = load("docker-compose.yml")
    cfg = StackConfig()
    assert flags(compose["cache"]["command"])["--listen"] == f"0.0.0.0:{cfg.cache_port}"
    assert flags(compose["worker"]["command"])["--listen"] == f"0.0.0.0:{cfg.worker_port}"
    sched = flags(compose["scheduler"]["command"])
    assert sched["--listen"] == f"0.0.0.0:{cfg.scheduler_port}"
    assert sched["--cache"] == f"cache:{cfg.cache_port}" and sched["--worker"] == f"worker:{cfg.worker_port}"
    gw = flags(compose["gateway"]["command"])
    assert gw["--scheduler"] == f"scheduler:{cfg.scheduler_port}" and gw["--port"] == str(cfg.http_port)


def test_only_gateway_published_and_all_have_healthchecks() -> None:
    compose = load("docker-compose.yml")
    published = {name for name, spec in compose.items() if spec.get("ports")}
    assert published == {"gateway"}
    assert compose["gateway"]["ports"] == [f"{StackConfig().http_port}:{StackConfig().http_port}"]
    for name, spec in compose.items():
        test = spec["healthcheck"]["test"]
        assert test[:4] == ["CMD", "python", "-m", "common.healthcheck"], name
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert doc["networks"]["internal"]["internal"] is True


def test_served_model_name_is_the_one_the_readme_uses() -> None:
    # The gateway serves the checkpoint directory's name; the README's examples say "default-model".
    compose = load("docker-compose.yml")
    path = flags(compose["gateway"]["command"])["--model-path"]
    assert pathlib.PurePosixPath(path).name == "default-model"
    assert '"model": "default-model"' in (ROOT / "README.md").read_text()


def test_gpu_override_reserves_an_nvidia_gpu_for_the_worker() -> None:
    compose = load("docker-compose.yml", "docker-compose.gpu.yml")
    devices = compose["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    got = flags(compose["worker"]["command"])
    assert got["--device"] == "cuda" and got["--attention"] == "flashinfer"


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="needs Debian's docker-compose (apt-get install docker-compose) to validate offline")
def test_compose_files_validate() -> None:
    for files in (["docker-compose.yml"], ["docker-compose.replicas.yml"], ["docker-compose.yml", "docker-compose.gpu.yml"],
                  ["docker-compose.yml", "docker-compose.gpu.yml", "docker-compose.model.yml"]):
        args = ["docker-compose"] + [a for f in files for a in ("-f", f)] + ["config", "-q"]
        env = {**os.environ, "MODEL_DIR": "/data/starcoderbase-7b"}  # docker-compose.model.yml requires it
        done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr


def test_every_launcher_setting_has_help() -> None:
    import dataclasses

    from launcher.config import HELP

    assert set(HELP) == {f.name for f in dataclasses.fields(StackConfig)}


def test_gpu_image_can_compile_flashinfer_kernels_and_keeps_them_on_a_volume() -> None:
    """flashinfer 0.6.4 compiles with nvcc at the first attention kernel: the image needs the CUDA compiler
    (a -devel base; the -runtime one has none), and the JIT cache must be on a volume (issue 14)."""
    docker = (ROOT / "Dockerfile.gpu").read_text()
    base = next(line.split()[1] for line in docker.splitlines() if line.startswith("FROM "))
    assert base.startswith("pytorch/pytorch:") and base.endswith("-devel"), base
    assert "RUN nvcc --version && g++ --version" in docker
    env = docker[docker.index("ENV "):docker.index("RUN nvcc")]
    jit_base = env.split("FLASHINFER_WORKSPACE_BASE=")[1].split()[0]
    assert env.split("TRITON_CACHE_DIR=")[1].split()[0].startswith(jit_base + "/")
    gpu = yaml.safe_load((ROOT / "docker-compose.gpu.yml").read_text())
    mounts = dict(v.split(":", 1) for v in gpu["services"]["worker"]["volumes"])
    assert mounts.get("flashinfer-jit") == jit_base
    assert "flashinfer-jit" in gpu["volumes"]
    # the scheduler waits for a healthy worker: a first GPU start (JIT compile, a large checkpoint) may take
    # minutes, which start_period leaves out of the retries
    period = gpu["services"]["worker"]["healthcheck"]["start_period"]
    assert period.endswith("s") and int(period[:-1]) >= 600


def test_own_checkpoint_is_mounted_read_only_where_each_service_reads_the_model() -> None:
    model = yaml.safe_load((ROOT / "docker-compose.model.yml").read_text())["services"]
    for files in (("docker-compose.yml",), ("docker-compose.yml", "docker-compose.gpu.yml")):
        merged = load(*files)
        for svc in ("worker", "scheduler", "gateway"):
            path = flags(merged[svc]["command"])["--model-path"]
            (vol,) = model[svc]["volumes"]
            assert vol.endswith(f":{path}:ro") and vol.startswith("${MODEL_DIR:?"), (files, vol)


REPLICAS = StackConfig(replicas=2, devices="cuda:0,cuda:1")


def compose_address(address: str, ports: dict[str, int]) -> str:
    """A launcher address (127.0.0.1:PORT) as the compose network names it: the service that listens on PORT."""
    port = int(address.rsplit(":", 1)[1])
    (name,) = [n for n, p in ports.items() if p == port]
    return f"{name}:{port}"


def test_replicas_compose_starts_what_the_launcher_starts_for_two_gpus() -> None:
    """Same processes (names), same flags and values; listen ports and the addresses between services the
    launcher's (launcher/ports.py), pools and owners the launcher's (launcher/replicas.py)."""
    from launcher.ports import service_ports

    compose = load("docker-compose.replicas.yml")
    local = commands(REPLICAS, "/models/default-model", python="python")
    ports = service_ports(REPLICAS)
    assert list(local) == ["cache", "worker-0", "scheduler-0", "worker-1", "scheduler-1", "gateway"]
    assert set(compose) == set(local)
    for name, want_argv in local.items():
        argv = compose[name]["command"]
        assert argv[:3] == want_argv[:3], name
        replicas = [v for f, v in zip(argv[3::2], argv[4::2]) if f == "--replica"]
        want_replicas = [v for f, v in zip(want_argv[3::2], want_argv[4::2]) if f == "--replica"]
        got, want = flags(argv), flags(want_argv)
        assert set(got) - GPU_ONLY == set(want) - GPU_ONLY, f"{name}: flags differ: {sorted(set(got) ^ set(want))}"
        for flag, value in want.items():
            if flag not in PLACE_DEPENDENT | GPU_ONLY | {"--replica"}:
                assert got[flag] == value, f"{name} {flag}: compose {got[flag]!r}, launcher {value!r}"
        if "--listen" in want:
            assert got["--listen"] == f"0.0.0.0:{ports[name]}", name
        for flag in ("--cache", "--worker", "--scheduler"):
            if flag in want:
                assert got[flag] == compose_address(want[flag], ports), (name, flag)
        assert [dict(kv.split("=", 1) for kv in r.split(",")) for r in replicas] == [
            {k: (compose_address(v, ports) if k != "pool" else v) for k, v in (kv.split("=", 1) for kv in r.split(","))}
            for r in want_replicas], name
    assert compose["gateway"]["ports"] == [f"{REPLICAS.http_port}:{REPLICAS.http_port}"]
    assert {n for n, spec in compose.items() if spec.get("ports")} == {"gateway"}


def test_replicas_compose_gives_each_worker_its_own_gpu_as_the_gpu_override_runs_it() -> None:
    compose = load("docker-compose.replicas.yml")
    gpu = flags(load("docker-compose.yml", "docker-compose.gpu.yml")["worker"]["command"])
    local = commands(REPLICAS, "/models/default-model", python="python")
    for i in range(REPLICAS.replicas):
        spec = compose[f"worker-{i}"]
        (device,) = spec["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
        # the container sees its one GPU as cuda:0 (the launcher's cuda:i on the host)
        assert device["device_ids"] == [flags(local[f"worker-{i}"])["--device"].split(":")[1]]
        got = flags(spec["command"])
        assert {f: got[f] for f in GPU_ONLY if f in got} == {f: gpu[f] for f in GPU_ONLY if f in gpu}
        assert spec["image"] == "codeserve:gpu" and spec["volumes"] == ["flashinfer-jit:/var/cache/codeserve"]
        assert int(spec["healthcheck"]["start_period"][:-1]) >= 600
    for name, spec in compose.items():
        assert spec["healthcheck"]["test"][:4] == ["CMD", "python", "-m", "common.healthcheck"], name
