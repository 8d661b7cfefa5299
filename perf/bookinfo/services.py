"""How each service of the Bookinfo-shaped application is started: command, environment, port.

Pure data and one build step; the mesh lab (perf/meshlab/lab.py) runs these commands inside its
network namespaces, and tests run them on loopback.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PORT = 9080
REVIEWS_CLASSES = ROOT / "build" / "bookinfo" / "reviews"
SERVICES = ("productpage", "details", "reviews", "ratings")
# Who calls whom (Bookinfo's call graph): productpage -> details, reviews; reviews -> ratings.
CALLS = {"productpage": ("details", "reviews"), "details": (), "reviews": ("ratings",), "ratings": ()}
# The load generator's entry points: the whole fan-out (JSON), and one service alone.
PATHS = {"productpage": "/api/v1/products/0/page", "details": "/details/0", "reviews": "/reviews/0",
         "ratings": "/ratings/0"}


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str]


def build_reviews(force: bool = False) -> Path:
    """Compiles Reviews.java into build/bookinfo/reviews (cached: only when the source is newer)."""
    src = HERE / "reviews" / "Reviews.java"
    out = REVIEWS_CLASSES / "Reviews.class"
    if force or not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        javac = shutil.which("javac")
        if javac is None:
            raise FileNotFoundError("javac not found: install a JDK 17 (apt-get install openjdk-17-jdk-headless)")
        REVIEWS_CLASSES.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([javac, "-d", str(REVIEWS_CLASSES), str(src)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"javac Reviews.java failed:\n{r.stderr}")
    return REVIEWS_CLASSES


def _tool(name: str, hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise FileNotFoundError(f"{name} not found: {hint}")
    return path


def commands(addrs: dict[str, str], port: int = PORT, bind: str = "0.0.0.0", productpage_threads: int = 32,
             ports: dict[str, int] | None = None) -> dict[str, Command]:
    """The four services, each listening on `bind`:`port`, calling the others at `addrs[name]`:`port`
    (downstream addresses from environment variables, as Bookinfo's services take them). `ports`
    gives each service a port of its own instead (tests on one loopback address)."""
    port_of = {n: (ports or {}).get(n, port) for n in SERVICES}

    def down(*names: str) -> dict[str, str]:
        env = {}
        for n in names:
            env[f"{n.upper()}_HOSTNAME"] = addrs[n]
            env[f"{n.upper()}_SERVICE_PORT"] = str(port_of[n])
        return env

    gunicorn = ROOT / ".venv" / "bin" / "gunicorn"
    if not gunicorn.exists():
        raise FileNotFoundError("gunicorn not found in .venv: run `make setup`")
    return {
        "productpage": Command(
            [str(gunicorn), "--worker-class", "gthread", "--workers", "1", "--threads", str(productpage_threads),
             "--keep-alive", "60", "--backlog", "2048", "--bind", f"{bind}:{port_of['productpage']}", "--chdir", str(ROOT),
             "--log-level", "warning", "perf.bookinfo.productpage.app:application"],
            {**down("details", "reviews", "ratings"), "PRODUCTPAGE_POOL": str(productpage_threads)}),
        "details": Command([_tool("ruby", "apt-get install ruby ruby-webrick"), str(HERE / "details" / "details.rb"),
                            str(port_of["details"])], {"DETAILS_TCP_NODELAY": "1"}),
        # sun.net.httpserver.nodelay: without it the JDK server writes headers and body in two
        # segments with Nagle on, and a keep-alive client waits ~40 ms for the delayed ACK.
        # sun.net.inetaddr.ttl=0: ratings' name is looked up at each new connection (the JDK keeps
        # an answer 30 s), as the other services do; the mesh lab moves names between topologies.
        "reviews": Command([_tool("java", "install a JDK 17"), "-Dsun.net.httpserver.nodelay=true",
                            "-Dsun.net.inetaddr.ttl=0", "-Xss512k",
                            "-XX:+UseSerialGC",
                            "-cp", str(REVIEWS_CLASSES), "Reviews", str(port_of["reviews"])],
                           {**down("ratings"), "ENABLE_RATINGS": "true", "STAR_COLOR": "black",
                            "HOSTNAME": "reviews"}),
        "ratings": Command([_tool("node", "install Node.js 20"), str(HERE / "ratings" / "ratings.js"), str(port_of["ratings"])], {}),
    }
