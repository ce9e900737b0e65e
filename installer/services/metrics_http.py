"""``/metrics`` (Prometheus text format 0.0.4) and ``/healthz`` over HTTP, for the health sidecar.

The standard library's ThreadingHTTPServer: two read-only paths, answered from what the
caller's callables return (the last check's, never a new check per request: a scrape costs
no kernel-log read). Bounded: a request line and headers read within REQUEST_TIMEOUT_S, a
body never read, a slow client's thread ends with its socket timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the text exposition format
REQUEST_TIMEOUT_S = 10.0


class MetricsServer:
    """Serves ``metrics()`` at /metrics and ``healthz()`` (ok, text) at /healthz: 200 while
    ok, 503 with the text otherwise. ``port`` 0 picks a free one (``self.port`` says)."""

    def __init__(self, host: str, port: int, metrics: Callable[[], str],
                 healthz: Callable[[], tuple[bool, str]]) -> None:
        handler = _handler(metrics, healthz)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.host, self.port = host, self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.5}, daemon=True,
                                        name="metrics-http")

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()  # returns once serve_forever's loop has seen it (poll_interval)
        self._server.server_close()
        self._thread.join(timeout=5)


def _handler(metrics: Callable[[], str],
             healthz: Callable[[], tuple[bool, str]]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S
        server_version = "nvidia-driver-installer"

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, metrics(), CONTENT_TYPE)
            elif path == "/healthz":
                ok, text = healthz()
                self._send(200 if ok else 503, text + "\n", "text/plain; charset=utf-8")
            else:
                self._send(404, "not found: try /metrics or /healthz\n",
                           "text/plain; charset=utf-8")

        def _send(self, code: int, text: str, content_type: str) -> None:
            body = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # a scrape every 30 s is no news for the container's log

    return Handler
