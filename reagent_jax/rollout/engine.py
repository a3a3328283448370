"""Continuous-batching rollout engine over a preallocated, sharded KV cache.

    engine = Engine(cfg, params, num_slots=16, max_len=4096, decode_fn=tok.decode)
    outs = engine.generate(prompts, SamplingParams(temperature=0.7, top_p=0.95, max_new_tokens=512))

    sid = engine.start(prompt_ids, sampling, multi_turn=True)    # agent sessions
    r = engine.wait(sid)                  # turn 1 ends on e.g. </tool_call> (stop token / string)
    engine.append(sid, tool_response_ids, then_resume=sampling)  # written at the current length
    r = engine.wait(sid)                  # turn 2; no history is recomputed
    engine.release(sid)

Slots: N sequences live in the cache at once; new sessions take free slots as they appear; a
paused multi-turn session keeps its slot (and its cache) but does not decode, so it never holds
back the others. Each `step()` runs at most one batched prefill call (one chunk of up to
`prefill_chunk` tokens for up to `max_prefill_rows` sequences) and one decode call of up to
`decode_steps` fused steps over all slots.

Threading: submission (`start`, `append`, `release`) is thread-safe and never waits for device
work: it takes a short lock and queues. Device work runs on one driver at a time, either
  * a background thread: `engine.start_background()` (then `wait(sid)` just blocks), or
  * whichever thread calls `step()` / `wait()` / `generate()` (each drives when nobody else does).
Results of single-turn sessions stay available to `wait(sid)` until claimed once (`step()`
called directly returns them and counts as the claim); multi-turn sessions live until
`release(sid)`, even after an error ended them. A session released while its turn runs ends
"cancelled" and is then forgotten like a single-turn one: at its claim or a second release.
"""
from __future__ import annotations

import collections
import itertools
import threading
import time
from typing import Callable, Optional, Sequence, Union

import jax
import numpy as np
from jax.sharding import Mesh

from reagent_jax.models import functional
from reagent_jax.models.config import Qwen3Config
from reagent_jax.parallel.rules import Rules
from reagent_jax.rollout.driver import Driver, EngineError
from reagent_jax.rollout.sampling import SEED_LIMIT, SamplingParams
from reagent_jax.rollout.session import DECODE, DONE, PAUSED, PREFILL, WAITING, Result, Session


class Engine(Driver):
    """See the module docstring. All knobs are keyword arguments:

    num_slots: sequences decoded together (cache rows), over the whole mesh: on several
    processes each process's engine holds num_slots / processes of them (`engine.num_slots`; the
    run's total is `engine.total_slots`). max_len: cache length per slot (prompt + all turns). prefill_chunk: most tokens of one sequence written per prefill call;
    max_prefill_rows: most sequences per prefill call. Compiled shapes come from three bucket
    lists (defaults in brackets): length_buckets, the chunk lengths [32, 128, 512, ... x4 up to
    prefill_chunk]; row_buckets, the prefill row counts [1, 2, 4, ... up to max_prefill_rows];
    window_buckets, attention windows [256, 1024, ... x4 up to max_len]: a kernel attends over
    the smallest window holding every live position, not the whole max_len. At most
    |rows| x |lengths| x |windows| prefill and |windows| decode kernels compile
    (stats()["kernel_shapes"] lists those used). decode_steps: decode steps fused per device
    call (stop tokens and budgets are checked on device; more steps = fewer host round trips;
    the call returns early when a slot frees up and requests are waiting). max_stop_ids: stop
    ids checked on device per row (the host checks all). decode_fn (or tokenizer with .decode):
    token ids -> text, needed for stop strings. seed: draws the seeds of requests without one.
    cache_dtype: KV cache dtype (default the compute dtype).

    Layout (`rollout.layout`): on a mesh the engine reshapes its devices into its own
    (data, tensor) mesh, tensor_parallel ways over heads / MLP / vocabulary (default: the largest
    divisor of the device count that divides the KV heads) and slots over data, and keeps its
    own compute-dtype copy of `params` (also on one device): the caller's arrays may be donated
    or deleted afterwards. rules: the engine's rules table (default `layout.ENGINE_RULES`).
    raise_errors: a failed device call raises `EngineError` to the driving thread (`wait`,
    `step`, `generate`); False (servers) ends only that call's sequences with "error".

    Paged cache (`kernels.kv_pages`, `rollout.pages`): kv_page_size (positions per page; must
    divide max_len and every window bucket) makes the cache a pool of kv_pages pages (default:
    num_slots x max_len / kv_page_size, the contiguous cache's size) shared by the slots. A
    turn reserves the pages of its context + max_new_tokens before it starts and waits when the
    pool is short, so with a smaller pool or more slots memory follows the live turns, not
    slots x max_len. A new sequence whose prompt begins with the full pages of a live one maps
    those pages instead of computing them (GRPO's n samples of a prompt prefill it once:
    stats()["prefix_shared_tokens"]). None (default): one contiguous max_len row per slot.
    """

    def __init__(self, cfg: Qwen3Config, params, *, num_slots: int = 16, max_len: int = 2048,
                 prefill_chunk: int = 512, max_prefill_rows: int = 8,
                 length_buckets: Optional[Sequence[int]] = None, row_buckets: Optional[Sequence[int]] = None,
                 window_buckets: Optional[Sequence[int]] = None, decode_steps: int = 8, max_stop_ids: int = 8,
                 mesh: Optional[Mesh] = None, rules: Optional[Rules] = None,
                 decode_fn: Optional[Callable[[list[int]], str]] = None, tokenizer=None, seed: int = 0,
                 cache_dtype=None, tensor_parallel: Optional[int] = None, raise_errors: bool = True,
                 kv_page_size: Optional[int] = None, kv_pages: Optional[int] = None):
        for name, value, lo in (("num_slots", num_slots, 1), ("max_len", max_len, 2), ("prefill_chunk", prefill_chunk, 1),
                                ("max_prefill_rows", max_prefill_rows, 1), ("decode_steps", decode_steps, 1),
                                ("max_stop_ids", max_stop_ids, 1)):
            if not isinstance(value, int) or value < lo:
                raise ValueError(f"Engine: {name}={value!r} must be an int >= {lo}")
        if decode_fn is None and tokenizer is not None:
            decode_fn = lambda ids: tokenizer.decode(ids)
        super().__init__(cfg, params, num_slots=num_slots, max_len=max_len, prefill_chunk=prefill_chunk,
                         max_prefill_rows=max_prefill_rows, length_buckets=length_buckets, row_buckets=row_buckets,
                         window_buckets=window_buckets, decode_steps=decode_steps, max_stop_ids=max_stop_ids,
                         mesh=mesh, rules=rules, decode_fn=decode_fn, cache_dtype=cache_dtype,
                         tensor_parallel=tensor_parallel, raise_errors=raise_errors,
                         kv_page_size=kv_page_size, kv_pages=kv_pages)
        self._background_error: Optional[EngineError] = None
        self._seeds = np.random.default_rng(seed)
        self._ids = itertools.count()
        self._thread: Optional[threading.Thread] = None
        self._stop_thread = False

    # ---- submission (any thread) -------------------------------------------------------------
    def start(self, prompt_ids: Sequence[int], sampling: Optional[SamplingParams] = None, *,
              multi_turn: bool = False, where: str = "engine.start") -> int:
        """Queues a new sequence; returns its session id. multi_turn keeps its slot after each
        turn (until `release`); otherwise the slot is freed when the turn ends."""
        sampling = self._check_sampling(sampling, where)
        ids = self._check_tokens(prompt_ids, f"{where}: prompt_ids")
        if not ids:
            raise ValueError(f"{where}: empty prompt (prompt_ids has no tokens)")
        if len(ids) > self.max_len - 1:
            raise ValueError(f"{where}: prompt has {len(ids)} tokens but max_len={self.max_len} leaves room for at "
                             f"most {self.max_len - 1} (one slot position is needed to generate)")
        self._check_pages(len(ids), sampling, where)
        with self._lock:
            s = Session(next(self._ids), ids, multi_turn)
            s.begin_turn(sampling, self._seed_for(sampling))
            self._sessions[s.sid] = s
            self._waiting.append(s)
            self._stats["requests"] += 1
            self._cond.notify_all()
        return s.sid

    def append(self, session_id: int, token_ids: Sequence[int], then_resume: Optional[SamplingParams] = None) -> None:
        """Appends tokens (tool output, critique, ...) to a paused multi-turn session. They are
        written into its cache at its current length; with `then_resume` a new turn is drawn
        after them, otherwise they wait for a later append."""
        where = f"engine.append(session {session_id})"
        sampling = None if then_resume is None else self._check_sampling(then_resume, where)
        ids = self._check_tokens(token_ids, f"{where}: token_ids")
        with self._lock:
            s = self._live(session_id, where)
            if not s.multi_turn:
                raise ValueError(f"{where}: the session was started with multi_turn=False")
            if s.state != PAUSED:
                raise ValueError(f"{where}: the session is {s.state}; append after its turn ends (wait for it)")
            if len(s.tokens) + len(ids) > self.max_len - (1 if sampling else 0):
                raise ValueError(f"{where}: {len(s.tokens)} tokens + {len(ids)} appended exceed max_len={self.max_len}"
                                 + (" minus one position to generate" if sampling else ""))
            if sampling is not None:
                self._check_pages(len(s.tokens) + len(ids), sampling, where)
            s.tokens.extend(ids)
            if sampling is not None:
                s.begin_turn(sampling, self._seed_for(sampling))
                s.state = PREFILL
                self._prefill_q.append(s)
                self._cond.notify_all()

    def release(self, session_id: int) -> None:
        """Frees the session's slot. A running turn ends with finish_reason "cancelled"; an
        unclaimed result of a finished session is dropped."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is not None and s.state == DONE:  # incl. one whose release cancelled its turn
                del self._sessions[session_id]
                return
            s = self._live(session_id, f"engine.release(session {session_id})")
            if s.state in (PREFILL, DECODE):
                s.release_pending = True  # the driver ends it after its current device call
                return
            if s.state == WAITING:  # never ran: its (cancelled) result stays for wait()
                self._waiting.remove(s)
                s.release_pending = True  # so that claim forgets it, multi-turn or not
                s.finish_turn("cancelled")
                s.state = DONE
            else:  # paused
                self._free(s)
                del self._sessions[s.sid]
            self._cond.notify_all()

    def tokens(self, session_id: int) -> list[int]:
        """The session's whole token sequence so far (prompt, drawn and appended tokens)."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                raise ValueError(f"engine.tokens: unknown session id {session_id} (never started or released)")
            return list(s.tokens)

    # ---- waiting / driving -------------------------------------------------------------------
    def wait(self, session_id: int, timeout: Optional[float] = None) -> Result:
        """Blocks until the session's current turn ends and returns its Result (drives the
        engine itself when no background thread or other thread is driving)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self._background_error is not None:
                    raise self._background_error
                s = self._sessions.get(session_id)
                if s is None:
                    raise ValueError(f"engine.wait: unknown session id {session_id} (never started, released, "
                                     "or its result was already claimed)")
                if s.state in (PAUSED, DONE):
                    if s.state == DONE and (not s.multi_turn or s.release_pending):  # claimed (and released)
                        del self._sessions[session_id]
                    return s.results[-1]
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"engine.wait: session {session_id} still {s.state} after {timeout}s")
                drive = self._thread is None and self._drive_lock.acquire(blocking=False)
                if not drive:
                    self._cond.wait(timeout=0.05)
                    continue
            try:
                worked = self._step(claim=False)[1]
            finally:
                self._drive_lock.release()
            if not worked:
                with self._lock:
                    self._cond.wait(timeout=0.01)  # e.g. all slots held by paused sessions

    def step(self) -> list[Result]:
        """Runs one scheduling round (admit, one prefill call, one decode call); returns the
        turns that ended in it. For callers that drive the engine themselves."""
        with self._drive_lock:
            return self._step(claim=True)[0]

    def generate(self, prompts: Sequence[Sequence[int]],
                 sampling: Union[SamplingParams, Sequence[SamplingParams], None] = None) -> list[Result]:
        """Blocking helper: one Result per prompt, in order. A bad request gets a Result with
        finish_reason "error" (and .error saying why); the others are served normally."""
        per = list(sampling) if isinstance(sampling, (list, tuple)) else [sampling] * len(prompts)
        if len(per) != len(prompts):
            raise ValueError(f"engine.generate: {len(per)} sampling params for {len(prompts)} prompts")
        sids = []
        for i, (p, sp) in enumerate(zip(prompts, per)):
            try:
                sids.append(self.start(p, sp, where=f"engine.generate: prompts[{i}]"))
            except ValueError as e:
                sids.append(e)
        return [Result(-1, [], [], "error", error=str(x)) if isinstance(x, Exception) else self.wait(x) for x in sids]

    def start_background(self) -> None:
        """Drives the engine from a daemon thread until `stop_background()`."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop_thread, self._background_error = False, None
        self._thread = threading.Thread(target=self.run_forever, name="rollout-engine", daemon=True)
        self._thread.start()

    def run_forever(self) -> None:
        """Drives until `stop_background()`; an EngineError stops it and is raised to every `wait`
        (until the next `start_background()`)."""
        while not self._stop_thread:
            with self._drive_lock:
                try:
                    worked = self._step(claim=False)[1]
                except EngineError as e:
                    with self._lock:
                        self._background_error = e
                        self._cond.notify_all()
                    return
            if not worked:
                with self._lock:
                    self._cond.wait(timeout=0.05)

    def stop_background(self) -> None:
        thread, self._stop_thread = self._thread, True
        with self._lock:
            self._cond.notify_all()
        if thread is not None:
            thread.join()
        self._thread = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop_background()

    # ---- weights and stats -------------------------------------------------------------------
    def update_params(self, params) -> None:
        """Copies in new weights (same structure and shapes; any float dtype: the engine casts to
        the compute dtype and reshards onto its layout in one jitted program, timed in
        stats()["sync_weights_seconds"]); nothing recompiles. Waits for the device call in
        flight; sequences continue with the new weights. The engine never keeps `params`' own
        buffers, so the caller may donate them to the next train step."""
        old = jax.tree_util.tree_structure(self._sync.shardings)
        if jax.tree_util.tree_structure(params) != old:
            raise ValueError("engine.update_params: params tree structure differs from the engine's")
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(params), self._param_shapes):
            if tuple(a.shape) != tuple(b):
                raise ValueError(f"engine.update_params: {jax.tree_util.keystr(path)} has shape {a.shape}, "
                                 f"expected {b}")
        t0 = time.perf_counter()
        placed = jax.block_until_ready(self._sync(params))
        with self._drive_lock:
            self._params = placed
            self._times["sync_weights"] += time.perf_counter() - t0

    def free_weights(self) -> None:
        """Deletes the engine's copy of the weights (e.g. during a train step that needs the
        memory); the next `update_params` makes a new one. Generating meanwhile fails with a
        message saying so."""
        with self._drive_lock:
            params, self._params = self._params, None
        if params is not None:
            for leaf in jax.tree.leaves(params):
                leaf.delete()

    def top_logprobs(self, token_ids: Sequence[int], start: int, k: int,
                     temperature: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """The k most likely tokens at positions start..len-1 of `token_ids`, with their logprobs
        (logprobs [n, k], ids [n, k], best first), from one forward pass with the engine's current
        weights: what OpenAI's `top_logprobs` reports for a finished reply. Same distribution as
        the engine's own logprobs (softmax of logits / T over the whole vocabulary, T = 1 for
        greedy); it runs between the driver's device calls. The length is bucketed to a power of
        two (one compile per bucket); padding goes after the sequence, which causal attention
        never reads."""
        ids = self._check_tokens(token_ids, "top_logprobs")
        if not 0 < start <= len(ids) or not 1 <= k <= self.cfg.vocab_size:
            raise ValueError(f"top_logprobs: need 0 < start={start} <= {len(ids)} tokens and 1 <= k={k} <= vocabulary")
        n = max(16, 1 << (len(ids) - 1).bit_length())
        padded = np.zeros((1, n), np.int32)
        padded[0, :len(ids)] = ids
        greedy = temperature < np.finfo(np.float32).tiny
        with self._drive_lock:
            if self._params is None:
                raise EngineError("the engine's weights were freed (free_weights); update_params first")
            lp, top = functional.top_logprobs(self.cfg, self._params, padded, k=k,
                                              temperature=1.0 if greedy else float(temperature),
                                              mesh=self.mesh, rules=self.rules)
            lp, top = jax.device_get((lp, top))
        return np.asarray(lp[0, start:len(ids)]), np.asarray(top[0, start:len(ids)])

    def stats(self) -> dict:
        """Counters: requests, turns, errors, prefill_tokens (real tokens written by prefill),
        prefill_padded_tokens, prefill_calls, decode_calls, decode_steps, decode_slot_steps,
        decode_tokens (drawn tokens kept), utilisation (= decode_tokens / decode_slot_steps),
        compiles (kernel compilations triggered by this engine), kernel_shapes (the distinct
        shapes this engine ran, e.g. "prefill[4x32,w64]"), seconds spent per kernel, and
        the current number of waiting / prefilling / decoding / paused sessions and free slots;
        with a paged cache also kv_pages, kv_pages_free, page_waits (scheduling rounds in
        which a queued turn waited for pages) and prefix_shared_tokens (prompt positions mapped
        from live pages instead of prefilled)."""
        with self._lock:
            out = dict(self._stats)
            out.update({f"{k}_seconds": v for k, v in self._times.items()})
            out["utilisation"] = self._stats["decode_tokens"] / max(1, self._stats["decode_slot_steps"])
            states = collections.Counter(s.state for s in self._sessions.values())
            out.update({state: states.get(state, 0) for state in (WAITING, PREFILL, DECODE, PAUSED)})
            out["free_slots"] = sum(s is None for s in self._slots)
            if self._pages is not None:
                out["kv_pages"], out["kv_pages_free"] = self._pages.num_pages, self._pages.free_pages()
            out["kernel_shapes"] = sorted(self._shapes)
            return out

    # ---- helpers ------------------------------------------------------------------------------
    def _seed_for(self, sampling: SamplingParams) -> int:
        return int(sampling.seed) if sampling.seed is not None else int(self._seeds.integers(SEED_LIMIT))

    def _check_sampling(self, sampling: Optional[SamplingParams], where: str) -> SamplingParams:
        sampling = SamplingParams() if sampling is None else sampling
        if not isinstance(sampling, SamplingParams):
            raise ValueError(f"{where}: sampling must be a SamplingParams, got {type(sampling).__name__}")
        sampling.validate(self.cfg.vocab_size, where)
        if sampling.stop_strings and self.decode_fn is None:
            raise ValueError(f"{where}: stop_strings need a detokenizer: pass decode_fn= or tokenizer= to Engine")
        return sampling

    def _check_pages(self, context: int, sampling: SamplingParams, where: str) -> None:
        """A turn that needs more pages than its data shard's whole pool would wait forever."""
        if self._pages is None:
            return
        need = self._pages.pages_for(min(self.max_len, context + sampling.max_new_tokens))
        if need > self._pages.pages_per_shard:
            raise ValueError(f"{where}: {context} tokens of context + max_new_tokens={sampling.max_new_tokens} need "
                             f"{need} KV pages of {self._pages.page_size} positions, but the pool holds "
                             f"{self._pages.pages_per_shard} per data shard (raise kv_pages or lower max_new_tokens)")

    def _check_tokens(self, ids, where: str) -> list[int]:
        arr = np.asarray(ids)
        if arr.size == 0:
            return []
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{where}: expected a flat sequence of int token ids, got shape {arr.shape} {arr.dtype}")
        bad = np.flatnonzero((arr < 0) | (arr >= self.cfg.vocab_size))
        if bad.size:
            raise ValueError(f"{where}: token id {int(arr[bad[0]])} at position {int(bad[0])} is outside the "
                             f"vocabulary [0, {self.cfg.vocab_size})")
        return arr.astype(np.int64).tolist()

    def _live(self, session_id: int, where: str) -> Session:
        s = self._sessions.get(session_id)
        if s is None:
            raise ValueError(f"{where}: unknown session id {session_id} (never started, finished or released)")
        if s.release_pending:
            raise ValueError(f"{where}: session {session_id} was released")
        if s.state == DONE:  # a known session that cannot go on: say why, not "unknown"
            last = s.results[-1]
            raise ValueError(f"{where}: session {session_id} has ended (its last turn finished with "
                             f"{last.finish_reason!r}{': ' + last.error if last.error else ''}); it cannot continue"
                             + ("; release it" if s.multi_turn else ""))
        return s
