"""Where one replica lives (``--replica scheduler=HOST:PORT,cache=HOST:PORT,pool=ID``); no gRPC import, so that
parsing the gateway's flags stays light for the launcher."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaSpec:
    """Where one replica lives: its scheduler's and its cache service's gRPC addresses (host:port; cache None for
    the single ``--scheduler`` replica) and the id of its pool in that cache service."""

    scheduler: str
    cache: str | None = None
    pool: str = "default"

    @staticmethod
    def parse(text: str) -> "ReplicaSpec":
        """Parses ``scheduler=HOST:PORT,cache=HOST:PORT,pool=ID`` (pool defaults to "default"). Raises ValueError
        naming the fault (an unknown or missing key, an empty value, an address without a port or with
        one outside 1..65535)."""
        fields: dict[str, str] = {}
        for part in text.split(","):
            key, sep, value = part.strip().partition("=")
            if not sep or not value:
                raise ValueError(f"replica {text!r}: {part!r} is not key=value")
            if key not in ("scheduler", "cache", "pool"):
                raise ValueError(f"replica {text!r}: unknown key {key!r} (scheduler, cache, pool)")
            if key in fields:
                raise ValueError(f"replica {text!r}: {key} given twice")
            fields[key] = value
        for key in ("scheduler", "cache"):
            if key not in fields:
                raise ValueError(f"replica {text!r}: {key}=HOST:PORT is missing")
            port = fields[key].rpartition(":")[2]
            if not port.isdigit():
                raise ValueError(f"replica {text!r}: {key} address {fields[key]!r} has no port")
            if not 1 <= int(port) <= 65535:
                raise ValueError(f"replica {text!r}: {key} port {port} is outside 1..65535")
        return ReplicaSpec(fields["scheduler"], fields["cache"], fields.get("pool", "default"))
