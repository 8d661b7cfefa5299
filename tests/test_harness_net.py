"""harness.net's ports (pure: binds loopback sockets only)."""

import socket

from harness import net


def test_free_ports_are_below_the_ephemeral_range_and_not_repeated():
    low = net._ephemeral_low()
    ports = [net.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports), ports
    assert all(net._LOW <= p < min(net._HIGH, low) for p in ports), (ports, low)


def test_a_port_in_use_is_skipped():
    with socket.socket() as s:
        s.bind(("127.0.0.1", net.free_port()))
        taken = s.getsockname()[1]
        # The walk comes back to `taken` after the rest of the stretch: never handed out meanwhile.
        ports, _ = net._stretch()
        seen = {net.free_port() for _ in range(len(ports) - 1)}
    assert taken not in seen
