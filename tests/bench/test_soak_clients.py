"""The soak's clients against a local HTTP server that misbehaves: every request sent has an
outcome (a reply cut short is an error, not a lost request), and the tally says what is in
flight, which the kill round waits for."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from miniflex.tools.bench.soak_load import Load, PromptPool, Tally


def _handler(behaviour: str, release: threading.Event) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            if behaviour == "hold":
                release.wait(10)
            body = b'{"choices": [{"token_ids": [7, 8]}]}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if behaviour == "truncate":  # promises more than it sends, then hangs up
                self.send_header("Content-Length", str(len(body) + 100))
                self.end_headers()
                self.wfile.write(body[:10])
                self.wfile.flush()
                self.close_connection = True
                return
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextmanager
def _server(behaviour: str, release: threading.Event) -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(behaviour, release))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        release.set()
        srv.shutdown()
        srv.server_close()


def _load(url: str) -> Load:
    pool = PromptPool(vocab=512, docs=2, variants=2, tokens=(8, 12), seed=0)
    return Load(url, "m", pool, max_tokens=2, timeout_s=20)


def test_a_reply_cut_short_is_an_error_outcome_not_a_lost_request() -> None:
    with _server("truncate", threading.Event()) as url:
        tally = Tally()
        out = _load(url).run(6, concurrency=3, abort_fraction=0.0, seed=1, tally=tally)
    assert len(out) == 6 and all(o.error and o.tokens is None for o in out), out
    assert "IncompleteRead" in (out[0].error or "")
    assert len(tally.sent) == 6 and tally.in_flight() == 0


def test_the_tally_counts_requests_in_flight_and_stop_sends_no_more() -> None:
    release, stop = threading.Event(), threading.Event()
    with _server("hold", release) as url:
        tally, got = Tally(), []
        sender = threading.Thread(
            target=lambda: got.extend(_load(url).run(10, 4, 0.0, seed=2, stop=stop, tally=tally))
        )
        sender.start()
        deadline = time.monotonic() + 10
        while tally.in_flight() < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tally.in_flight() == 4 and not tally.done  # four held by the server
        stop.set()
        release.set()
        sender.join(10)
    assert len(got) == 4 and all(o.tokens == (7, 8) for o in got), got
    assert len(tally.sent) == 4 and tally.in_flight() == 0  # the other six were never sent
