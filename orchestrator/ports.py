"""Facts about this host: free TCP ports (pick one, wait until one is free again) and its boot id.

Kept apart from :mod:`orchestrator.engine` because the Serve replica and the tests need the same
answers ("is this port usable by a server now?") without an engine.
"""
from __future__ import annotations

import random
import socket
import time

__all__ = ["find_free_port", "host_boot_id", "port_is_free", "wait_for_port_free"]


#: Ports handed out by :func:`find_free_port` start here: above Ray's default worker ports
#: (10002-19999) and below the kernel's ephemeral range, from which Ray draws its own random ports
#: (``random.randint(<an ephemeral port>, 65535)``) and every outgoing connection takes its local port.
PICK_FROM = 20000


def find_free_port(host: str = "127.0.0.1") -> int:
    """A port that is free on ``host`` now, drawn at random below the kernel's ephemeral range.

    Binding port 0 would hand out an ephemeral port, the range from which every outgoing connection
    and Ray's own components take theirs: between releasing such a port and a server binding it,
    another process on a busy host (parallel test workers, a Ray cluster starting) can take it. A port
    below that range is taken only by another explicit pick. If the range leaves no room below it the
    kernel's choice is used. The remaining race is covered where a server starts:
    :class:`orchestrator.engine.EngineProcess` restarts once on a new port when the engine's log says
    "Address already in use".
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low, high = PICK_FROM, _ephemeral_low() - 1
    rng = random.SystemRandom()
    for _ in range(100 if high - low >= 1000 else 0):
        port = rng.randint(low, high)
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (Linux default 32768)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now.

    Binds with ``SO_REUSEADDR`` like uvicorn and LMDeploy's api_server do, so sockets of a stopped
    server lingering in TIME_WAIT do not count as "in use" (they do not stop a new server either).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def wait_for_port_free(host: str, port: int, timeout_s: float = 10.0, poll_s: float = 0.1) -> bool:
    """Poll until ``host:port`` can be bound (see :func:`port_is_free`); ``False`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if port_is_free(host, port):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def host_boot_id() -> str | None:
    """This host's boot id. Two processes with the same boot id share CLOCK_MONOTONIC, which is how
    the bench maps the simulator's token stamps onto its own clock."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None
