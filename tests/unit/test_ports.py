"""find_free_port draws below the kernel's ephemeral range, where outgoing connections and Ray's own
random ports never land, and falls back to the kernel's choice when that range leaves no room."""
from __future__ import annotations

import socket

from orchestrator import ports


def test_a_picked_port_is_below_the_ephemeral_range_and_bindable():
    low = ports._ephemeral_low()
    picked = {ports.find_free_port() for _ in range(20)}
    assert all(ports.PICK_FROM <= p < low for p in picked), picked
    assert len(picked) > 1  # drawn at random, not the same port every time
    with socket.socket() as s:
        s.bind(("127.0.0.1", picked.pop()))


def test_a_port_in_use_is_skipped(monkeypatch):
    held_port = ports.find_free_port()
    free_port = next(p for p in iter(ports.find_free_port, None) if p != held_port)
    draws = iter([held_port, free_port])

    class Draws:  # the random draw lands on the held port first
        def randint(self, low, high):
            return next(draws)

    monkeypatch.setattr(ports.random, "SystemRandom", Draws)
    with socket.socket() as held:
        held.bind(("127.0.0.1", held_port))
        held.listen()
        assert ports.find_free_port() == free_port


def test_no_room_below_the_ephemeral_range_falls_back_to_the_kernels_choice(monkeypatch):
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: ports.PICK_FROM + 10)
    port = ports.find_free_port()
    assert not ports.PICK_FROM <= port < ports.PICK_FROM + 10
    assert ports.port_is_free("127.0.0.1", port)
