"""BlockManager with a sliding window on every layer: blocks behind the window go back to the pool (keeping
their prefix-cache hash), a prefix hit past the window takes back only the blocks inside it, and every
reference is returned exactly once. Pure bookkeeping (no model): the engine-level proof against HF is
tests/test_engine_parity.py::test_sliding_window_models_run_windowed_attention_over_the_whole_context."""

from __future__ import annotations

from wslm.backend.engine.block_manager import NULL_BLOCK, BlockManager, window_blocks
from wslm.backend.sampling_params import SamplingParams
from wslm.backend.sequence import Sequence

BS = 4
WINDOW = 6


def _seq(seq_id: int, tokens: list[int]) -> Sequence:
    return Sequence(seq_id, str(seq_id), 0, list(tokens), SamplingParams(), 0.0)


def _run(bm: BlockManager, seq: Sequence, num_new: int) -> None:
    """What the scheduler and the engine do for one step of seq."""
    assert bm.allocate_slots(seq, num_new)
    seq.num_computed_tokens += num_new
    bm.cache_full_blocks(seq)


def _held(seq: Sequence) -> list[int]:
    return seq.block_table[seq.num_freed_blocks :]


def test_decoding_past_the_window_holds_a_bounded_number_of_blocks():
    bm = BlockManager(16, BS, sliding_window=WINDOW)
    seq = _seq(0, list(range(10)))
    _run(bm, seq, 10)  # prefill: blocks 0..2
    for t in range(30):  # decode 30 tokens: positions 10..39
        seq.output_token_ids.append(100 + t)
        _run(bm, seq, 1)
        # A query at p sees keys p - 5 .. p: at most ceil(6 / 4) + 1 blocks.
        assert len(_held(seq)) <= -(-WINDOW // BS) + 1
    assert len(seq.block_table) == 10  # positions keep their index
    assert seq.block_table[: seq.num_freed_blocks] == [NULL_BLOCK] * seq.num_freed_blocks
    assert bm.num_free_blocks == 16 - len(_held(seq))
    bm.free(seq)
    assert bm.num_free_blocks == 16 and seq.num_freed_blocks == 0
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_prefix_hit_past_the_window_revives_only_the_window():
    bm = BlockManager(16, BS, sliding_window=WINDOW)
    first = _seq(0, list(range(24)))
    for _ in range(3):
        _run(bm, first, 8)  # chunked prefill: early blocks freed as the window moves
    assert first.num_freed_blocks > 0
    bm.free(first)
    second = _seq(1, list(range(24)) + [7, 7, 7, 7])
    hits = bm.get_computed_blocks(second)
    assert len(hits) == 6  # the freed blocks kept their hashes: the whole chain is found
    assert bm.allocate_slots(second, 4, hits)
    # The next query sits at 24 and sees keys 19..: blocks 0..3 stay NULL_BLOCK, blocks 4 and 5 come back.
    assert second.num_freed_blocks == 4 and second.block_table[:4] == [NULL_BLOCK] * 4
    assert second.block_table[4:6] == hits[4:] and [bm.blocks[b].ref_count for b in hits] == [0, 0, 0, 0, 1, 1]
    second.num_computed_tokens = 24 + 4
    registered = dict(bm.hash_to_block)
    bm.cache_full_blocks(second)  # registers the new block 6 only; the NULL_BLOCK entries are left alone
    assert len(bm.hash_to_block) == len(registered) + 1 and registered.items() <= bm.hash_to_block.items()
    bm.free(second)
    assert bm.num_free_blocks == 16 and all(b.ref_count == 0 for b in bm.blocks)


def test_shared_blocks_are_returned_once_per_holder():
    bm = BlockManager(16, BS, sliding_window=WINDOW)
    a = _seq(0, list(range(16)))
    _run(bm, a, 16)
    b = _seq(1, list(range(16)) + [9])
    hits = bm.get_computed_blocks(b)
    assert bm.allocate_slots(b, 1, hits)
    b.num_computed_tokens = 17
    shared = _held(b)[:2]  # b's query at 16 sees keys 11..: a's blocks 2 and 3, now held twice
    assert shared == a.block_table[2:4] and [bm.blocks[i].ref_count for i in shared] == [2, 2]
    for t in range(12):  # a decodes past the window: it lets go of them, b keeps them
        a.output_token_ids.append(50 + t)
        _run(bm, a, 1)
    assert a.num_freed_blocks >= 4 and [bm.blocks[i].ref_count for i in shared] == [1, 1]
    assert not set(shared) & set(bm.free_queue)
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 16 and all(blk.ref_count == 0 for blk in bm.blocks)


def test_window_blocks_bounds_a_step():
    # A 16-token step after a 4096-token window in 16-token blocks: 4095 earlier keys + 16 new = 257 blocks, +1
    # when the window starts mid-block.
    assert window_blocks(4096, 16, 16) == 258
