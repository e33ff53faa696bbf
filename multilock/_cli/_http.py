"""The HTTP endpoints of ``multilock run``: ``/metrics``, ``/healthz``, ``/readyz``, ``/jobs``.

Served by the standard library's WSGI server on a daemon thread, one server per
address and port: ``--health-port`` and ``--metrics-port`` may share one. ``/metrics``
is prometheus-client's own WSGI application.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from .._scheduling.scheduler import Scheduler
from ..errors import ConfigurationError
from ._job_view import LastOutcomes, job_rows

__all__ = ["Endpoints", "serve"]

_LIVENESS_TIMEOUT = 1.0  # seconds the event loop has to run a callback for /healthz
_JOBS_NEXT = 3  # next fire times per job in /jobs

StartResponse = Callable[..., Any]
App = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow client never holds the process at exit


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log: probes every few seconds would drown the scheduler's lines."""


class Endpoints:
    """A WSGI application answering the paths it was given."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.paths: dict[str, App] = {}

    def add_health(self) -> None:
        """Answer ``/healthz`` (alive: the event loop runs) and ``/readyz`` (ready: the
        backend answered the last probe): 200, or 503 with the reason; and ``/jobs``
        (JSON: each job's next fire times and last outcome, for ``multilock jobs``)."""
        self.paths["/healthz"] = self._check(lambda: self.scheduler.liveness(_LIVENESS_TIMEOUT))
        self.paths["/readyz"] = self._check(self.scheduler.readiness)
        outcomes = LastOutcomes()
        self.scheduler.add_listener(outcomes)
        self.paths["/jobs"] = self._jobs(outcomes)

    def _jobs(self, outcomes: LastOutcomes) -> App:
        def answer(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            rows = job_rows(self.scheduler, _JOBS_NEXT, outcomes)
            body = {"replica": self.scheduler.replica_id, "jobs": rows}
            headers = [("Content-Type", "application/json"), ("Cache-Control", "no-store")]
            start_response("200 OK", headers)
            return [json.dumps(body).encode()]

        return answer

    def add_metrics(self) -> None:
        """Answer ``/metrics`` from the global Prometheus registry."""
        try:
            from prometheus_client import make_wsgi_app
        except ImportError:
            raise ConfigurationError(
                "--metrics-port needs prometheus-client: pip install 'multilock[metrics]'"
            ) from None
        self.paths["/metrics"] = make_wsgi_app()

    @staticmethod
    def _check(check: Callable[[], tuple[bool, str]]) -> App:
        def answer(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            ok, detail = check()
            status = "200 OK" if ok else "503 Service Unavailable"
            body = f"{detail}\n".encode()
            headers = [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store")]
            start_response(status, headers)
            return [body]

        return answer

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """Dispatch on the path."""
        app = self.paths.get(environ.get("PATH_INFO") or "/")
        if app is None:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"not found; try {', '.join(sorted(self.paths))}\n".encode()]
        return app(environ, start_response)


def serve(endpoints: Endpoints, host: str, port: int, what: str) -> WSGIServer:
    """Serve ``endpoints`` on ``host:port`` from a daemon thread; one clear error if the
    address cannot be bound (``what`` names the option)."""
    try:
        server_class = _Server6 if ":" in host else _Server
        server = make_server(host, port, endpoints, server_class, _QuietHandler)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve {what} on {host}:{port}: {exc.strerror or exc}"
        ) from None
    thread = threading.Thread(target=server.serve_forever, name=f"multilock-{what}", daemon=True)
    thread.start()
    return server
