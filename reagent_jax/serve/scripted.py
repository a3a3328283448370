"""An engine stand-in that replies with scripted texts instead of sampling.

Why: to test an OpenAI client end to end (tool calls, reasoning, stop strings) against the real
server code without a model that happens to write those things, e.g. a tiny random model never
writes a well-formed tool call. `launch/serve.py --scripted_replies=FILE` serves one. Replies are
used in order and cycled; each is tokenized with the real tokenizer and ends like a real turn: at
the first stop string it contains, else after `max_new_tokens` tokens ("length"), else with the
first stop token of the request (e.g. <|im_end|>). The prompts it received are kept in `prompts`.
"""
from __future__ import annotations

import itertools
import threading
import types
from typing import Optional, Sequence

from reagent_jax.rollout import Result, SamplingParams


class ScriptedEngine:
    """Implements the part of `rollout.Engine` that `serve.ModelService` uses."""

    def __init__(self, tokenizer, replies: Sequence[str], *, max_len: int = 4096, vocab_size: Optional[int] = None):
        if not replies:
            raise ValueError("ScriptedEngine: give at least one reply")
        self.tok, self.max_len = tokenizer, max_len
        self.cfg = types.SimpleNamespace(vocab_size=vocab_size or len(tokenizer))
        self._replies = itertools.cycle(list(replies))
        self._results: dict[int, Result] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.prompts: list[list[int]] = []

    def start(self, prompt_ids, sampling: Optional[SamplingParams] = None, *, multi_turn: bool = False,
              where: str = "engine.start") -> int:
        sampling = sampling or SamplingParams()
        ids = list(prompt_ids)
        if not ids or len(ids) > self.max_len - 1:
            raise ValueError(f"{where}: prompt of {len(ids)} tokens does not fit max_len={self.max_len}")
        with self._lock:
            text = next(self._replies)
            sid = next(self._ids)
            self.prompts.append(ids)
        tokens, reason, stop = self._reply_tokens(text, sampling, len(ids))
        with self._lock:
            self._results[sid] = Result(sid, tokens, [0.0] * len(tokens), reason, prompt_len=len(ids), stop=stop)
        return sid

    def _reply_tokens(self, text: str, sampling: SamplingParams, prompt_len: int):
        cut = [(text.find(s) + len(s), s) for s in sampling.stop_strings if s in text]
        end, stop = min(cut) if cut else (len(text), None)
        tokens = self.tok.encode(text[:end], add_special_tokens=False)
        budget = min(sampling.max_new_tokens, self.max_len - prompt_len)
        if len(tokens) >= budget and (stop is None or len(tokens) > budget):
            return tokens[:budget], "length", None
        if stop is not None:
            return tokens, "stop_string", stop
        if sampling.stop_token_ids:
            return tokens + [sampling.stop_token_ids[0]], "stop", sampling.stop_token_ids[0]
        return tokens, "length", None

    def wait(self, session_id: int, timeout: Optional[float] = None) -> Result:
        with self._lock:
            if session_id not in self._results:
                raise ValueError(f"engine.wait: unknown session id {session_id}")
            return self._results.pop(session_id)

    def tokens(self, session_id: int) -> list[int]:
        raise ValueError(f"engine.tokens: session {session_id} is finished")  # replies are ready at once

    def release(self, session_id: int) -> None:
        raise ValueError(f"engine.release: session {session_id} is finished")

    def start_background(self) -> None:
        pass

    def stop_background(self) -> None:
        pass

    def stats(self) -> dict:
        with self._lock:
            return {"requests": len(self.prompts), "scripted": 1}
