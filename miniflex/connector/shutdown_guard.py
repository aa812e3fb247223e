"""An answer for every client when the server stops: requests the engine will never finish
get a 503 instead of a connection held open until SIGKILL.

On SIGTERM vLLM's API server stops its engine (at once, or after draining for
``--shutdown-timeout`` seconds) and then waits for its HTTP connections to
close. A request the engine had not finished by then is never answered: its
handler waits for output that cannot come, the connection never closes, and the
server never exits (``tests/e2e/test_serve_shutdown.py``). ``miniflex serve``
adds :class:`ShutdownGuard` to vLLM's API server (``--middleware``): while a
request is in flight it checks every :data:`POLL_S` whether the engine client
has stopped (``errored``: shut down or dead); once it has, the request's
handler is cancelled and the client gets ``503`` in vLLM's error format (or,
where the response had begun, the end of its body), so the server closes
every connection and exits. Where vLLM saw the engine die before its tasks
were cancelled, it answers its requests 500 (``EngineDeadError``); once the
engine has stopped, the guard sends such an answer as the same 503.

The drain itself is vLLM's: ``miniflex serve`` passes ``--shutdown-timeout``
:data:`DRAIN_S` unless the command line gives one (and the installed vLLM knows
the flag), so a request that can finish in that time is answered in full.
"""

from __future__ import annotations

import asyncio
import logging

from miniflex.connector.asgi_reply import App, Message, Receive, Scope, Send, send_error

__all__ = ["DRAIN_S", "POLL_S", "ShutdownGuard"]

logger = logging.getLogger("miniflex.serve")

POLL_S = 0.5
"""How often a request in flight checks whether the engine has stopped."""
DRAIN_S = 25
"""``--shutdown-timeout`` of ``miniflex serve`` (seconds the engine finishes what is in
flight after SIGTERM), below the 30 s most supervisors wait before SIGKILL."""


class ShutdownGuard:
    """ASGI middleware (vLLM's ``--middleware``): 503 once the engine has stopped."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = _engine_client(scope.get("app"))
        if scope.get("type") != "http" or client is None:
            return await self.app(scope, receive, send)
        response = _Response(send, client, scope.get("path", ""))
        handler = asyncio.ensure_future(self.app(scope, receive, response.send))
        try:
            while True:
                finished, _ = await asyncio.wait({handler}, timeout=POLL_S)
                if finished:
                    return handler.result()
                if _stopped(client):
                    break
        except BaseException:  # this request itself was cancelled: so is its handler
            handler.cancel()
            raise
        handler.cancel()
        await asyncio.gather(handler, return_exceptions=True)
        return await response.close_unanswered()


class _Response:
    """``send`` for the handler, remembering how far the response got; an error vLLM
    answers once its engine has stopped (``EngineDeadError``: a 500) goes out as the
    shutdown's 503 instead."""

    def __init__(self, send: Send, client: object, path: str) -> None:
        self._send, self._client, self._path = send, client, path
        self.started = False
        self.ended = False
        self._replaced = False  # the handler's error went out as a 503: drop the rest

    async def send(self, message: Message) -> None:
        if self._replaced:
            return
        if message.get("type") == "http.response.start":
            if message.get("status") == 500 and _stopped(self._client):
                self._replaced = True
                return await self._unavailable()
            self.started = True
        elif message.get("type") == "http.response.body" and not message.get("more_body"):
            self.ended = True
        await self._send(message)

    async def close_unanswered(self) -> None:
        """A 503 if nothing was sent yet; else the end of the body begun."""
        if self.ended:
            return
        if self.started:
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await self._unavailable()

    async def _unavailable(self) -> None:
        self.started = self.ended = True
        logger.warning("answering %s with 503: the engine stopped before it finished", self._path)
        message = "the server is shutting down and its engine stopped before this request "
        message += "finished; send it again (to another replica)"
        retry = [(b"retry-after", b"1")]
        await send_error(self._send, 503, message, "ServiceUnavailableError", None, retry)


def _engine_client(app: object) -> object | None:
    return getattr(getattr(app, "state", None), "engine_client", None)


def _stopped(client: object) -> bool:
    try:
        return bool(getattr(client, "errored", False))
    except Exception:  # an engine client half torn down: treat it as stopped
        return True
