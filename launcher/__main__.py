"""One command for a local deployment: ``python -m launcher [flags]`` (``./serve.sh`` wraps it).

Starts cache, worker, scheduler and gateway as separate processes on loopback (with ``--replicas N``: one cache
holding every replica's pool, N workers each with its scheduler, one gateway routing over them), waits until each is
ready, prints the URL, restarts a service that dies (as ``restart: unless-stopped`` does in compose; a new
worker epoch makes the cache flush its pool and the scheduler recompute), and stops everything on Ctrl-C
or SIGTERM.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import signal
import sys
import threading
import time

import yaml

from launcher.config import HELP, StackConfig, not_exposed_help, value_type
from launcher.replicas import cuda_device_count, devices, missing_cuda
from launcher.stack import ROOT, Stack, StartupError, StartupInterrupted, main_pid_banner
from launcher.supervisor import Supervisor
from launcher.validate import check


def parse(argv: list[str] | None = None) -> StackConfig:
    """Flags override the YAML file given with --config, which overrides the defaults. A bad value or file, or a
    value out of range (``launcher.validate.check``: every service's own parser reads what it would be given)
    exits with a usage error (code 2) naming it, before anything starts."""
    parser = argparse.ArgumentParser(prog="python -m launcher", description=__doc__, epilog=not_exposed_help(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=pathlib.Path, help="YAML file with any of the settings below")
    for f in dataclasses.fields(StackConfig):
        kind = value_type(f)
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=str if kind is bool else kind,
                            default=None,
                            help=HELP[f.name] + ("" if f.default is None else f" (default: {f.default})"))
    args = vars(parser.parse_args(argv))
    config = args.pop("config")
    overrides = {k: v for k, v in args.items() if v is not None}
    try:
        cfg = StackConfig.from_yaml(config, **overrides) if config else StackConfig(**overrides)
        check(cfg)
        return cfg
    except (ValueError, TypeError, OSError, yaml.YAMLError) as exc:
        parser.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    """Runs the stack until Ctrl-C / SIGTERM. Exit codes: 0 after a requested stop (also one during start-up:
    what was started is stopped, each service SIGTERM then SIGKILL after its grace), 1 when start-up or a restart
    fails, 2 for a usage error (nothing started)."""
    cfg = parse(argv)
    devs = devices(cfg)
    missing = missing_cuda(devs, cuda_device_count()) if any(d.startswith("cuda") for d in devs) else None
    if missing is not None:
        print(f"python -m launcher: error: {missing}", file=sys.stderr, flush=True)
        return 2
    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    log_dir = ROOT / ".cache" / "logs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    stack = Stack(cfg, log_dir=log_dir, interrupt=stopping)
    try:
        print(f"starting {', '.join(stack.services)} ...", flush=True)
        stack.start()
    except StartupInterrupted as exc:
        print(f"{exc}; stopping what was started", file=sys.stderr, flush=True)
        print(f"stopped: {stack.stop()}", flush=True)
        return 0
    except (StartupError, RuntimeError) as exc:
        print(f"start-up failed: {exc}", file=sys.stderr, flush=True)
        stack.stop()
        return 1
    print(main_pid_banner(stack), flush=True)
    supervisor = Supervisor(stack)
    while not stopping.wait(1.0):
        try:
            supervisor.check(stopping)
        except StartupInterrupted:
            break  # stopped while restarting a service: the stop below ends it with the others
        except (StartupError, RuntimeError) as exc:
            print(f"giving up: {exc}; stopping everything", file=sys.stderr, flush=True)
            stack.stop()
            return 1
    codes = stack.stop()
    print(f"stopped: {codes}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
