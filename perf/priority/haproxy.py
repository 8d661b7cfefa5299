"""HAProxy 2.6 (Debian 12's `haproxy`) as our own process: the anchor of the priority
benchmark. Its server queue orders waiting requests by `set-priority-class` (lower first,
then arrival): strict priority, no floor. HAProxy queues by concurrency, not by rate, so the
server gets `maxconn` connections and the upstream's fixed service time makes the capacity:
`maxconn / service time` requests per second. A request still queued after `timeout queue` is
answered 503."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from harness import tools
from harness.net import can_connect, free_port
from harness.procs import Child

CONF = """\
global
    maxconn 9000
    log stderr format raw local0 err
defaults
    mode http
    timeout connect 1s
    timeout client 30s
    timeout server 30s
    timeout queue {queue_ms}ms
frontend fe
    bind 127.0.0.1:{port}
    # Lower class first (HAProxy: -2047 .. 2047, default 0): critical ahead of everyone.
    http-request set-priority-class int(-10) if {{ req.hdr({header}) -m str {value} }}
    default_backend be
backend be
    server s1 127.0.0.1:{upstream_port} maxconn {maxconn}
"""


def binary() -> str:
    return tools.path("haproxy")


class HAProxy(Child):
    """`haproxy -f <conf>` on 127.0.0.1:<free port> before `upstream_port`."""

    def __init__(self, upstream_port: int, *, maxconn: int, queue_ms: int, header: str, value: str):
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="haproxy-"))
        self.log_path = self.dir / "haproxy.log"
        self.conf = self.dir / "haproxy.cfg"
        self.conf.write_text(CONF.format(port=self.port, upstream_port=upstream_port, maxconn=maxconn,
                                         queue_ms=queue_ms, header=header, value=value))

    def __enter__(self) -> HAProxy:
        self.start_and_wait([binary(), "-db", "-f", str(self.conf)], lambda: can_connect(self.port),
                            f"haproxy on :{self.port}", 15)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"
