"""The host side of a paged KV cache (`kernels.kv_pages`): which pages each slot holds.

Policy (no preemption, so a turn never stops for memory once it runs): a turn reserves, before
its prefill, the pages for its whole context plus its token budget (`max_new_tokens`, capped at
max_len); a turn that cannot get them waits, and turns are served in arrival order. When a
turn ends, a paused multi-turn session keeps only the pages of its tokens; a freed slot returns
all of its pages. So the pool holds what the live turns can still use, not slots x max_len.

Where the slots and pages are split over data shards (`kv_pages.data_shards`), slot i takes
pages of its own shard only: decode then reads each slot's cache where the slot lives.
"""
from __future__ import annotations

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
            self.table[slot, j] = free.pop()
        self._held[slot] += need
        return True

    def trim(self, slot: int, tokens: int) -> None:
        """Returns the pages of `slot` past its first `tokens` positions."""
        keep = self.pages_for(tokens)
        free = self._free[slot // self._slots_per_shard]
        for j in range(int(self._held[slot]) - 1, keep - 1, -1):
            free.append(int(self.table[slot, j]))
            self.table[slot, j] = self.num_pages
        self._held[slot] = min(int(self._held[slot]), keep)

    def release(self, slot: int) -> None:
        self.trim(slot, 0)
