"""A TCP forwarder from the host's loopback into a network namespace.

    python -m harness.nsforward NETNS HOST PORT

binds 127.0.0.1:<free port> in the namespace it starts in (the host's), prints that port on one
line, then enters NETNS (setns, by the file `ip netns` keeps under /var/run/netns) and relays each
accepted connection to HOST:PORT there. The listening socket stays in the host's namespace; every
connection it makes is made inside NETNS. So `kubectl` on the host reaches an API server that only
listens inside the namespaces (harness/mesh.py). Stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000


def enter_netns(name: str) -> None:
    """Moves the calling thread into the named network namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def call_in(netns: str, fn: Callable[[], T]) -> T:
    """Runs `fn` in a new thread that has entered `netns` and returns its result (or raises its
    exception): the sockets `fn` makes live in that namespace. The calling thread is untouched."""
    result: dict[str, T] = {}
    error: list[BaseException] = []

    def run() -> None:
        try:
            enter_netns(netns)
            result["value"] = fn()
        except BaseException as e:  # handed to the caller
            error.append(e)

    t = threading.Thread(target=run, name=f"in-{netns}", daemon=True)
    t.start()
    t.join()
    if error:
        raise error[0]
    return result["value"]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError):
            writer.close()


async def _serve(listener: socket.socket, host: str, port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, sock=listener)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    netns, host, port = argv[0], argv[1], int(argv[2])
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    enter_netns(netns)  # from here on, new sockets are made inside the namespace
    print(listener.getsockname()[1], flush=True)
    asyncio.run(_serve(listener, host, port))
    return 0


class Forward:
    """`python -m harness.nsforward` as a child process: `port` on the host's loopback reaches
    `host:port` inside `netns`. Stopped by its PID."""

    def __init__(self, netns: str, host: str, port: int):
        root = Path(__file__).resolve().parent.parent
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.nsforward", netns, host, str(port)],
                                     stdout=subprocess.PIPE, cwd=root, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.isdigit():
            self.stop()
            raise RuntimeError(f"nsforward into {netns} did not start (exit {self.proc.poll()})")
        self.port = int(line)

    def stop(self) -> None:
        from harness.procs import stop

        stop(self.proc, timeout=5)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
