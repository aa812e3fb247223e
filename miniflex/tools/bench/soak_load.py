"""The soak's clients: concurrent completions over a pool of prompts that share prefixes.

The pool is ``docs x variants`` prompts: each document's prefix, followed by
one of its variants' suffixes, so requests hit whole prompts and shared
prefixes, in vLLM's cache, the CPU tier or on SSD. Which prompt a request
sends is skewed (a few documents are hot, the rest cycle through the tiers).

A client either waits for the whole (non-streamed, greedy) completion, whose
token ids are compared with the reference, or streams it and hangs up after
the first chunk (an abort mid-stream). Standard library only.

Example::

    pool = PromptPool(vocab=2048, docs=8, variants=3, tokens=(256, 768), seed=0)
    load = Load(url, model_id, pool, max_tokens=8)
    ref = load.reference()                       # sequential, one prompt at a time
    outcomes = load.run(200, concurrency=8, abort_fraction=0.2, seed=1)
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

__all__ = ["Load", "Outcome", "PromptPool", "Tally", "mismatches"]


class PromptPool:
    """``docs x variants`` token-id prompts; ``pool[i]`` is prompt ``i``."""

    def __init__(
        self, vocab: int, docs: int, variants: int, tokens: tuple[int, int], seed: int
    ) -> None:
        rng = random.Random(f"soak/{seed}")
        lo, hi = min(100, vocab // 20), vocab - min(100, vocab // 20)
        self.prompts: list[list[int]] = []
        for _ in range(docs):
            n = rng.randrange(tokens[0], tokens[1] + 1)
            prefix = [rng.randrange(lo, hi) for _ in range(n * 3 // 4)]
            for _ in range(variants):
                suffix = [rng.randrange(lo, hi) for _ in range(n - len(prefix))]
                self.prompts.append(prefix + suffix)
        self.docs, self.variants = docs, variants

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, i: int) -> list[int]:
        return self.prompts[i]

    def pick(self, rng: random.Random) -> int:
        """A prompt index: documents by a Zipf-like weight (1/rank), variants uniformly."""
        weights = [1.0 / (d + 1) for d in range(self.docs)]
        doc = rng.choices(range(self.docs), weights)[0]
        return doc * self.variants + rng.randrange(self.variants)

    def tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


@dataclass(frozen=True)
class Outcome:
    """One request: its prompt, whether the client hung up, its output or its error."""

    prompt: int
    aborted: bool
    tokens: tuple[int, ...] | None = None
    error: str | None = None
    seconds: float = 0.0


class Tally:
    """What one :meth:`Load.run` has sent and got back so far, for another thread to watch."""

    def __init__(self) -> None:
        self.sent: list[int] = []  # prompt ids, appended as each request goes out
        self.done: list[Outcome] = []  # appended as each outcome arrives

    def in_flight(self) -> int:
        """Requests sent whose outcome has not arrived."""
        return len(self.sent) - len(self.done)


class Load:
    """Sends requests to one server (``url``, serving ``model``)."""

    def __init__(
        self, url: str, model: str, pool: PromptPool, max_tokens: int, timeout_s: float = 600
    ) -> None:
        self.url, self.model, self.pool = url.rstrip("/"), model, pool
        self.max_tokens, self.timeout_s = max_tokens, timeout_s

    def reference(self) -> dict[int, tuple[int, ...]]:
        """Every prompt's greedy output, one request at a time."""
        out = {}
        for i in range(len(self.pool)):
            done = self._complete(i)
            if done.tokens is None:
                raise RuntimeError(f"reference request {i} failed: {done.error}")
            out[i] = done.tokens
        return out

    def run(
        self,
        n: int,
        concurrency: int,
        abort_fraction: float,
        seed: int,
        stop: threading.Event | None = None,
        tally: Tally | None = None,
    ) -> list[Outcome]:
        """``n`` requests, ``concurrency`` at a time; after ``stop`` is set none is sent.

        Every request sent has an outcome: one that fails in any way (a refused or cut
        connection, a reply cut short, garbage) is an outcome with its ``error``.
        ``tally``, if given, counts them as they go out and come back."""
        rng = random.Random(f"soak-run/{seed}")
        plan = [(self.pool.pick(rng), rng.random() < abort_fraction) for _ in range(n)]
        stop = stop or threading.Event()
        tally = tally or Tally()

        def one(item: tuple[int, bool]) -> Outcome | None:
            if stop.is_set():
                return None
            prompt, abort = item
            tally.sent.append(prompt)
            try:
                out = self._abort(prompt) if abort else self._complete(prompt)
            except Exception as exc:  # never lose a request's outcome to a client bug
                out = Outcome(prompt, abort, error=_describe(exc))
            tally.done.append(out)
            return out

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            results = list(pool.map(one, plan))
        return [r for r in results if r is not None]

    # ---- one request ----
    def _body(self, prompt: int, stream: bool) -> bytes:
        return json.dumps(
            {
                "model": self.model,
                "prompt": self.pool[prompt],
                "max_tokens": self.max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
                "stream": stream,
            }
        ).encode()

    def _request(self, prompt: int, stream: bool) -> urllib.request.Request:
        return urllib.request.Request(
            self.url + "/v1/completions",
            data=self._body(prompt, stream),
            headers={"Content-Type": "application/json"},
        )

    def _complete(self, prompt: int) -> Outcome:
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(self._request(prompt, False), timeout=self.timeout_s) as r:
                body = json.loads(r.read())
            tokens = tuple(int(t) for t in body["choices"][0]["token_ids"])
        except (OSError, http.client.HTTPException, ValueError, KeyError) as exc:
            return Outcome(prompt, False, error=_describe(exc), seconds=time.perf_counter() - t0)
        return Outcome(prompt, False, tokens=tokens, seconds=time.perf_counter() - t0)

    def _abort(self, prompt: int) -> Outcome:
        """Stream the completion and hang up after its first chunk."""
        t0 = time.perf_counter()
        try:
            r = urllib.request.urlopen(self._request(prompt, True), timeout=self.timeout_s)
            try:
                for raw in r:
                    if raw.startswith(b"data:"):
                        break  # the first token arrived: hang up mid-stream
            finally:
                r.close()
        except (OSError, http.client.HTTPException) as exc:
            return Outcome(prompt, True, error=_describe(exc), seconds=time.perf_counter() - t0)
        return Outcome(prompt, True, seconds=time.perf_counter() - t0)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}: {exc.read()[:200]!r}"
    return f"{type(exc).__name__}: {exc}"


def mismatches(outcomes: Sequence[Outcome], reference: dict[int, tuple[int, ...]]) -> int:
    """Completed requests whose output differs from the reference's for the same prompt."""
    return sum(1 for o in outcomes if o.tokens is not None and o.tokens != reference[o.prompt])
