"""The Bookinfo-shaped services (perf/bookinfo), run on loopback with a port each: Bookinfo's routes
and JSON shapes, the whole fan-out through productpage, kept-alive connections in and pooled
connections out, bad input, and a downstream that is gone."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time

import pytest

from harness.net import free_port
from harness.procs import stop
from perf.bookinfo import services

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("runtimes_ok")]


class Running:
    def __init__(self, tmp_path):
        services.build_reviews()
        self.ports = {name: free_port() for name in services.SERVICES}
        addrs = dict.fromkeys(services.SERVICES, "127.0.0.1")
        self.cmds = services.commands(addrs, bind="127.0.0.1", ports=self.ports)
        self.procs: dict[str, subprocess.Popen] = {}
        self.tmp = tmp_path

    def start(self, name: str) -> None:
        cmd = self.cmds[name]
        with open(self.tmp / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
            self.procs[name] = subprocess.Popen(cmd.argv, env={**os.environ, **cmd.env}, stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.get(name, "/health")[0] == 200:
                    return
            except OSError:
                pass
            if self.procs[name].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start: {(self.tmp / f'{name}.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def stop(self, name: str) -> None:
        stop(self.procs.pop(name), timeout=10)

    def get(self, name: str, path: str, conn: http.client.HTTPConnection | None = None) -> tuple[int, dict, bytes]:
        c = conn or http.client.HTTPConnection("127.0.0.1", self.ports[name], timeout=10)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            if conn is None:
                c.close()


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    run = Running(tmp_path_factory.mktemp("bookinfo"))
    try:
        for name in ("ratings", "details", "reviews", "productpage"):
            run.start(name)
        yield run
    finally:
        for name in list(run.procs):
            run.stop(name)


DETAILS = {"id": 0, "author": "William Shakespeare", "year": 1595, "type": "paperback", "pages": 200,
           "publisher": "PublisherA", "language": "English", "ISBN-10": "1234567890", "ISBN-13": "123-1234567890"}


def test_details_json_and_payload_size(app):
    status, headers, body = app.get("details", "/details/0")
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body) == DETAILS
    assert len(body) == 178  # Bookinfo's details body, as the study's strace shows it
    assert headers["server"].startswith("WEBrick/")
    assert json.loads(app.get("details", "/details/7")[2])["id"] == 7


def test_ratings_json(app):
    status, headers, body = app.get("ratings", "/ratings/0")
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"id": 0, "ratings": {"Reviewer1": 5, "Reviewer2": 4}}


def test_reviews_json_carries_the_ratings(app):
    status, _, body = app.get("reviews", "/reviews/0")
    assert status == 200
    r = json.loads(body)
    assert r["id"] == "0" and set(r) == {"id", "podname", "clustername", "reviews"}
    assert [x["reviewer"] for x in r["reviews"]] == ["Reviewer1", "Reviewer2"]
    assert [x["rating"] for x in r["reviews"]] == [{"stars": 5, "color": "black"}, {"stars": 4, "color": "black"}]
    assert all(len(x["text"]) > 50 for x in r["reviews"])


def test_productpage_api_fans_out_to_details_and_reviews(app):
    before = {n: json.loads(app.get(n, "/internal/requests")[2])["requests"] for n in services.SERVICES}
    status, headers, body = app.get("productpage", services.PATHS["productpage"])
    assert status == 200 and headers["content-type"] == "application/json"
    page = json.loads(body)
    assert set(page) == {"id", "product", "details", "reviews"}
    assert page["details"] == DETAILS
    assert page["reviews"]["reviews"][0]["rating"] == {"stars": 5, "color": "black"}
    after = {n: json.loads(app.get(n, "/internal/requests")[2])["requests"] for n in services.SERVICES}
    assert {n: after[n] - before[n] for n in services.SERVICES} == {"productpage": 1, "details": 1, "reviews": 1,
                                                                    "ratings": 1}


def test_productpage_bookinfo_routes(app):
    products = json.loads(app.get("productpage", "/api/v1/products")[2])
    assert products[0]["id"] == 0 and products[0]["title"] == "The Comedy of Errors"
    assert set(json.loads(app.get("productpage", "/api/v1/products/0")[2])) == {"id", "title", "descriptionHtml"}
    assert json.loads(app.get("productpage", "/api/v1/products/0/reviews")[2])["reviews"][1]["reviewer"] == "Reviewer2"
    assert json.loads(app.get("productpage", "/api/v1/products/0/ratings")[2])["ratings"]["Reviewer1"] == 5
    status, headers, body = app.get("productpage", "/productpage")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b"The Comedy of Errors" in body and b"William Shakespeare" in body and b"&#9733;" in body


@pytest.mark.parametrize("name,path", [("details", "/details/abc"), ("reviews", "/reviews/abc"),
                                       ("ratings", "/ratings/abc"), ("productpage", "/api/v1/products/abc/page")])
def test_a_non_numeric_id_is_refused_with_400(app, name, path):
    status, _, body = app.get(name, path)
    assert status == 400 and json.loads(body) == {"error": "please provide numeric product ID"}


@pytest.mark.parametrize("name", services.SERVICES)
def test_keep_alive_serves_many_requests_on_one_connection(app, name):
    conn = http.client.HTTPConnection("127.0.0.1", app.ports[name], timeout=10)
    try:
        for _ in range(5):
            assert app.get(name, services.PATHS[name], conn)[0] == 200
        sock = conn.sock
        assert app.get(name, services.PATHS[name], conn)[0] == 200
        assert conn.sock is sock  # the same connection, never reopened
    finally:
        conn.close()


def _established(port: int) -> int:
    out = subprocess.run(["ss", "-Htn", "state", "established", f"dport = :{port}"], capture_output=True,
                         text=True).stdout
    return len(out.splitlines())


def test_outgoing_calls_reuse_pooled_connections(app):
    """20 pages, one after the other: productpage keeps one connection to details and reviews, reviews
    one to ratings (a new connection per call would show 20)."""
    for _ in range(20):
        assert app.get("productpage", services.PATHS["productpage"])[0] == 200
    for callee in ("details", "reviews", "ratings"):
        assert 1 <= _established(app.ports[callee]) <= 2, callee


def test_reset_drops_the_pools(app):
    assert app.get("productpage", services.PATHS["productpage"])[0] == 200
    assert _established(app.ports["details"]) >= 1
    for caller in ("productpage", "reviews"):
        assert json.loads(app.get(caller, "/internal/reset")[2]) == {"reset": True}
    deadline = time.monotonic() + 10
    while _established(app.ports["details"]) + _established(app.ports["ratings"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _established(app.ports["details"]) == 0 and _established(app.ports["ratings"]) == 0
    assert app.get("productpage", services.PATHS["productpage"])[0] == 200  # and new ones are made


def test_a_gone_downstream_fails_the_api_and_shows_in_the_page(app):
    app.stop("details")
    try:
        status, _, body = app.get("productpage", services.PATHS["productpage"])
        assert status == 502
        assert json.loads(body)["details"] == {"error": "Sorry, product details are currently unavailable for this book."}
        status, _, body = app.get("productpage", "/productpage")
        assert status == 200 and b"Error fetching product details!" in body
    finally:
        app.start("details")
    app.stop("ratings")
    try:
        status, _, body = app.get("reviews", "/reviews/0")
        assert status == 200
        assert json.loads(body)["reviews"][0]["rating"] == {"error": "Ratings service is currently unavailable"}
    finally:
        app.start("ratings")
    assert app.get("productpage", services.PATHS["productpage"])[0] == 200
