"""The host side of a paged KV cache (`kernels.kv_pages`): which pages each slot holds.

Policy (no preemption, so a turn never stops for memory once it runs): a turn reserves, before
its prefill, the pages for its whole context plus its token budget (`max_new_tokens`, capped at
max_len); a turn that cannot get them waits, and turns are served in arrival order. When a
turn ends, a paused multi-turn session keeps only the pages of its tokens; a freed slot returns
all of its pages. So the pool holds what the live turns can still use, not slots x max_len.

Where the slots and pages are split over data shards (`kv_pages.data_shards`), slot i takes
pages of its own shard only: decode then reads each slot's cache where the slot lives.

Prefix sharing: a full page holds the K/V of exactly one token prefix (positions attend
causally), so a new sequence whose prompt starts with a live page's prefix maps that page into
its table instead of computing it again: GRPO's n samples of one prompt prefill its full pages
once and hold them once. Pages are reference-counted; a shared page is full and lies before
every position its holders write, so no holder ever writes into it. A page is keyed by (its
shard, the page before it, its tokens): equal keys mean equal prefixes, with no hashing.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


class PageTable:
    """Block table [num_slots, max_len / page_size] of global page ids (`num_pages` = none) and
    one free list per data shard."""

    def __init__(self, num_slots: int, max_len: int, page_size: int, num_pages: int, shards: int = 1):
        if page_size < 1 or max_len % page_size:
            raise ValueError(f"kv_page_size={page_size} must divide max_len={max_len}")
        if num_pages < 1 or num_pages % shards or num_slots % shards:
            raise ValueError(f"kv_pages={num_pages} and num_slots={num_slots} must be positive multiples of the "
                             f"{shards} data shards the cache is split over")
        self.page_size, self.num_pages, self.shards = page_size, num_pages, shards
        self.table = np.full((num_slots, max_len // page_size), num_pages, np.int32)
        self._held = np.zeros(num_slots, np.int64)
        per = num_pages // shards
        self._free = [list(range((g + 1) * per - 1, g * per - 1, -1)) for g in range(shards)]  # pop() -> lowest id
        self._slots_per_shard = num_slots // shards
        self._refs = np.zeros(num_pages, np.int64)  # tables holding each page
        self._index: dict[tuple, int] = {}  # (shard, previous page or -1, its tokens) -> a full, written page
        self._key_of: dict[int, tuple] = {}

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    @property
    def pages_per_shard(self) -> int:
        return self.num_pages // self.shards

    def free_pages(self) -> int:
        return sum(len(f) for f in self._free)

    def held(self, slot: int) -> int:
        return int(self._held[slot])

    def reserve(self, slot: int, tokens: int) -> bool:
        """Makes `slot` hold pages for its first `tokens` positions; False (nothing taken) when
        its shard has too few free pages."""
        need = min(self.pages_for(tokens), self.table.shape[1]) - int(self._held[slot])
        free = self._free[slot // self._slots_per_shard]
        if need <= 0:
            return True
        if need > len(free):
            return False
        start = int(self._held[slot])
        for j in range(start, start + need):
            self.table[slot, j] = page = free.pop()
            self._refs[page] = 1
        self._held[slot] += need
        return True

    def trim(self, slot: int, tokens: int) -> None:
        """Returns the pages of `slot` past its first `tokens` positions."""
        keep = self.pages_for(tokens)
        free = self._free[slot // self._slots_per_shard]
        for j in range(int(self._held[slot]) - 1, keep - 1, -1):
            page = int(self.table[slot, j])
            self.table[slot, j] = self.num_pages
            self._refs[page] -= 1
            if self._refs[page] == 0:  # the last holder: the page and its prefix entry go
                free.append(page)
                key = self._key_of.pop(page, None)
                if key is not None:
                    del self._index[key]
        self._held[slot] = min(int(self._held[slot]), keep)

    def release(self, slot: int) -> None:
        self.trim(slot, 0)

    # ---- prefix sharing --------------------------------------------------------------------------
    def _key(self, slot: int, prev: int, tokens: Sequence[int], j: int) -> tuple:
        return slot // self._slots_per_shard, prev, tuple(tokens[j * self.page_size:(j + 1) * self.page_size])

    def share_prefix(self, slot: int, tokens: Sequence[int]) -> int:
        """Maps the live pages holding a prefix of `tokens` into the empty `slot`'s table;
        returns the positions they cover (a multiple of the page size, below len(tokens): the
        last token is always computed, its logits draw the next one)."""
        assert self._held[slot] == 0, "share_prefix on a slot that holds pages"
        prev, j = -1, 0
        while (j + 1) * self.page_size <= len(tokens) - 1:
            page = self._index.get(self._key(slot, prev, tokens, j))
            if page is None:
                break
            self.table[slot, j] = prev = page
            self._refs[page] += 1
            j += 1
        self._held[slot] = j
        return j * self.page_size

    def publish(self, slot: int, tokens: Sequence[int], written: int) -> None:
        """Offers `slot`'s full pages among its first `written` positions (their K/V written
        for tokens[:written]) for later sequences to share. A page is offered only after the
        page before it in this slot's table, so every holder of an offered page holds the page
        its key names (and that page outlives it)."""
        prev = -1
        for j in range(min(written // self.page_size, int(self._held[slot]))):
            page = int(self.table[slot, j])
            key = self._key(slot, prev, tokens, j)
            owner = self._index.get(key)
            if owner is None and page not in self._key_of:
                self._index[key], self._key_of[page] = page, key
            elif owner != page:
                return  # another page holds this prefix: this slot's later pages chain from its own
            prev = page

    def shareable(self, tokens: Sequence[int], other: Sequence[int]) -> int:
        """Positions of `tokens` a sequence would share with `other` once `other` has written
        them: their common prefix, in full pages, below len(tokens)."""
        n = min(len(tokens) - 1, len(other))
        common = next((i for i in range(n) if tokens[i] != other[i]), n)
        return common // self.page_size * self.page_size
