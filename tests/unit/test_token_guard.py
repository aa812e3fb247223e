"""The token id guard of ``miniflex serve``, driven as ASGI (the app behind it records)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from miniflex.connector.token_guard import TokenIdGuard, out_of_vocab
from miniflex.tools.serve import TOKEN_GUARD, build_serve_argv

VOCAB = 100


class App:
    """The server behind the guard: records what reached it, answers 200."""

    def __init__(self, skip_tokenizer: bool = True, with_config: bool = True) -> None:
        config = SimpleNamespace(skip_tokenizer_init=skip_tokenizer, get_vocab_size=lambda: VOCAB)
        state = SimpleNamespace(vllm_config=SimpleNamespace(model_config=config))
        self.state = state if with_config else SimpleNamespace()
        self.bodies: list[bytes] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def post(app: App, body: bytes, parts: int = 1, method: str = "POST") -> tuple[int, bytes]:
    """One request through the guard; the body arrives in ``parts`` messages."""
    guard = TokenIdGuard(app)
    step = max(1, -(-len(body) // parts))
    chunks = [body[i : i + step] for i in range(0, len(body), step)] or [b""]
    messages = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": "/v1/completions", "app": app}
    asyncio.run(guard(scope, receive, send))
    status = sent[0]["status"]
    return status, b"".join(m.get("body", b"") for m in sent[1:])


def completion(prompt: object, **more: object) -> bytes:
    return json.dumps({"model": "m", "prompt": prompt, "max_tokens": 1, **more}).encode()


@pytest.mark.parametrize(
    ("prompt", "bad"),
    [
        ([1, 2, VOCAB], VOCAB),
        ([-1, 5], -1),
        ([[1, 2], [3, VOCAB + 7]], VOCAB + 7),
        ({"prompt_token_ids": [0, 10**12]}, 10**12),
    ],
)
def test_an_id_outside_the_vocabulary_is_a_400_that_never_reaches_vllm(
    prompt: object, bad: int
) -> None:
    app = App()
    status, body = post(app, completion(prompt), parts=3)
    assert status == 400
    error = json.loads(body)["error"]
    assert error["code"] == 400 and error["param"] == "prompt"
    assert f"Token id {bad} is out of vocabulary" in error["message"]
    assert f"0 to {VOCAB - 1}" in error["message"]
    assert app.bodies == []


def test_ids_inside_the_vocabulary_reach_vllm_byte_for_byte() -> None:
    app = App()
    body = completion([[0, 1], [VOCAB - 1]], temperature=0)
    assert post(app, body, parts=4) == (200, b"ok")
    assert app.bodies == [body]


def test_other_fields_and_text_prompts_pass() -> None:
    app = App()
    for body in (
        completion("a text prompt"),
        json.dumps({"input": [3, 4]}).encode(),
        b"not json at all",
        json.dumps([1, 2, VOCAB]).encode(),  # not an object: vLLM answers it
        completion([True, 3]),  # a bool is not an id here; vLLM's schema refuses it
    ):
        assert post(app, body)[0] == 200
    assert len(app.bodies) == 5
    assert post(app, json.dumps({"input": [VOCAB]}).encode())[0] == 400
    assert post(app, json.dumps({"token_ids": [VOCAB]}).encode())[0] == 400


def test_with_the_tokenizer_on_or_no_config_everything_passes() -> None:
    for app in (App(skip_tokenizer=False), App(with_config=False)):
        assert post(app, completion([VOCAB])) == (200, b"ok")
        assert app.bodies == [completion([VOCAB])]


def test_get_requests_pass_unread() -> None:
    app = App()
    assert post(app, b"", method="GET") == (200, b"ok")


def test_a_client_that_hangs_up_mid_body_reaches_nothing() -> None:
    app = App()
    guard = TokenIdGuard(app)
    messages = [{"type": "http.request", "body": b'{"prompt": [', "more_body": True}]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "app": app}
    asyncio.run(guard(scope, receive, send))
    assert sent == [] and app.bodies == []


def test_out_of_vocab_depth_is_bounded() -> None:
    deep: object = [VOCAB]
    for _ in range(50):
        deep = [deep]
    assert out_of_vocab({"prompt": deep}, VOCAB) is None  # vLLM's schema refuses it
    assert out_of_vocab({"prompt": [[VOCAB]]}, VOCAB) == ("prompt", VOCAB)


def test_miniflex_serve_adds_the_guard() -> None:
    argv = build_serve_argv(["/m"], {})
    i = argv.index("--middleware")
    assert argv[i + 1] == TOKEN_GUARD
