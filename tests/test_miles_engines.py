"""The rollout engines the watchdog names when they do not answer (``rescue.miles.engines``),
against engines and a router served here: one answering ``/health``, one whose port refuses."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from rescue.miles.engines import diagnosis, engine_urls, unanswered


def _serve(routes: dict[str, object]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path not in routes:
                self.send_error(404)
                return
            body = json.dumps(routes[self.path]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def engines():
    alive = _serve({"/health": {}})
    with socket.socket() as s:  # a port nothing listens on: connection refused
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    urls = [f"http://127.0.0.1:{alive.server_address[1]}", f"http://127.0.0.1:{dead}"]
    router = _serve({"/list_workers": {"urls": urls}})
    yield urls, router.server_address[1]
    alive.shutdown()
    router.shutdown()


def test_the_engines_that_do_not_answer_are_named_with_why(engines):
    urls, _ = engines
    [(url, why)] = unanswered(urls, timeout=5)
    assert url == urls[1] and "refused" in why.lower()
    args = SimpleNamespace(rollout_external_engine_addrs=[u.removeprefix("http://") for u in urls])
    said = diagnosis(args, timeout=5)
    assert said.startswith(f"rollout engines not answering (1 of 2): {urls[1]} (")


def test_without_external_engines_the_router_lists_them(engines):
    urls, router_port = engines
    args = SimpleNamespace(sglang_router_ip="127.0.0.1", sglang_router_port=router_port)
    assert engine_urls(args) == urls
    args = SimpleNamespace(rollout_external_engine_addrs=[urls[0].removeprefix("http://")])
    assert diagnosis(args) == "every rollout engine answers its health check (1)"
    assert diagnosis(SimpleNamespace()) is None  # nothing to ask: said by nothing
