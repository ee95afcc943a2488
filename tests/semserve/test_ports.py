"""semserve/ports.py: servers' ports come from below the ephemeral range, where no client
connection's source port can take them between the choice and the bind."""

from __future__ import annotations

import socket

from semserve import ports


def test_ports_are_free_and_below_the_ephemeral_range() -> None:
    start = ports._ephemeral_start()
    picked = {ports.free_port() for _ in range(200)}
    assert all(ports._LOWEST <= p < start for p in picked), sorted(picked)[:5]
    assert len(picked) > 150  # random, not one port over and over
    for port in list(picked)[:20]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_bindable() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        assert ports._bindable("127.0.0.1", held.getsockname()[1]) is False


def test_without_room_below_the_range_the_kernel_picks(monkeypatch) -> None:
    monkeypatch.setattr(ports, "_ephemeral_start", lambda: ports._LOWEST + 10)
    port = ports.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
