"""Hostfiles in the MPI/DeepSpeed style (`node-1 slots=8`, `#` comments): parsed strictly, errors name file and line."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import UserError

_LINE = re.compile(r"^(?P<host>\S+)(?:\s+slots\s*=\s*(?P<slots>\S+))?\s*$")


def read_hostfile(path: str | Path) -> dict[str, int]:
    """host -> slots, in file order."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"hostfile {path}: no such file")
    hosts: dict[str, int] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        if not m or m["slots"] is None:
            raise UserError(f"hostfile {path}:{number}: {line!r} has no slots=N")
        if not m["slots"].isdigit() or int(m["slots"]) < 1:
            raise UserError(f"hostfile {path}:{number}: {line!r}: slots must be a positive integer")
        if m["host"] in hosts:
            raise UserError(f"hostfile {path}:{number}: host {m['host']!r} is listed twice")
        hosts[m["host"]] = int(m["slots"])
    if not hosts:
        raise UserError(f"hostfile {path}: lists no hosts with slots")
    return hosts


def check_fits(hosts: dict[str, int], nodes: int, procs: int, path: str | Path) -> None:
    """The first `nodes` hosts must each offer `procs` slots."""
    if nodes > len(hosts):
        raise UserError(f"hostfile {path}: lists {len(hosts)} host(s), but nodes={nodes}")
    for host in list(hosts)[:nodes]:
        if hosts[host] < procs:
            raise UserError(f"hostfile {path}: host {host!r} has slots={hosts[host]}, but procs={procs} per node")
