"""The engine's driver half: one scheduling round of device work (admit waiting sessions, one
batched prefill call, one fused decode call over all slots) and the bookkeeping of their results.

One thread drives at a time (it holds `_drive_lock`). It takes the submission lock `_lock` only
to read the queues and to apply results, never while a kernel runs, so `start` / `append` /
`release` from other threads are not held up by device work.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, SingleDeviceSharding

from reagent_jax.kernels import attention, kv_pages
from reagent_jax.models.config import Qwen3Config
from reagent_jax.parallel.rules import Rules
from reagent_jax.rollout import kernels
from reagent_jax.rollout.layout import ENGINE_RULES, WeightSync, engine_meshes, slots_per_process
from reagent_jax.rollout.batches import decode_state, decode_window, needs_truncation, prefill_batch
from reagent_jax.rollout.pages import PageTable
from reagent_jax.rollout.session import DECODE, DONE, PAUSED, PREFILL, Result, Session, turn_end


class EngineError(RuntimeError):
    """A device call of the engine failed (not one bad request): raised to whoever drives the
    engine, unless it was built with raise_errors=False (servers), where the sequences of that
    call end with finish_reason "error" instead."""


class Driver:
    """Slots, queues, the KV cache and the params; `_step` runs one round. Subclassed by Engine,
    which adds the thread-safe submission API."""

    def __init__(self, cfg: Qwen3Config, params, *, num_slots: int, max_len: int, prefill_chunk: int,
                 max_prefill_rows: int, length_buckets: Optional[Sequence[int]], row_buckets: Optional[Sequence[int]],
                 window_buckets: Optional[Sequence[int]], decode_steps: int, max_stop_ids: int,
                 mesh: Optional[Mesh], rules: Optional[Rules] = None,
                 decode_fn: Optional[Callable[[list[int]], str]] = None, cache_dtype=None,
                 tensor_parallel: Optional[int] = None, raise_errors: bool = True,
                 kv_page_size: Optional[int] = None, kv_pages: Optional[int] = None):
        self.mesh, spanning = engine_meshes(mesh, cfg, tensor_parallel)  # this process's devices
        self.total_slots = num_slots  # over every process of `mesh`; this engine holds its share
        num_slots = slots_per_process(num_slots, mesh)
        self.cfg = cfg
        self.rules = ENGINE_RULES if rules is None else rules
        self.raise_errors = raise_errors
        self.num_slots, self.max_len, self.prefill_chunk = num_slots, max_len, prefill_chunk
        self.max_prefill_rows = min(max_prefill_rows, num_slots)
        self.length_buckets = tuple(sorted(length_buckets or kernels.geometric_buckets(32, prefill_chunk, 4)))
        self.row_buckets = tuple(sorted(row_buckets or kernels.geometric_buckets(1, self.max_prefill_rows, 2)))
        if self.length_buckets[-1] < prefill_chunk or self.row_buckets[-1] < self.max_prefill_rows:
            raise ValueError(f"Engine: largest length bucket {self.length_buckets[-1]} must be >= prefill_chunk="
                             f"{prefill_chunk} and largest row bucket {self.row_buckets[-1]} >= max_prefill_rows="
                             f"{self.max_prefill_rows}")
        windows = window_buckets or kernels.geometric_buckets(256, max_len, 4)
        self.window_buckets = tuple(sorted({min(w, max_len) for w in windows} | {max_len}))
        # A ragged decode kernel reads each slot up to its own length: decode over the whole cache
        # (one program, no window copied out and back); prefill keeps the window buckets.
        ragged = attention.choose_decode(cfg.attention, self.mesh) == "ragged"
        self.decode_windows = (max_len,) if ragged else self.window_buckets
        self.decode_steps, self.max_stop_ids = decode_steps, max_stop_ids
        self.decode_fn = decode_fn
        self._sync = WeightSync(cfg, self.mesh, params, self.rules, spanning)
        self._param_shapes = [tuple(x.shape) for x in jax.tree.leaves(params)]
        self._params = self._sync(params)
        self._cache_dtype = cache_dtype
        self._pages = self._page_table(kv_page_size, kv_pages)
        self._cache = self._new_cache()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._drive_lock = threading.Lock()
        self._sessions: dict[int, Session] = {}
        self._slots: list[Optional[Session]] = [None] * num_slots
        self._waiting: collections.deque[Session] = collections.deque()
        self._prefill_q: list[Session] = []
        self._stats = collections.Counter()
        self._times = collections.Counter()
        self._shapes: set[str] = set()
        self._last_error = ""
        self._call_error: Optional[BaseException] = None

    def _step(self, claim: bool) -> tuple[list[Result], bool]:
        """One round; returns (turns that ended, whether any device work ran). With claim, the
        results of finished single-turn sessions are handed over (not kept for wait())."""
        events: list[Result] = []
        with self._lock:
            ready = self._reserve_prefills()
            if ready == len(self._prefill_q):  # nobody waits for pages: new sessions may take some
                self._admit()
                ready = len(self._prefill_q)
            rows = self._prefill_q[: min(ready, self.max_prefill_rows)]
            if not ready and self._prefill_q and self._pages is not None and self._nothing_runs():
                # the head waits for pages that only queued turns hold: run those that can, out of order
                rows = [s for s in self._prefill_q if self._pages.reserve(s.slot, self._turn_tokens(s))]
                rows = rows[: self.max_prefill_rows]
                if not rows:
                    events += self._fail_deadlocked()
        worked = bool(rows)
        if rows:
            events += self._prefill(rows)
            if self._pages is not None:
                with self._lock:  # sequences waiting on the pages just written map them now, while they live
                    if self._reserve_prefills() == len(self._prefill_q):
                        self._admit()
        with self._lock:
            slots = [s if s is not None and s.state == DECODE and not s.release_pending else None for s in self._slots]
        if any(s is not None for s in slots):
            worked = True
            events += self._decode(slots)
        with self._lock:
            for s in list(self._sessions.values()):
                if s.release_pending and s.state in (PREFILL, DECODE):
                    events.append(self._end_turn(s, "cancelled"))
            self._prefill_q = [s for s in self._prefill_q if s.state == PREFILL]
            if claim:
                for r in events:
                    s = self._sessions.get(r.session_id)
                    if s is not None and s.state == DONE and (not s.multi_turn or s.release_pending):
                        del self._sessions[s.sid]
            if events:
                self._cond.notify_all()
        if self._call_error is not None:
            cause, self._call_error = self._call_error, None
            raise EngineError(f"{self._last_error} (the sequences of that call ended with finish_reason \"error\"; "
                              "build the engine with raise_errors=False to keep serving the others)") from cause
        return events, worked

    def _admit(self) -> None:
        short = None  # the waiting turn that found no pages
        for i in range(self.num_slots):
            if self._slots[i] is None and self._waiting:
                shared = 0
                if self._pages is not None:
                    if self._prefix_pending(self._waiting[0]):
                        break  # a prefilling sequence is writing pages this one will share: next round
                    shared = self._pages.share_prefix(i, self._waiting[0].tokens)
                    if not self._pages.reserve(i, self._turn_tokens(self._waiting[0])):
                        self._pages.release(i)
                        short = self._waiting[0]
                        continue  # this slot's data shard is short of pages; another shard may have some
                s = self._waiting.popleft()
                s.slot, s.state, s.cached = i, PREFILL, shared
                if self._pages is not None:
                    self._stats["prefix_shared_tokens"] += shared
                self._slots[i] = s
                self._prefill_q.append(s)
        if short is not None and self._waiting and self._waiting[0] is short:
            self._stats["page_waits"] += 1  # a free slot, but not the pages for the next turn

    # ---- a paged cache (`rollout.pages`) -------------------------------------------------------
    def _page_table(self, page_size: Optional[int], num_pages: Optional[int]) -> Optional[PageTable]:
        if page_size is None:
            if num_pages is not None:
                raise ValueError("Engine: kv_pages needs kv_page_size (the cache is contiguous without it)")
            return None
        bad = [w for w in self.window_buckets if w % page_size]
        if bad:
            raise ValueError(f"Engine: kv_page_size={page_size} must divide every attention window bucket; "
                             f"{bad} are not multiples of it (pass window_buckets= or another page size)")
        num_pages = self.num_slots * self.max_len // page_size if num_pages is None else num_pages
        shards = kv_pages.data_shards(self.mesh, self.rules, self.num_slots, num_pages)
        return PageTable(self.num_slots, self.max_len, page_size, num_pages, shards)

    def _prefix_pending(self, s: Session) -> bool:
        """Whether a sequence now in prefill will write full pages of `s`'s prompt that it has
        not written yet (GRPO's n samples of one prompt arrive together: the first computes the
        prompt's pages, the others wait one round and share them)."""
        return any(self._pages.shareable(s.tokens, p.tokens) > p.cached for p in self._prefill_q)

    def _turn_tokens(self, s: Session) -> int:
        """Positions a turn may fill: its context plus what is left of its budget."""
        return min(self.max_len, len(s.tokens) + max(0, s.sampling.max_new_tokens - s.drawn))

    def _nothing_runs(self) -> bool:
        """No turn decodes and none is paused (whose caller could release its pages)."""
        return not any(s.state in (DECODE, PAUSED) for s in self._sessions.values())

    def _fail_deadlocked(self) -> list[Result]:
        """Every queued turn waits for pages that only queued turns hold: none can ever run. They
        end with an error naming the fix (and it is raised, unless raise_errors=False)."""
        self._last_error = (f"KV page pool exhausted: {len(self._prefill_q)} turn(s) wait for pages that only "
                            f"they hold ({self._pages.free_pages()} of {self._pages.num_pages} free); raise "
                            "kv_pages (rollout.kv_pages) or lower max_new_tokens")
        if self.raise_errors:
            self._call_error = RuntimeError(self._last_error)
        return self._fail(list(self._prefill_q))

    def _reserve_prefills(self) -> int:
        """Reserves the pages of queued prefills in order; how many of them have theirs (all of
        them without a paged cache)."""
        if self._pages is None:
            return len(self._prefill_q)
        for n, s in enumerate(self._prefill_q):
            if not self._pages.reserve(s.slot, self._turn_tokens(s)):
                self._stats["page_waits"] += 1
                return n
        return len(self._prefill_q)

    def _prefill(self, rows: list[Session]) -> list[Result]:
        with self._lock:
            try:
                kw, lens, completes = prefill_batch(rows, self.prefill_chunk, self.length_buckets, self.row_buckets,
                                                    self.window_buckets, self.max_len, self.num_slots)
            except Exception as e:  # a request the packer cannot encode fails alone, the engine keeps serving
                self._last_error = f"prefill packing failed: {e!r}"
                return self._fail(rows)
        out = self._call("prefill", kernels.prefill, **kw)
        events = []
        with self._lock:
            if out is None:
                return self._fail(rows)
            tok, lp = out
            self._stats["prefill_calls"] += 1
            self._stats["prefill_tokens"] += sum(lens)
            self._stats["prefill_padded_tokens"] += kw["tokens"].size
            for s, n, done, t, l in zip(rows, lens, completes, tok, lp):
                s.cached += n
                if self._pages is not None:
                    self._pages.publish(s.slot, s.tokens, s.cached)
                if done:
                    s.tokens.append(int(t))
                    s.turn_logprobs.append(float(l))
                    s.state = DECODE
                    events += self._after_token(s)
            self._prefill_q = [s for s in self._prefill_q if s.state == PREFILL]
        return events

    def _decode(self, slots: list[Optional[Session]]) -> list[Result]:
        live = [s for s in slots if s is not None]
        with self._lock:
            try:
                state = decode_state(slots, self.max_stop_ids, exit_on_done=bool(self._waiting))
                window = decode_window(slots, self.decode_steps, self.decode_windows, self.max_len)
            except Exception as e:
                self._last_error = f"decode packing failed: {e!r}"
                return self._fail(live)
        out = self._call("decode", kernels.decode, state=state, num_steps=self.decode_steps, window=window,
                         truncation=needs_truncation(slots))
        events = []
        with self._lock:
            if out is None:
                return self._fail(live)
            out_tok, out_lp = out
            steps = int((out_tok >= 0).any(axis=1).sum())
            self._stats["decode_calls"] += 1
            self._stats["decode_steps"] += steps
            self._stats["decode_slot_steps"] += steps * self.num_slots
            for i, s in enumerate(slots):
                if s is None:
                    continue
                for j in range(steps):
                    if out_tok[j, i] < 0:  # the device stopped this slot, the host did not
                        events.append(self._end_turn(s, "error", error=f"internal: slot {i} stopped on device "
                                                     "without a host-side reason"))
                        break
                    s.cached += 1  # the previously drawn token was written by this step
                    s.tokens.append(int(out_tok[j, i]))
                    s.turn_logprobs.append(float(out_lp[j, i]))
                    self._stats["decode_tokens"] += 1
                    ended = self._after_token(s)
                    if ended:
                        events += ended
                        break
        return events

    def _after_token(self, s: Session) -> list[Result]:
        try:
            end = turn_end(s, self.max_len, self.decode_fn)
        except Exception as e:  # a failing decode_fn ends this session only
            return [self._end_turn(s, "error", error=f"decode_fn failed: {e!r}")]
        return [] if end is None else [self._end_turn(s, end[0], stop=end[1])]

    def _end_turn(self, s: Session, reason: str, stop=None, error: Optional[str] = None) -> Result:
        res = s.finish_turn(reason, stop, error)
        s.cached = min(s.cached, len(s.tokens) - 1)
        self._stats["turns"] += 1
        self._stats["errors"] += reason == "error"
        if s.multi_turn and reason not in ("error", "cancelled") and not s.release_pending:
            s.state = PAUSED
            if self._pages is not None:  # the turn's unused budget goes back to the pool
                self._pages.trim(s.slot, len(s.tokens))
        else:
            s.state = DONE
            self._free(s)
        return res

    def _free(self, s: Session) -> None:
        if s.slot is not None and self._slots[s.slot] is s:
            self._slots[s.slot] = None
            if self._pages is not None:
                self._pages.release(s.slot)
        s.slot = None

    def _call(self, name: str, fn, **kw):
        """Runs a kernel on the driver thread; counts compiles and time; None on failure."""
        before = fn._cache_size()
        arrays = [kw[k] for k in ("tokens", "state") if k in kw]
        self._shapes.add(f"{name}[{'x'.join(map(str, np.shape(jax.tree.leaves(arrays)[0])))},w{kw['window']}"
                         + (",truncation]" if kw.get("truncation") else "]"))
        t0 = time.perf_counter()
        if self._params is None:
            self._last_error = (f"{name}: the engine's weights were freed (engine.free_weights()); hand it weights "
                                "with engine.update_params(params) before generating")
            self._call_error = RuntimeError(self._last_error)
            return None
        if self._pages is not None:
            kw["pages"] = self._pages.table.copy()  # the host's table changes while the call runs
        try:
            cache, *outs = fn(self.cfg, self._params, self._cache, mesh=self.mesh, rules=self.rules, **kw)
            outs = [np.asarray(o) for o in outs]
        except Exception as e:  # only the sequences of this call fail; raised after the round (raise_errors)
            self._last_error = f"{name} kernel failed: {e!r}"
            if self.raise_errors:
                self._call_error = e
            return None
        finally:
            self._stats["compiles"] += fn._cache_size() - before
        self._cache = cache
        self._times[name] += time.perf_counter() - t0
        return outs

    def _fail(self, sessions: list[Session]) -> list[Result]:
        """Ends the given sessions with "error". If the donated cache was lost, every session
        holding a slot loses its history too and the cache is rebuilt."""
        msg = self._last_error
        victims = list(sessions)
        if any(c.is_deleted() for c in self._cache):
            victims += [s for s in self._slots if s is not None and s not in victims]
            self._cache = self._new_cache()
        events = []
        for s in victims:
            if s.state in (PREFILL, DECODE):
                events.append(self._end_turn(s, "error", error=msg))
            elif s.state == PAUSED:  # its cache is gone: the session cannot continue
                events.append(s.finish_turn("error", error=msg))
                s.state = DONE
                self._free(s)
        self._prefill_q = [s for s in self._prefill_q if s.state == PREFILL]
        return events

    def _new_cache(self):
        rows, length = ((self.num_slots, self.max_len) if self._pages is None
                        else (self._pages.num_pages, self._pages.page_size))
        cache = kernels.init_cache(self.cfg, rows, length, self.mesh, self.rules, self._cache_dtype)
        return cache if self.mesh is not None else jax.device_put(cache, SingleDeviceSharding(jax.local_devices()[0]))
