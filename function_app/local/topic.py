"""A loopback stand-in for an Event Grid custom topic: what `EventGridPublisherClient` publishes to, locally.

    with LocalTopic(key, lambda event: front_door.deliver(event, family="drift")) as topic:
        ...  # RETRAIN_DRIFT_TOPIC_ENDPOINT=topic.endpoint, RETRAIN_DRIFT_TOPIC_KEY=key

It answers as a topic's publish endpoint does: `POST /api/events` with the key in the `aeg-sas-key` header
(compared in constant time; 401 otherwise), a JSON array of Event Grid events or a CloudEvents batch (a
single event object is accepted too), at most `max_body_bytes` (413 beyond, read no further), 200 with an
empty body once every event was handed on. Where Azure would deliver to a subscription later, this hands
each event, in order, to the callback before it answers: a callback that raises makes the answer 503, so
the publisher's retry delivers again (at least once, as Event Grid does; the front door dedupes).

It binds 127.0.0.1 only and serves plain http: it is a development and test tool, never an endpoint.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from core.errors import RetrainError
from function_app.events.parsing import PayloadError, load_event_grid_payload
from function_app.settings.app import mask_secrets

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
PUBLISH_PATH = "/api/events"
KEY_HEADER = "aeg-sas-key"
DEFAULT_MAX_BODY_BYTES = 1024 * 1024  # Event Grid's own limit on one publish request
MIN_KEY_CHARS = 16
SOCKET_TIMEOUT_S = 10.0  # a client that stops sending mid-body does not hold a thread forever
RECENT_DELIVERIES = 100
SHUTDOWN_POLL_S = 0.05  # how often the serving thread checks for stop(): the bound on how long stop() takes

Deliver = Callable[[Mapping[str, Any]], Any]


class LocalTopicError(RetrainError, ValueError):
    """The local topic cannot be set up as asked; the message names the input and the expected form."""

    one_line = False  # kept as written


class LocalTopic:
    """A loopback HTTP server with an Event Grid topic's publish endpoint; a context manager."""

    def __init__(
        self,
        key: str,
        deliver: Deliver,
        *,
        port: int = 0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        if not isinstance(key, str) or len(key.strip()) < MIN_KEY_CHARS:
            raise LocalTopicError(
                f"the local topic's key has {len(key) if isinstance(key, str) else 0} characters; "
                f"expected at least {MIN_KEY_CHARS}, e.g. one from secrets.token_urlsafe()"
            )
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise LocalTopicError(f"port {port!r}: expected 0 (any free port) to 65535")
        if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
            raise LocalTopicError(f"max_body_bytes {max_body_bytes!r}: expected a positive whole number")
        self._key = key.encode()
        self._deliver = deliver
        self._port = port
        self._max_body_bytes = max_body_bytes
        self._lock = threading.Lock()
        self._results: deque[Any] = deque(maxlen=RECENT_DELIVERIES)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle -----------------------------------------------------------------------------------------

    def start(self) -> LocalTopic:
        if self._server is not None:
            raise LocalTopicError("the local topic is already started; stop it before starting it again")
        server = ThreadingHTTPServer((LOOPBACK, self._port), _handler_for(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, args=(SHUTDOWN_POLL_S,), name="local-topic", daemon=True
        )
        self._thread.start()
        log.info("local Event Grid topic listening at %s", self.endpoint)
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join()
        self._server = self._thread = None

    def __enter__(self) -> LocalTopic:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """The URL to publish to (RETRAIN_DRIFT_TOPIC_ENDPOINT)."""
        if self._server is None:
            raise LocalTopicError("the local topic is not started; it has no endpoint yet")
        return f"http://{LOOPBACK}:{self._server.server_address[1]}{PUBLISH_PATH}"

    @property
    def results(self) -> list[Any]:
        """What the callback returned for the most recent deliveries, oldest first."""
        with self._lock:
            return list(self._results)

    # -- one request ----------------------------------------------------------------------------------------

    def authorized(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self._key)

    def handle(self, events: list[dict[str, Any]]) -> None:
        """Hand each event on, in order; the callback's exception propagates (the request answers 503)."""
        for event in events:
            result = self._deliver(event)
            with self._lock:
                self._results.append(result)

    @property
    def max_body_bytes(self) -> int:
        return self._max_body_bytes


def _handler_for(topic: LocalTopic) -> type[BaseHTTPRequestHandler]:
    """http.server builds a handler per request from a class: this one's class knows its topic."""
    return type("LocalTopicHandler", (_PublishHandler,), {"topic": topic})


class _PublishHandler(BaseHTTPRequestHandler):
    topic: LocalTopic
    timeout = SOCKET_TIMEOUT_S
    protocol_version = "HTTP/1.1"  # keep-alive, as the publisher's connection pool expects

    def do_POST(self) -> None:
        if urlsplit(self.path).path != PUBLISH_PATH:
            self._answer(HTTPStatus.NOT_FOUND, f"no topic at this path; publish to {PUBLISH_PATH}")
            return
        if not self.topic.authorized(self.headers.get(KEY_HEADER)):
            self._answer(HTTPStatus.UNAUTHORIZED, f"missing or wrong {KEY_HEADER} header")
            return
        body = self._body()
        if body is None:
            return
        try:
            events = load_event_grid_payload(body.decode("utf-8"))
        except UnicodeDecodeError:
            self._answer(HTTPStatus.BAD_REQUEST, "the body is not UTF-8; expected JSON events")
            return
        except PayloadError as error:
            self._answer(HTTPStatus.BAD_REQUEST, str(error))
            return
        try:
            self.topic.handle(events)
        except Exception as error:  # the subscriber failed: answer so that the publisher retries
            reason = mask_secrets(str(error).strip().splitlines()[0][:200] if str(error).strip() else "")
            log.warning(
                "local topic: delivering %d events failed: %s %s", len(events), type(error).__name__, reason
            )
            self._answer(HTTPStatus.SERVICE_UNAVAILABLE, "the subscriber failed; publish again")
            return
        log.info("local topic: delivered %d events", len(events))
        self._answer(HTTPStatus.OK, "")

    def do_GET(self) -> None:
        self._answer(HTTPStatus.METHOD_NOT_ALLOWED, f"publish with POST {PUBLISH_PATH}", {"Allow": "POST"})

    do_PUT = do_DELETE = do_PATCH = do_GET

    def _body(self) -> bytes | None:
        """The request body, or None once an error answer was sent."""
        length_text = self.headers.get("Content-Length")
        if length_text is None or not (length_text.strip().isascii() and length_text.strip().isdigit()):
            self._answer(HTTPStatus.LENGTH_REQUIRED, "expected a Content-Length header with the body's size")
            return None
        length = int(length_text)
        if length > self.topic.max_body_bytes:
            self._answer(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"the body has {length} bytes; expected at most {self.topic.max_body_bytes}",
            )
            return None
        body = self.rfile.read(length)
        if len(body) < length:
            self._answer(HTTPStatus.BAD_REQUEST, "the body ended before Content-Length bytes")
            return None
        return body

    def _answer(self, status: HTTPStatus, message: str, headers: Mapping[str, str] | None = None) -> None:
        if status != HTTPStatus.OK:
            log.info("local topic: %d %s", status.value, message)
        payload = message.encode()
        self.send_response(status.value)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        if status != HTTPStatus.OK:
            # An error answer may leave the body unread; it must not be taken for the next request.
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        # http.server writes each request to stderr; here it is a debug line like any other.
        if log.isEnabledFor(logging.DEBUG):
            log.debug("local topic: %s", format % args)
