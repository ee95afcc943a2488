"""A free TCP port for a server about to be started on this machine (tests, benches, local tools).

The kernel's choice for port 0 comes from the ephemeral range, where every outgoing connection
also gets its source port: between that choice and the server's bind, one of the many client
connections of a test run can take the port ("address already in use"; a clean-clone run saw it
once). A port below that range is never a connection's source port, so only other servers can
take it, and a random choice, checked by binding, makes that rare.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000
# Not the module's generator: a test that seeds `random` must not make two processes pick alike.
_PICK = random.SystemRandom()


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port no socket holds now, below the ephemeral range where there is room (else the kernel's)."""
    top = _ephemeral_start()
    for _ in range(100 if top - _LOWEST >= 1_000 else 0):
        port = _PICK.randrange(_LOWEST, top)
        if _bindable(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
