"""free_port: distinct ports that bind, chosen below the kernel's ephemeral range."""

from __future__ import annotations

import socket

from tandem.checkpoint_engine.ports import LOWEST, ephemeral_range, free_port


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    assert LOWEST < low <= high
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50  # never handed twice
    assert all(LOWEST <= p < low for p in ports)
    for p in ports[:5]:
        with socket.socket() as s:
            s.bind(("0.0.0.0", p))  # noqa: S104

