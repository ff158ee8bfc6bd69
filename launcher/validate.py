"""The launcher's check of a whole configuration before it starts anything: every service's own argument parser
reads the command line the launcher would give it, so a value a service refuses is refused here, at once, with
the launcher's usage error (exit 2) naming the setting (the launcher's flags have the services' names)."""

from __future__ import annotations

import contextlib
import importlib
import io
import math
import pathlib

from launcher.config import StackConfig, commands
from launcher.ports import service_ports

# The module ``python -m`` runs for each service; its ``__main__.parse_args(argv)`` is the service's parser.
MODULES = {"cache": "cache_svc", "worker": "worker_svc", "scheduler": "scheduler_svc", "gateway": "gateway"}
PORTS = ("http_port", "cache_port", "worker_port", "scheduler_port")
# The flag whose port each process listens on (its port derived from that flag's: launcher.ports.service_ports).
PORT_FLAG = {"cache": "--cache-port", "worker": "--worker-port", "scheduler": "--scheduler-port", "gateway": "--http-port"}
# Stands in for the model directory, which the parsers take as text (the launcher may write the default model
# later, at start; checking settings must not).
MODEL_PLACEHOLDER = "MODEL_DIR"


def service_parse_error(service: str, argv: list[str]) -> str | None:
    """The message of ``service``'s parser for ``argv`` (the arguments after ``python -m MODULE``), without its
    usage lines; None when the parser accepts it. Nothing is started: the parser runs in this process."""
    module = importlib.import_module(MODULES[service] + ".__main__")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            module.parse_args(argv)
    except SystemExit as exc:
        if exc.code == 0:
            raise RuntimeError(f"{service}'s parser exited 0 on {argv} (help?)") from exc
        last = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
        return last.split(": error: ", 1)[-1]
    return None


def check(cfg: StackConfig) -> None:
    """Raises ValueError naming the first setting out of range: a port outside 0..65535 (0 = a free port) or
    the same port for two services (replica i's derived ones included), --replicas < 1, --devices not naming one
    device per replica, a --model-path without config.json,
    kv_fraction outside (0, 1], or any value a service's own parser refuses (its message, e.g.
    ``--max-body-bytes must be >= 1 (got -1)``, with the service named)."""
    for name in PORTS:
        port = getattr(cfg, name)
        if not 0 <= port <= 65535:
            raise ValueError(f"--{name.replace('_', '-')} must be in 0..65535 (got {port})")
    if cfg.model_path and not (pathlib.Path(cfg.model_path) / "config.json").is_file():
        raise ValueError(f"--model-path {cfg.model_path}: no config.json there (an HF GPTBigCode checkpoint "
                         f"directory; leave it out for the embedded default model)")
    taken: dict[int, str] = {}
    for process, port in service_ports(cfg).items():  # 0 = a free port, chosen at start
        what = process if cfg.replicas > 1 else PORT_FLAG[process]
        if port > 65535:
            raise ValueError(f"{what}'s port {port} (--{process.split('-')[0]}-port + 2 x its replica index) is "
                             f"outside 0..65535")
        if port and port in taken:
            raise ValueError(f"{what} {port} is also {taken[port]}: each service needs its own port"
                             + (" (replica i's worker and scheduler listen on --worker-port / --scheduler-port "
                                "+ 2 i)" if cfg.replicas > 1 else ""))
        taken[port] = what
    if cfg.kv_fraction is not None and not (math.isfinite(cfg.kv_fraction) and 0 < cfg.kv_fraction <= 1):
        raise ValueError(f"--kv-fraction must be in (0, 1] (got {cfg.kv_fraction})")
    argv = commands(cfg, cfg.model_path or MODEL_PLACEHOLDER, python="python")
    for process, line in argv.items():
        message = service_parse_error(process.split("-")[0], line[3:])
        if message is not None:
            raise ValueError(f"{message} (refused by the {process}'s own parser)")
