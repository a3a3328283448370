"""Host-side state of one sequence (a session) and the rules that end a turn.

A session is a token sequence that owns one cache slot while it lives. Invariant between device
calls: tokens[:cached] are in the slot's KV cache; tokens[cached:] still have to be written
(after a turn this is the one drawn-but-unfed last token, plus whatever was appended). A turn
ends on a stop token ("stop"), a stop string ("stop_string"), its token budget or a full cache
("length"), an error ("error") or a release while running ("cancelled").
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

from reagent_jax.rollout.sampling import SamplingParams

FINISH_REASONS = ("stop", "stop_string", "length", "error", "cancelled")

# Session states.
WAITING = "waiting"  # queued for a free slot
PREFILL = "prefill"  # holds a slot, tokens[cached:] being written
DECODE = "decode"  # drawing tokens
PAUSED = "paused"  # turn finished, slot held (multi-turn), waiting for append / release
DONE = "done"  # finished for good, slot freed


@dataclasses.dataclass
class Result:
    """One finished turn. tokens / logprobs: the tokens drawn in this turn (the stop token
    included) and their logprobs (see `sampling` for the definition)."""
    session_id: int
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str
    turn: int = 0
    prompt_len: int = 0  # tokens of context before this turn's first drawn token
    seed: Optional[int] = None
    stop: Optional[object] = None  # the stop token id or stop string that ended the turn
    error: Optional[str] = None


@dataclasses.dataclass
class Session:
    sid: int
    tokens: list[int]
    multi_turn: bool
    sampling: Optional[SamplingParams] = None
    seed: int = 0
    slot: Optional[int] = None
    cached: int = 0
    state: str = WAITING
    turn: int = -1
    turn_start: int = 0  # index in tokens of this turn's first drawn token
    turn_logprobs: list[float] = dataclasses.field(default_factory=list)
    results: list[Result] = dataclasses.field(default_factory=list)
    claimed: bool = False
    append_pending: bool = False
    release_pending: bool = False

    @property
    def drawn(self) -> int:
        """Tokens drawn in the current turn."""
        return len(self.tokens) - self.turn_start

    def begin_turn(self, sampling: SamplingParams, seed: int) -> None:
        self.sampling, self.seed = sampling, seed
        self.turn += 1
        self.turn_start = len(self.tokens)
        self.turn_logprobs = []

    def finish_turn(self, reason: str, stop=None, error: Optional[str] = None) -> Result:
        res = Result(self.sid, list(self.tokens[self.turn_start:]), list(self.turn_logprobs), reason,
                     turn=self.turn, prompt_len=self.turn_start, seed=self.seed, stop=stop, error=error)
        self.results.append(res)
        return res


def stop_string_window(stop_strings: Sequence[str]) -> int:
    """How many trailing tokens to decode so any stop string that ends in the newest token is
    inside the window. Counted in UTF-8 bytes, not characters: a byte-level BPE may spell one
    character with up to 4 byte tokens (a rare CJK character or emoji), and a token holds at
    least one byte; 2x and the margin cover tokenizers whose tokens are partial characters."""
    return 2 * max(len(s.encode("utf-8", "surrogatepass")) for s in stop_strings) + 4


def turn_end(session: Session, max_len: int, decode_fn: Optional[Callable[[list[int]], str]]):
    """After a token was added: (reason, stop) if the turn ends now, else None. Priority: stop
    token, stop string, budget / full cache. Mirrors the device-side stop rule in `decode`."""
    sp = session.sampling
    tok = session.tokens[-1]
    if tok in sp.stop_token_ids:
        return "stop", tok
    if sp.stop_strings:
        window = session.tokens[max(session.turn_start, len(session.tokens) - stop_string_window(sp.stop_strings)):]
        text = decode_fn(window)
        for s in sp.stop_strings:
            if s in text:
                return "stop_string", s
    if session.drawn >= sp.max_new_tokens or len(session.tokens) >= max_len:
        return "length", None
    return None
