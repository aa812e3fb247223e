"""What ``miniflex serve``'s middleware (``token_guard.py``, ``shutdown_guard.py``) share: the
ASGI call's types, and an error answered in vLLM's own JSON format::

    await send_error(send, 400, "Token id 9 is out of vocabulary", "BadRequestError", "prompt")

which sends ``{"error": {"message": ..., "type": ..., "param": ..., "code": 400}}``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

__all__ = ["App", "Message", "Receive", "Scope", "Send", "send_error"]

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


async def send_error(
    send: Send,
    status: int,
    message: str,
    kind: str,
    param: str | None = None,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Answer ``status`` with vLLM's error body (``kind``: its ``type``, e.g.
    ``BadRequestError``) and any more ``headers``."""
    error = {"message": message, "type": kind, "param": param, "code": status}
    payload = json.dumps({"error": error}).encode()
    sent = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(payload)),
        *headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": sent})
    await send({"type": "http.response.body", "body": payload})
