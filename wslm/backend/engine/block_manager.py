"""BlockManager: the KV pool's bookkeeping, with automatic prefix caching.

A full block is identified by a hash chain (parent block's hash + its token ids). Freed blocks keep
their hash and sit in an LRU free queue, so a later request with the same prefix can take them back;
a block is only forgotten when the free queue hands it out again.

Sliding window: when every layer attends through the same window of W tokens (Mistral, Phi-3 minis), a
block wholly before the window of a sequence's next query is never read again, so it goes back to the pool
(hash kept, like any freed block) and its table entry becomes NULL_BLOCK; a long chat then holds about
(W + step tokens) / block_size blocks. Models that mix windowed and full layers (Gemma 2/3) share one block
table across layers, and the full layers read every block: nothing is freed for them."""

from __future__ import annotations

from collections import OrderedDict

from wslm.backend.multimodal import block_image_hashes
from wslm.backend.sequence import Sequence

# What a freed table entry holds: any valid block id, since the kernels may load it (masked) when a tile
# straddles the window's start; 0 is also what shorter tables are padded with (step_inputs.py).
NULL_BLOCK = 0


def window_blocks(sliding_window: int, block_size: int, max_step_tokens: int) -> int:
    """The most blocks one sequence holds while the window frees the rest: a step computing up to
    max_step_tokens new tokens needs the window before its first query plus the blocks they land in."""
    return -(-(sliding_window - 1 + max_step_tokens) // block_size) + 1


class Block:
    __slots__ = ("block_id", "ref_count", "block_hash", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: int | None = None
        self.token_ids: tuple[int, ...] | None = None


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, sliding_window: int | None = None
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # Set only when every layer uses this window (see the module doc).
        self.sliding_window = sliding_window
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Insertion order = eviction order: the front is evicted first.
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.prefix_queries = 0  # tokens looked up
        self.prefix_hits = 0  # tokens found

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def usage(self) -> float:
        return 1.0 - len(self.free_queue) / self.num_blocks

    # ---- hashing -------------------------------------------------------------------------------
    def _block_hashes(self, seq: Sequence, num_full_blocks: int) -> list[int]:
        bs = self.block_size
        hashes = seq.block_hashes
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            # The first block's parent is the adapter: two adapters never share KV of the same prompt.
            lora = getattr(seq, "lora_int_id", 0)
            parent = hashes[-1] if hashes else (("lora", lora) if lora else None)
            key = (parent, tuple(seq.tokens_slice(i * bs, (i + 1) * bs)))
            if seq.images:  # the same placeholder ids stand for different pictures: the image's hash decides
                key += block_image_hashes(seq.images, i * bs, (i + 1) * bs)
            hashes.append(hash(key))
        return hashes

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """Blocks of seq's prefix already in the cache. At least one token is always left to compute,
        so that the step produces logits for it."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        num_full = (seq.num_tokens - 1) // bs
        hashes = self._block_hashes(seq, num_full)
        hits: list[int] = []
        for i in range(num_full):
            block_id = self.hash_to_block.get(hashes[i])
            if block_id is None:
                break
            # Hashes can collide; the tokens cannot lie.
            if self.blocks[block_id].token_ids != tuple(seq.tokens_slice(i * bs, (i + 1) * bs)):
                break
            hits.append(block_id)
        self.prefix_queries += seq.num_tokens
        self.prefix_hits += len(hits) * bs
        return hits

    # ---- allocation ----------------------------------------------------------------------------
    def _blocks_before_window(self, first_query_pos: int) -> int:
        """How many leading blocks no query from first_query_pos on can see (it sees keys > pos - W)."""
        if self.sliding_window is None:
            return 0
        return max(0, (first_query_pos - self.sliding_window + 1) // self.block_size)

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] = ()) -> bool:
        """Make room for num_new_tokens after seq's computed (and newly hit) tokens. All or nothing, except
        that blocks the sliding window has left behind are given back first (seq never reads them again)."""
        num_cached = len(computed_blocks) * self.block_size
        start = max(seq.num_computed_tokens, num_cached)
        total = start + num_new_tokens
        needed = -(-total // self.block_size) - len(seq.block_table) - len(computed_blocks)
        skip = self._blocks_before_window(start)
        if seq.block_table:
            self._free_before_window(seq, skip)
            skip = 0
        # A prefix hit past the window takes back only the blocks inside it; the rest stay NULL_BLOCK.
        skip = min(skip, len(computed_blocks))
        reviving = sum(1 for b in computed_blocks[skip:] if self.blocks[b].ref_count == 0)
        if needed > len(self.free_queue) - reviving:
            return False
        seq.block_table.extend([NULL_BLOCK] * skip)
        seq.num_freed_blocks += skip
        for block_id in computed_blocks[skip:]:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_queue[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
        for _ in range(max(needed, 0)):
            seq.block_table.append(self._take_free_block())
        return True

    def _free_before_window(self, seq: Sequence, upto: int) -> None:
        upto = min(upto, len(seq.block_table))
        for i in range(seq.num_freed_blocks, upto):
            self._release(seq.block_table[i])
            seq.block_table[i] = NULL_BLOCK
        seq.num_freed_blocks = max(seq.num_freed_blocks, upto)

    def _take_free_block(self) -> int:
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            if self.hash_to_block.get(block.block_hash) == block_id:
                del self.hash_to_block[block.block_hash]
            block.block_hash = None
            block.token_ids = None
        block.ref_count = 1
        return block_id

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks that the last step filled, so later requests can share them."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        num_full = seq.num_computed_tokens // bs
        hashes = self._block_hashes(seq, num_full)
        for i in range(num_full - 1, seq.num_freed_blocks - 1, -1):
            block = self.blocks[seq.block_table[i]]
            if block.block_hash is not None:
                break  # everything before it is registered already
            block.block_hash = hashes[i]
            block.token_ids = tuple(seq.tokens_slice(i * bs, (i + 1) * bs))
            self.hash_to_block.setdefault(hashes[i], block.block_id)

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_queue[block_id] = None
            if block.block_hash is None:
                self.free_queue.move_to_end(block_id, last=False)  # nothing to keep: reuse first

    def free(self, seq: Sequence) -> None:
        # Reverse order: a sequence's tail blocks are the least likely to be shared, so evict them first.
        for block_id in reversed(seq.block_table[seq.num_freed_blocks :]):
            self._release(block_id)
        seq.block_table = []
        seq.num_freed_blocks = 0

    def fork(self, parent: Sequence, child: Sequence) -> list[tuple[int, int]] | None:
        """Give child parent's KV: full blocks are shared, the partial last block is copied.
        Returns the (src, dst) block copies to perform, or None when no block is free for the copy."""
        bs = self.block_size
        num_full = parent.num_computed_tokens // bs
        partial = parent.num_computed_tokens % bs != 0
        if partial and not self.free_queue:
            return None
        copies: list[tuple[int, int]] = []
        child.block_table.extend(parent.block_table[: parent.num_freed_blocks])  # NULL_BLOCK entries
        child.num_freed_blocks = parent.num_freed_blocks
        for block_id in parent.block_table[parent.num_freed_blocks : num_full]:
            self.blocks[block_id].ref_count += 1
            child.block_table.append(block_id)
        if partial:
            dst = self._take_free_block()
            copies.append((parent.block_table[num_full], dst))
            child.block_table.append(dst)
        child.block_hashes = list(parent.block_hashes[:num_full])
        child.num_computed_tokens = parent.num_computed_tokens
        return copies
