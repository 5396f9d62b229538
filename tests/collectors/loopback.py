"""Loopback HTTP servers for tests: ``serving`` runs any handler; ``scripted_server`` answers GETs in turn;
``stand_in`` answers GETs and JSON POSTs with a function and records them.

Handlers subclass ``QuietHandler``: it answers with ``reply`` and keeps request logs off the test output."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class QuietHandler(BaseHTTPRequestHandler):
    def reply(self, body: bytes, content_type: str, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def scripted_server(path: str, payloads: list, content_type: str = "application/json") -> Iterator[str]:
    """Serve ``payloads`` in order at ``path`` (the last one repeats); yields the base URL."""
    remaining = list(payloads)

    class Handler(QuietHandler):
        def do_GET(self):
            if self.path != path:
                self.send_error(404)
                return
            payload = remaining.pop(0) if len(remaining) > 1 else remaining[0]
            self.reply(payload.encode() if isinstance(payload, str) else json.dumps(payload).encode(), content_type)

    with serving(Handler) as url:
        yield url


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Run ``handler`` on a free 127.0.0.1 port for the block; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def stand_in(answer):
    """A server on 127.0.0.1 recording JSON POST bodies and GET queries; ``answer(path, body)`` -> (status, obj)."""
    seen = []

    class Handler(QuietHandler):
        def _answer(self, body):
            seen.append((self.path, body))
            status, obj = answer(self.path, body)
            self.reply(json.dumps(obj).encode(), "application/json", status)

        def do_POST(self):
            self._answer(json.loads(self.rfile.read(int(self.headers["content-length"]))))

        def do_GET(self):
            self._answer(None)

    with serving(Handler) as url:
        yield url, seen
