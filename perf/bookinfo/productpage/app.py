"""productpage: the front of the Bookinfo-shaped application, a WSGI app served by gunicorn.

Written for this project in the shape of Bookinfo's productpage (same routes and JSON); see
perf/bookinfo/README.md for what is and is not reproduced. One page calls `details` and then
`reviews` (which calls `ratings`), over pooled keep-alive HTTP/1.1 connections (urllib3).

    gunicorn --worker-class gthread --threads 32 --keep-alive 60 -b 0.0.0.0:9080 \
        perf.bookinfo.productpage.app:application

Routes: /productpage (HTML), /api/v1/products, /api/v1/products/<id>,
/api/v1/products/<id>/reviews, /api/v1/products/<id>/ratings, and
/api/v1/products/<id>/page (JSON: product, details and reviews: the whole fan-out, the lab's load
target), /health, /internal/requests (request counters for the lab's hop check), /internal/reset (drops
the pooled connections: the lab calls it when it changes the traffic capture).
Downstream addresses: DETAILS_HOSTNAME/DETAILS_SERVICE_PORT, REVIEWS_HOSTNAME/REVIEWS_SERVICE_PORT,
RATINGS_HOSTNAME/RATINGS_SERVICE_PORT (default <name>:9080). With BOOKINFO_ARRIVALS=<file>, each
counted request appends its arrival time (seconds since the epoch) to that file, one per line.
"""

from __future__ import annotations

import html
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import urllib3

Environ = dict[str, Any]
StartResponse = Callable[..., Any]

PRODUCTS = [{
    "id": 0,
    "title": "The Comedy of Errors",
    "descriptionHtml": ("<a href=\"https://en.wikipedia.org/wiki/The_Comedy_of_Errors\">Wikipedia Summary</a>: "
                        "an early play by <b>William Shakespeare</b>, his shortest comedy: two pairs of twins "
                        "separated at birth, one town, a day of mistaken identities, puns and slapstick, "
                        "set in Ephesus."),
}]


def _service(name: str) -> str:
    host = os.environ.get(f"{name.upper()}_HOSTNAME") or name
    port = os.environ.get(f"{name.upper()}_SERVICE_PORT") or "9080"
    return f"http://{host}:{port}"


class Downstreams:
    """The services productpage calls, through one connection pool per service (kept alive)."""

    def __init__(self, pool_size: int, timeout_s: float):
        self.urls = {name: _service(name) for name in ("details", "reviews", "ratings")}
        self.http = urllib3.PoolManager(maxsize=pool_size, retries=urllib3.Retry(total=1, read=0, redirect=0),
                                        timeout=urllib3.Timeout(connect=2.0, read=timeout_s))

    def reset(self) -> None:
        """Closes every pooled connection (the lab does this when a node's traffic capture changed)."""
        self.http.clear()

    def get(self, service: str, path: str) -> tuple[int, dict | None]:
        """(status, JSON body) of GET <service><path>; (0, None) when the service cannot be reached."""
        try:
            r = self.http.request("GET", self.urls[service] + path, headers={"Accept": "application/json"})
        except urllib3.exceptions.HTTPError:
            return 0, None
        try:
            return r.status, json.loads(r.data)
        except ValueError:
            return r.status, None


class Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.from_loopback = 0
        path = os.environ.get("BOOKINFO_ARRIVALS")
        # Line-buffered, open for the life of the process.
        self.arrivals = open(path, "a", buffering=1) if path else None  # noqa: SIM115

    def count(self, environ: Environ) -> None:
        now = time.time()
        loopback = str(environ.get("REMOTE_ADDR", "")).startswith("127.")
        with self.lock:
            self.requests += 1
            self.from_loopback += loopback
            if self.arrivals is not None:
                self.arrivals.write(f"{now:.6f}\n")

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {"requests": self.requests, "from_loopback": self.from_loopback}


DETAILS_ERROR = {"error": "Sorry, product details are currently unavailable for this book."}
REVIEWS_ERROR = {"error": "Sorry, product reviews are currently unavailable for this book."}
RATINGS_ERROR = {"error": "Sorry, product ratings are currently unavailable for this book."}


class ProductPage:
    def __init__(self, downstreams: Downstreams):
        self.down = downstreams
        self.counters = Counters()

    # --- data ---------------------------------------------------------------------------
    def details(self, pid: int) -> tuple[int, dict]:
        status, body = self.down.get("details", f"/details/{pid}")
        return (status, body) if status == 200 and body is not None else (status or 503, DETAILS_ERROR)

    def reviews(self, pid: int) -> tuple[int, dict]:
        status, body = self.down.get("reviews", f"/reviews/{pid}")
        return (status, body) if status == 200 and body is not None else (status or 503, REVIEWS_ERROR)

    def ratings(self, pid: int) -> tuple[int, dict]:
        status, body = self.down.get("ratings", f"/ratings/{pid}")
        return (status, body) if status == 200 and body is not None else (status or 503, RATINGS_ERROR)

    # --- WSGI ---------------------------------------------------------------------------
    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/health":
            return _json(start_response, 200, {"status": "Product page is healthy"})
        if path == "/internal/requests":
            return _json(start_response, 200, self.counters.snapshot())
        if path == "/internal/reset":
            self.down.reset()
            return _json(start_response, 200, {"reset": True})
        self.counters.count(environ)
        if environ.get("REQUEST_METHOD") != "GET":
            return _json(start_response, 405, {"error": "method not allowed"})
        if path in ("/", "/index.html"):
            return _html(start_response, 200, "<!doctype html><html><head><title>Simple Bookstore App</title>"
                                              "</head><body><p><a href=\"/productpage\">Product page</a></p>"
                                              "</body></html>")
        if path == "/productpage":
            return self.page_html(start_response, 0)
        if path == "/api/v1/products":
            return _json(start_response, 200, PRODUCTS)
        m = re.fullmatch(r"/api/v1/products/([^/]+)(/reviews|/ratings|/page)?", path)
        if not m:
            return _json(start_response, 404, {"error": "not found"})
        if not m.group(1).isdigit():
            return _json(start_response, 400, {"error": "please provide numeric product ID"})
        pid = int(m.group(1))
        what = m.group(2)
        if what is None:
            return _json(start_response, 200, {"id": pid, "title": PRODUCTS[0]["title"],
                                               "descriptionHtml": PRODUCTS[0]["descriptionHtml"]})
        if what == "/reviews":
            return _json(start_response, *self.reviews(pid))
        if what == "/ratings":
            return _json(start_response, *self.ratings(pid))
        # The whole fan-out as JSON, what /productpage renders: details, then reviews (-> ratings).
        ds, details = self.details(pid)
        rs, reviews = self.reviews(pid)
        # Unlike Bookinfo's page (always 200 with an error text in it), a failed downstream makes
        # this route fail, so that a load generator counts it.
        status = 200 if ds == 200 and rs == 200 else 502
        return _json(start_response, status, {"id": pid, "product": PRODUCTS[0], "details": details,
                                              "reviews": reviews})

    def page_html(self, start_response: StartResponse, pid: int) -> Iterable[bytes]:
        _, details = self.details(pid)
        _, reviews = self.reviews(pid)
        return _html(start_response, 200, render_page(PRODUCTS[0], details, reviews))


def render_page(product: dict, details: dict, reviews: dict) -> str:
    e = html.escape
    rows = []
    if "error" in details:
        rows.append(f"<h4 class=\"text-center text-primary\">Error fetching product details!</h4><p>{e(details['error'])}</p>")
    else:
        rows.append("<h4 class=\"text-center text-primary\">Book Details</h4><dl>" + "".join(
            f"<dt>{e(str(k))}:</dt><dd>{e(str(v))}</dd>" for k, v in details.items() if k != "id") + "</dl>")
    if "error" in reviews:
        rows.append(f"<h4 class=\"text-center text-primary\">Error fetching product reviews!</h4><p>{e(reviews['error'])}</p>")
    else:
        rows.append("<h4 class=\"text-center text-primary\">Book Reviews</h4>")
        for rv in reviews.get("reviews", []):
            rating = rv.get("rating") or {}
            if "stars" in rating:
                stars = (f"<font color=\"{e(rating['color'])}\">" + "&#9733;" * int(rating["stars"])
                         + "&#9734;" * (5 - int(rating["stars"])) + "</font>")
            else:
                stars = f"<p><i>{e(rating.get('error', ''))}</i></p>"
            rows.append(f"<blockquote><p>{e(rv['text'])}</p><small>{e(rv['reviewer'])}</small>{stars}</blockquote>")
    return ("<!doctype html><html><head><meta charset=\"utf-8\"><title>Simple Bookstore App</title>"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1.0\"></head><body>"
            "<nav class=\"navbar\"><a class=\"navbar-brand\" href=\"#\">BookInfo Sample</a></nav>"
            f"<div class=\"container-fluid\"><div class=\"row\"><div class=\"col-md-12\">"
            f"<h3 class=\"text-center text-primary\">{e(product['title'])}</h3>"
            f"<p>Summary: {product['descriptionHtml']}</p></div></div>"
            f"<div class=\"row\"><div class=\"col-md-6\">{rows[0]}</div>"
            f"<div class=\"col-md-6\">{''.join(rows[1:])}</div></div></div></body></html>")


def _json(start_response: StartResponse, status: int, body: Any) -> list[bytes]:
    data = json.dumps(body, separators=(",", ":")).encode()
    start_response(_status(status), [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def _html(start_response: StartResponse, status: int, text: str) -> list[bytes]:
    data = text.encode()
    start_response(_status(status), [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(data)))])
    return [data]


def _status(code: int) -> str:
    return {200: "200 OK", 400: "400 Bad Request", 404: "404 Not Found", 405: "405 Method Not Allowed",
            502: "502 Bad Gateway", 503: "503 Service Unavailable"}.get(code, f"{code} Status")


def create_app(pool_size: int | None = None, timeout_s: float | None = None) -> ProductPage:
    return ProductPage(Downstreams(pool_size or int(os.environ.get("PRODUCTPAGE_POOL", "32")),
                                   timeout_s or float(os.environ.get("PRODUCTPAGE_TIMEOUT_S", "10"))))


application = create_app()
