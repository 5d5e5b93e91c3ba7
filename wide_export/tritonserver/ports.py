"""Who listens on a TCP port: checked before `serve` starts, and after, that the server that
answers the readiness probe is the one we started.

Linux's /proc is read directly (`/proc/net/tcp{,6}` for the listening socket's inode, then
`/proc/PID/fd` for the process holding it), as `ss -ltnp` does: psutil would do the same but is
not a dependency, and the lookup is a few lines. Elsewhere (no /proc) the holder is "unknown"
and ownership cannot be told, so it is trusted.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path
from typing import Iterable, Mapping, Optional

from wide_export.base.errors import WideError

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


def listening_inodes(port: int, proc: Path = Path("/proc")) -> Optional[set[str]]:
    """Inodes of the sockets listening on `port` (any address); None when /proc/net cannot be read."""
    found: set[str] = set()
    readable = False
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == _LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                found.add(cols[9])
    return found if readable else None


def _socket_inodes(pid: int, proc: Path) -> set[str]:
    inodes = set()
    try:
        for fd in os.scandir(proc / str(pid) / "fd"):
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def holders(port: int, proc: Path = Path("/proc")) -> list[str]:
    """'PID (name)' of each process we may inspect that listens on `port`."""
    inodes = listening_inodes(port, proc)
    if not inodes:
        return []
    out = []
    for entry in os.scandir(proc):
        if entry.name.isdigit() and _socket_inodes(int(entry.name), proc) & inodes:
            try:
                name = (proc / entry.name / "comm").read_text().strip()
            except OSError:
                name = "?"
            out.append(f"{entry.name} ({name})")
    return out


def owns_port(pids: Iterable[int], port: int, proc: Path = Path("/proc")) -> bool:
    """True when one of `pids` holds the socket listening on `port`; True as well when that cannot be
    told (no /proc), False when someone else listens there (or nobody does)."""
    inodes = listening_inodes(port, proc)
    if inodes is None:
        return True
    return any(_socket_inodes(pid, proc) & inodes for pid in pids)


def _bindable(address: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is no owner
        try:
            sock.bind((address, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return False
            raise WideError(f"cannot listen on {address}:{port}: {err.strerror or err}",
                            hint="check --address") from None
    return True


def check_ports_free(address: str, ports: Mapping[str, Optional[int]]) -> None:
    """WideError naming the flag, the port and who holds it, for the first asked-for port already taken."""
    seen: dict[int, str] = {}
    for flag, port in ports.items():
        if port is None:
            continue
        if port in seen:
            raise WideError(f"{flag} {port} is the same port as {seen[port]}", hint="give each endpoint its own port")
        seen[port] = flag
        if not _bindable(address, port):
            who = holders(port)
            by = f" by {', '.join(who)}" if who else " (by a process this user cannot inspect)"
            raise WideError(f"{flag} {port} on {address} is already in use{by}",
                            hint=f"stop that process, choose another {flag}, or omit {flag} for a free port")
