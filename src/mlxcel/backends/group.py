"""One MLX model over several machines: the group's hostfile, its split, and its time bound.

The hostfile is mlx.launch's (`{"hosts": [{"ssh": ..., "ips": [...]}]}`, the ring's ports
counted from mlx.launch's starting port as it counts them) or the ring's own list of
`"ip:port"` lists, which is what mlx.launch hands each rank in `$MLX_HOSTFILE`. Rank 0 serves
HTTP; every rank's first address is where its ring listens, and the port `CONTROL_PORT_OFFSET`
above it is where a rank past 0 takes rank 0's commands.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

ParallelMode = Literal["auto", "tensor", "pipeline"]
PARALLEL_MODES: tuple[ParallelMode, ...] = ("auto", "tensor", "pipeline")

DEFAULT_RANK_TIMEOUT_S = 30.0
"""How long rank 0 waits on another rank (to join, to finish a step) before the model fails."""

MLX_LAUNCH_PORT = 32323
"""mlx.launch's --starting-port default: the first ring port of a hostfile without ports."""

CONTROL_PORT_OFFSET = 100
"""A rank's command link listens this far above its ring port."""


@dataclass(frozen=True)
class RankAddress:
    """Where one rank's ring listens."""

    host: str
    port: int

    @property
    def control_port(self) -> int:
        """Where the rank takes rank 0's commands (ranks past 0)."""
        return self.port + CONTROL_PORT_OFFSET

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class DistributedConfig:
    """How one model runs over a group of ranks."""

    hostfile: Path
    mode: ParallelMode = "auto"
    """tensor: every rank holds a slice of every layer; pipeline: each holds whole layers;
    auto: tensor where the model can shard, else pipeline."""
    rank_timeout: float = DEFAULT_RANK_TIMEOUT_S
    layers: int = 0
    """The model's layer count (what a pipeline divides), once its config has been read."""
    addresses: tuple[RankAddress, ...] = ()
    """The hostfile's ranks, once read (the server reads it at start)."""

    def ranks(self) -> tuple[RankAddress, ...]:
        """The ranks' addresses, rank 0 first."""
        return self.addresses or read_hostfile(self.hostfile)


def read_hostfile(path: Path) -> tuple[RankAddress, ...]:
    """The ranks of a hostfile in either format; ValueError says what is wrong with it."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"hostfile {path}: {exc}") from None
    try:
        ranks = _ranks(data)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ValueError(
            f"hostfile {path}: expected mlx.launch's {{'hosts': [{{'ips': [IP]}}, ...]}} or the "
            f'ring\'s [["IP:PORT"], ...] ({exc})'
        ) from None
    if len(ranks) < 2:
        raise ValueError(f"hostfile {path}: a group needs at least 2 ranks, it lists {len(ranks)}")
    return ranks


def _ranks(data: Any) -> tuple[RankAddress, ...]:
    hosts = data["hosts"] if isinstance(data, dict) else data
    if not isinstance(hosts, list):
        raise TypeError("no list of hosts")
    if all(isinstance(h, list) for h in hosts):
        return tuple(_address(h[0]) for h in hosts)
    # mlx.launch gives each IP of each host the next port, from its starting port.
    ranks, port = [], MLX_LAUNCH_PORT
    for host in hosts:
        ips = host["ips"]
        if not ips:
            raise ValueError(f"host {host.get('ssh')!r} lists no IP (the ring needs one)")
        ranks.append(RankAddress(str(ips[0]), port))
        port += len(ips)
    return tuple(ranks)


def _address(text: str) -> RankAddress:
    host, _, port = str(text).rpartition(":")
    if not host:
        raise ValueError(f"{text!r} is not IP:PORT")
    return RankAddress(host, int(port))


def ring_hostfile(ranks: tuple[RankAddress, ...]) -> str:
    """The ring backend's `$MLX_HOSTFILE` text for these ranks."""
    return json.dumps([[str(rank)] for rank in ranks])


def from_section(value: Any) -> DistributedConfig:
    """A config file's `distributed:` section of a model: `hostfile`, `mode`, `rank_timeout`."""
    if isinstance(value, str):
        value = {"hostfile": value}
    if not isinstance(value, dict) or "hostfile" not in value:
        raise ValueError("expected a hostfile path, or a mapping with hostfile, mode, rank_timeout")
    unknown = set(value) - {"hostfile", "mode", "rank_timeout"}
    if unknown:
        raise ValueError(f"unknown key '{sorted(unknown)[0]}' (hostfile, mode, rank_timeout)")
    mode = value.get("mode", "auto")
    if mode not in PARALLEL_MODES:
        raise ValueError(f"mode must be one of {', '.join(PARALLEL_MODES)}, not {mode!r}")
    timeout = value.get("rank_timeout", DEFAULT_RANK_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ValueError(f"rank_timeout must be a number of seconds above 0, not {timeout!r}")
    config = DistributedConfig(Path(str(value["hostfile"])), mode, float(timeout))
    config.ranks()
    return config


def pipeline_layers(layers: int, size: int) -> list[tuple[int, int]]:
    """Each rank's [start, end) layers as mlx-lm's PipelineMixin splits them (rank 0 the last)."""
    base, extra = divmod(layers, size)
    counts = [base + (1 if r < extra else 0) for r in range(size)]
    starts = [sum(counts[r + 1 :]) for r in range(size)]
    return [(start, start + count) for start, count in zip(starts, counts, strict=True)]


def describe(config: DistributedConfig) -> dict[str, Any]:
    """The group as /v1/models and /props show it: the split, and each rank's host and part."""
    ranks = config.ranks()
    if config.mode == "pipeline" and config.layers:
        parts = [f"layers {a}-{b - 1}" for a, b in pipeline_layers(config.layers, len(ranks))]
    else:
        parts = [f"1/{len(ranks)} of every layer"] * len(ranks)
    return {
        "mode": config.mode,
        "rank_timeout": config.rank_timeout,
        "ranks": [
            {"rank": i, "host": rank.host, "port": rank.port, "holds": part}
            for i, (rank, part) in enumerate(zip(ranks, parts, strict=True))
        ],
    }
