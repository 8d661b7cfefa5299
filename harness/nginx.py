"""nginx as our own process: the upstream (a static file) and the
`limit_req` anchors, each server with its own access log of `$msec`
timestamps (the upstream's view of the rate)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from harness import procstats, tools
from harness.net import can_connect, free_port
from harness.procs import Child

# The same content behind every rung of the ladder: a Bookinfo "details"
# sized JSON document (178 bytes), served from a file.
PAYLOAD = (b'{"id":0,"author":"William Shakespeare","year":1595,"type":"paperback",'
           b'"pages":200,"publisher":"PublisherA","language":"English",'
           b'"ISBN-10":"1234567890","ISBN-13":"123-1234567890"}')
PATH = "/details.json"

CONF = """\
worker_processes {workers};
worker_rlimit_nofile 20000;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 16384; }}
http {{
    default_type application/json;
    sendfile on;
    tcp_nodelay on;
    keepalive_timeout 75s;
    keepalive_requests 10000000;
    open_file_cache max=16 inactive=60s;
    client_body_temp_path {dir}/body;
    # $msec: the time the response was sent (ms resolution): the upstream's clock.
    log_format ts '$msec $status';
{zones}
    server {{
        listen 127.0.0.1:{upstream_port} reuseport backlog=4096;
        root {dir}/www;
        access_log {dir}/upstream.log ts;
    }}
{limit_servers}
}}
"""

ZONE = "    limit_req_zone $server_port zone=r{rate}:1m rate={rate}r/s;"
LIMIT_SERVER = """\
    server {{
        listen 127.0.0.1:{port} reuseport backlog=4096;
        root {dir}/www;
        access_log {dir}/limit{rate}.log ts;
        # Excess requests are delayed (no nodelay) up to a large burst, never rejected here.
        limit_req zone=r{rate} burst={burst};
    }}"""


def nginx_bin() -> str:
    return tools.path("nginx")


def version() -> str:
    r = subprocess.run([nginx_bin(), "-v"], capture_output=True, text=True)
    return (r.stderr or r.stdout).strip().split("/")[-1]


class Nginx(Child):
    """One nginx master + workers: the upstream server and one `limit_req`
    server per rate in `limit_rates`."""

    def __init__(self, limit_rates: tuple[int, ...] = (), workers: int = 2, burst: int = 100000):
        self.dir = Path(tempfile.mkdtemp(prefix="perf-nginx-"))
        self.dir.chmod(0o755)  # workers run as an unprivileged user when we are root
        (self.dir / "www").mkdir()
        (self.dir / "body").mkdir()
        (self.dir / "www" / PATH.lstrip("/")).write_bytes(PAYLOAD)
        self.upstream_port = free_port()
        self.limit_ports = {rate: free_port() for rate in limit_rates}
        zones = "\n".join(ZONE.format(rate=r) for r in limit_rates)
        servers = "\n".join(LIMIT_SERVER.format(port=p, dir=self.dir, rate=r, burst=burst)
                            for r, p in self.limit_ports.items())
        self.conf = self.dir / "nginx.conf"
        self.conf.write_text(CONF.format(workers=workers, dir=self.dir, zones=zones,
                                         upstream_port=self.upstream_port, limit_servers=servers))
        self.log_path = self.dir / "error.log"  # nginx's own error log, and what it says before opening it

    def __enter__(self) -> Nginx:
        ports = (self.upstream_port, *self.limit_ports.values())
        try:
            self.start_and_wait([nginx_bin(), "-c", str(self.conf), "-p", str(self.dir), "-e", str(self.log_path),
                                 "-g", "daemon off;"], lambda: all(map(can_connect, ports)), f"nginx on {ports}", 15)
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()  # SIGTERM to the master: it stops its workers
        shutil.rmtree(self.dir, ignore_errors=True)

    def pids(self) -> list[int]:
        """The master and its workers (for CPU and RSS)."""
        assert self.proc is not None
        return [self.proc.pid, *procstats.children(self.proc.pid)]

    def access_log(self, rate: int | None = None) -> Path:
        return self.dir / ("upstream.log" if rate is None else f"limit{rate}.log")

    def url(self, rate: int | None = None) -> str:
        port = self.upstream_port if rate is None else self.limit_ports[rate]
        return f"http://127.0.0.1:{port}{PATH}"


class LogTail:
    """What a log file got since the tail was made (an access log: nginx's, Envoy's)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def text(self) -> str:
        if not self.path.exists():
            return ""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            return f.read().decode(errors="replace")

    def read(self) -> list[tuple[float, int]]:
        """nginx's lines (`$msec $status`): (timestamp s, status)."""
        return [(float(p[0]), int(p[1])) for p in map(str.split, self.text().splitlines()) if len(p) >= 2]
