"""The launcher's settings reach the services: every service flag is passed by the launcher (same name, same
default) or listed as deliberately not, each passed value is what the service's own parser reads, and a real
``python -m launcher`` run with changed values serves with them (visible over HTTP, in the services' command
lines and logs)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import subprocess
import sys

import httpx
import pytest

from launcher.__main__ import parse
from launcher.config import NOT_EXPOSED, PASSED, PLACED, SERVICES, StackConfig, commands, not_exposed_help
from launcher.validate import MODULES
from tests.deploy.launched import launched

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Launcher defaults that differ from the service's on purpose (said in the launcher's --help).
OWN_DEFAULTS = {"max_queued_tokens"}

# A value other than the default for every setting the launcher passes (kv_fraction: see KV_FRACTION).
CHANGED = StackConfig(
    model_name="served-name", device="cpu", dtype="float32", attention="torch", kv_tokens=3000, page_size=2,
    seed=7, cuda_graph_max_batch=16, extend_whole_graph=False,
    chunk_size=128, max_running_requests=9, max_queued_requests=33,
    max_queued_tokens=5000, policy="lpm", progress_timeout=12.5, outage_timeout=7.0, worker_stall_timeout=4.0, decode_steps=3,
    overlap=False, lease_seconds=11.0, drain_seconds=3.5, api_key="k-123", max_body_bytes=1000, max_n=2,
    request_timeout=45.0, health_timeout=4.0, probe_interval=0.25, probe_timeout=1.5,
)
KV_FRACTION = dataclasses.replace(CHANGED, kv_tokens=None, kv_fraction=0.3)


def parse_service(service: str, argv: list[str]):
    """The Namespace the service's own argument parser makes of ``argv`` (a full command line)."""
    module = __import__(MODULES[service] + ".__main__", fromlist=["parse_args"])
    return module.parse_args(argv[3:])


def help_flags(service: str) -> set[str]:
    """Every option string in ``python -m <service> --help``."""
    text = subprocess.run([sys.executable, "-m", MODULES[service], "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True).stdout
    found: set[str] = set()
    for line in text.splitlines():
        if re.match(r"^  -", line):
            found |= set(re.findall(r"--[a-z][a-z0-9-]*", re.split(r"\s{2,}", line.strip())[0]))
    return found


def test_every_service_flag_is_passed_or_listed_as_not_exposed() -> None:
    for service in SERVICES:
        passed = {"--" + n.replace("_", "-") for n in PASSED[service]}
        passed |= {"--no-" + n.replace("_", "-") for n in PASSED[service] if isinstance(getattr(CHANGED, n), bool)}
        accounted = passed | set(PLACED[service]) | set(NOT_EXPOSED[service]) | {"--help"}
        found = help_flags(service)
        assert found == accounted, (
            f"{service}: decide on {sorted(found ^ accounted)}: pass it (a StackConfig field with HELP, in PASSED, "
            "and in docker-compose.yml) or list it in NOT_EXPOSED with the reason (launcher/config.py)")
    epilog = not_exposed_help()
    for service, flags in NOT_EXPOSED.items():
        for flag, why in flags.items():
            assert f"{service} {flag}: {why}" in epilog


def test_each_passed_value_is_what_the_service_reads() -> None:
    for cfg in (CHANGED, KV_FRACTION):
        argv = commands(cfg, "/models/m", python="python")
        for service in SERVICES:
            args = parse_service(service, argv[service])
            for name in PASSED[service]:
                assert getattr(args, name) == getattr(cfg, name), f"{service} --{name}"
    assert parse_service("gateway", commands(CHANGED, "/m")["gateway"]).max_body_bytes == 1000
    assert parse_service("scheduler", commands(CHANGED, "/m")["scheduler"]).overlap is False
    assert "--no-extend-whole-graph" in commands(CHANGED, "/m")["worker"]
    default_worker = set(commands(StackConfig(), "/m")["worker"])
    assert not {"--extend-whole-graph", "--no-extend-whole-graph", "--pdl"} & default_worker


def test_launcher_defaults_are_the_services_defaults() -> None:
    argv = commands(StackConfig(), "/models/m", python="python")
    for service in SERVICES:
        placed_only = list(argv[service][:3])
        rest = argv[service][3:]
        for i in range(0, len(rest), 2):  # the addresses and the model path, none of the passed settings
            if rest[i] in PLACED[service]:
                placed_only += rest[i:i + 2]
        defaults = parse_service(service, placed_only)
        for name in set(PASSED[service]) - OWN_DEFAULTS:
            assert getattr(defaults, name) == getattr(StackConfig(), name), f"{service} --{name}"
    assert parse_service("scheduler", argv["scheduler"]).max_queued_tokens == 524288


def test_launcher_flags_and_yaml_make_the_config(tmp_path: pathlib.Path) -> None:
    cfg = parse(["--max-body-bytes", "1000", "--request-timeout", "45", "--drain-seconds", "3.5",
                 "--overlap", "false", "--outage-timeout", "7"])
    assert (cfg.max_body_bytes, cfg.request_timeout, cfg.drain_seconds, cfg.overlap, cfg.outage_timeout) == \
           (1000, 45.0, 3.5, False, 7.0)
    yml = tmp_path / "deploy.yaml"
    yml.write_text("max-n: 2\nprobe_timeout: 1\nrequest-timeout: 30\n")
    cfg = parse(["--config", str(yml), "--max-n", "3"])
    assert (cfg.max_n, cfg.probe_timeout, cfg.request_timeout) == (3, 1.0, 30.0)
    assert isinstance(cfg.probe_timeout, float)


@pytest.mark.parametrize("argv, message", [
    (["--max-n", "two"], "invalid int value: 'two'"),
    (["--kv-tokens", "100", "--kv-fraction", "0.5"], "give kv_tokens or kv_fraction, not both"),
    (["--overlap", "maybe"], "overlap must be true or false"),
    (["--overlap-mode", "later"], "--overlap-mode: invalid choice: 'later'"),
])
def test_bad_launcher_values_are_usage_errors(argv: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "launcher", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_yaml_value_of_the_wrong_type_names_the_setting(tmp_path: pathlib.Path) -> None:
    yml = tmp_path / "deploy.yaml"
    yml.write_text("max_body_bytes: lots\n")
    with pytest.raises(ValueError, match="max_body_bytes must be int, got 'lots'"):
        StackConfig.from_yaml(yml)


def cmdline(pid: int) -> list[str]:
    return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def test_a_real_launcher_run_serves_with_the_changed_settings(tmp_path: pathlib.Path) -> None:
    """--max-body-bytes 1000 makes a 2,000-byte body a 413 over HTTP; --max-n 2 makes n=3 a 400; every service
    runs with exactly the command line the launcher's settings make; the scheduler logs its decode steps and overlap mode."""
    changed = ["--max-body-bytes", "1000", "--max-n", "2", "--request-timeout", "60", "--outage-timeout", "7",
               "--lease-seconds", "12", "--drain-seconds", "3", "--decode-steps", "2", "--seed", "5",
               "--probe-timeout", "1.5", "--health-timeout", "20", "--overlap-mode", "just-in-time"]
    with launched(tmp_path, *changed) as run:
        big = {"prompt": "x" * 2000, "max_tokens": 1}
        reply = httpx.post(f"{run.url}/v1/completions", json=big, timeout=60)
        assert reply.status_code == 413, reply.text
        assert "limit of 1000 bytes" in reply.json()["error"]["message"]
        small = httpx.post(f"{run.url}/v1/completions", json={"prompt": "def f():", "max_tokens": 3,
                                                               "temperature": 0}, timeout=60)
        assert small.status_code == 200 and small.json()["usage"]["completion_tokens"] == 3
        three = httpx.post(f"{run.url}/v1/completions", json={"prompt": "x", "max_tokens": 1, "n": 3}, timeout=60)
        assert three.status_code == 400 and "n is 3; the limit is 2" in three.json()["error"]["message"]
        assert httpx.get(f"{run.url}/server_info", timeout=60).json()["gateway_limits"]["max_n"] == 2

        worker = cmdline(run.pids["worker"])
        want = commands(parse(run.argv[3:]), worker[worker.index("--model-path") + 1], python=worker[0])
        for service, pid in run.pids.items():
            assert cmdline(pid) == want[service], service
        for service, flag, value in [("gateway", "--max-body-bytes", "1000"), ("gateway", "--drain-seconds", "3"),
                                     ("scheduler", "--lease-seconds", "12"), ("cache", "--lease-seconds", "12"),
                                     ("scheduler", "--outage-timeout", "7"), ("worker", "--seed", "5")]:
            argv = cmdline(run.pids[service])
            assert argv[argv.index(flag) + 1] == value, (service, flag)

        serving = [json.loads(line) for line in (run.log_dir / "scheduler.log").read_text().splitlines()
                   if line.startswith("{") and '"serving"' in line]
        assert serving and (serving[-1]["decode_steps"], serving[-1]["overlap_mode"]) == (2, "just-in-time")
        run.interrupt()
