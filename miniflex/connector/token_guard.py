"""A 400, not a dead engine, for prompt token ids outside the model's vocabulary.

vLLM checks prompt token ids against the vocabulary only through its tokenizer.
With ``--skip-tokenizer-init`` (token-id prompts, as the demo and the
benchmarks send) an id past the embedding table reaches the model, and the
engine core dies of an ``IndexError``: every request in flight fails and the
server shuts down. ``miniflex serve`` adds :class:`TokenIdGuard` to vLLM's API
server (``--middleware``): a POST whose JSON body carries token ids below 0 or
at or above the model's vocabulary size is answered ``400`` in vLLM's own
error format, naming the field and the id, and never reaches the engine.

The guard reads the vocabulary size and the tokenizer setting from the app's
state (``vllm_config``, else ``engine_client``) on the first POST. Where the
tokenizer is on, vLLM checks the ids itself and the guard passes every request
through untouched (the body is not parsed twice); where the state has neither,
it passes them through too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

from miniflex.connector.asgi_reply import App, Message, Receive, Scope, Send, send_error

__all__ = ["TOKEN_FIELDS", "TokenIdGuard", "out_of_vocab"]

logger = logging.getLogger("miniflex.serve")

TOKEN_FIELDS = ("prompt", "input", "token_ids", "prompt_token_ids")
"""The request fields that can hold token ids (completions, embeddings and pooling,
the token-in generate API): a list of ids, a list of such lists, or an object with
``prompt_token_ids``."""

_UNKNOWN = -1  # the vocabulary size is not looked up yet
_OFF = 0  # nothing to guard: the tokenizer checks, or the size is not known


def out_of_vocab(body: object, vocab_size: int) -> tuple[str, int] | None:
    """The first ``(field, token id)`` of ``body`` outside ``[0, vocab_size)``, else None."""
    if not isinstance(body, dict):
        return None
    for field in TOKEN_FIELDS:
        for token in _token_ids(body.get(field), depth=2):
            if token < 0 or token >= vocab_size:
                return field, token
    return None


def _token_ids(value: object, depth: int) -> Iterator[int]:
    """The integers of a list of ids or of lists of ids (``depth`` levels at most)."""
    if isinstance(value, dict):
        value = value.get("prompt_token_ids")
    if not isinstance(value, list) or depth == 0:
        return
    for item in value:
        if isinstance(item, int) and not isinstance(item, bool):
            yield item
        elif isinstance(item, (list, dict)):
            yield from _token_ids(item, depth - 1)


class TokenIdGuard:
    """ASGI middleware (vLLM's ``--middleware``): out-of-vocabulary ids get a 400."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.vocab_size = _UNKNOWN

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        if self.vocab_size == _UNKNOWN:
            self.vocab_size = _guarded_vocab(scope.get("app"))
        if self.vocab_size == _OFF:
            return await self.app(scope, receive, send)
        body = await _read_body(receive)
        if body is None:
            return None  # the client hung up before it sent the whole request
        bad = out_of_vocab(_json(body), self.vocab_size)
        if bad is not None:
            return await _bad_request(send, bad, self.vocab_size)
        return await self.app(scope, _replay(body, receive), send)


def _guarded_vocab(app: object) -> int:
    """The model's vocabulary size where the guard must check ids, else ``_OFF``."""
    state = getattr(app, "state", None)
    config = getattr(getattr(state, "vllm_config", None), "model_config", None)
    if config is None:
        config = getattr(getattr(state, "engine_client", None), "model_config", None)
    if config is None:
        logger.warning("token id guard off: vLLM's app state has no model config")
        return _OFF
    if not getattr(config, "skip_tokenizer_init", False):
        return _OFF  # vLLM's tokenizer path checks the ids itself
    return int(config.get_vocab_size())


async def _read_body(receive: Receive) -> bytes | None:
    parts = []
    while True:
        message = await receive()
        if message.get("type") != "http.request":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body read here, then the client's messages."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


def _json(body: bytes) -> object:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None  # not JSON: vLLM answers it


async def _bad_request(send: Send, bad: tuple[str, int], vocab_size: int) -> None:
    field, token = bad
    message = (
        f"Token id {token} is out of vocabulary: this model's token ids are 0 to {vocab_size - 1}"
    )
    await send_error(send, 400, message, "BadRequestError", field)
