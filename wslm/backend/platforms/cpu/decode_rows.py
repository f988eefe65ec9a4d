"""Several decode rows in a single C call (wslm_decode_rows in cpu_layer_body.h): a speculative verification
step of a lone chat (its last token and K drafts, each row attending up to its own position), or a decode step
of a few chats (each row its own sequence's next token), or both at once.

Without it those rows left the one-sequence C step for the batched decode step (compiled or eager): several
times the C step's cost for a small model, so speculation did not pay on CPU, and a batch of 4 demo chats
made 0.6x the tokens a second of one chat alone. Here each row's arithmetic is the one-row step's op for op
(bit for bit what one-row steps give, so greedy output is the same with and without speculation, and a chat's
tokens do not depend on the chats beside it), and GGUF block weights are read once per step for all rows.
With several threads (chosen as the one-row step chooses its own, tuning.StepThreads: what recent steps
measured faster) the step runs as one team, as the one-row step does: the products split by weight rows,
attention by (row, key/value head), the rest by row, each row's bits as one thread leaves them."""

from __future__ import annotations

import ctypes
import time

import torch

from wslm.backend.modeling.layers.attention import AttentionMetadata
from wslm.backend.platforms.cpu.tuning import StepThreads, torch_threads
from wslm.backend.quant.kernel import weight_kernel
from wslm.kernels.torch_rotary import _cos_sin

MAX_ROWS = 15  # the head kernel takes 16 rows and more to its tiled GEMM, which rounds otherwise


def decode_rows(positions: list[int], meta: AttentionMetadata) -> bool:
    """Whether every row is one new token attending up to its own position (a decode row: of one sequence's
    verification run or of a batch), rather than a chunk of a prompt."""
    m = len(positions)
    if meta.cu_seqlens_q is not None and meta.cu_seqlens_q.tolist() != list(range(m + 1)):
        return False
    return meta.seq_lens.tolist() == [p + 1 for p in positions]


def _head_rows_exact(head) -> bool:
    """Whether the head's product over several rows gives each row the bits of its one-row product. The GGUF
    blocks and wslm's int4 kernels do (their many-row loops keep each row's integer sums and float updates in
    the one-row order). A dense head does not (torch's GEMM sums in another order than its GEMV), nor the
    int8 kernel on AVX512-BF16 CPUs (several rows take bf16 pair products), nor torch's int4 kernel: those
    heads run row by row, which reads the head once a row but keeps speculation's greedy output exact."""
    k = weight_kernel(getattr(head, "weight", None))
    return not isinstance(k, str) and k.c_kernel and k.layout in ("gguf", "int4")


@torch.inference_mode()
def run_rows(native, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
             ) -> torch.Tensor | None:
    """native: a decode_native.NativeDecode. The logits [M, vocab] of M decode rows (decode_rows), or None when
    the step is not that or has more rows than the C step takes (the other back ends take it)."""
    m = input_ids.shape[0]
    if not 1 < m <= MAX_ROWS or meta.block_tables.dtype != torch.int32 or meta.block_tables.shape[0] != m:
        return None
    if native.has_moe:  # the C rows step does not take experts
        return None
    pos = positions.tolist()
    if not decode_rows(pos, meta):
        return None
    slots = meta.slot_mapping.to(torch.int64).contiguous()
    if bool((slots < 0).any()):
        return None
    model = native.model
    hidden = model.embed(input_ids).to(native.dtype).contiguous().clone()
    residual = torch.empty_like(hidden)
    cos2, sin2 = (t.reshape(m, -1).contiguous() for t in _cos_sin(positions, native.table, native.dtype, True)[2:])
    tables = meta.block_tables.contiguous()  # [M, width]: row m's sequence's blocks
    lens = meta.seq_lens.to(torch.int64).contiguous()
    heads, kv_heads, head_dim = native.dims
    chooser = getattr(native, "row_threads", None)
    if chooser is None:
        chooser = native.row_threads = StepThreads()  # its own: a step of M rows is another load than one row's
    most = torch.get_num_threads()
    threads = min(native.fixed_threads, most) if native.fixed_threads else chooser.pick(most)
    start = time.perf_counter()
    rc = native.rows_fn(
        ctypes.addressof(native.layers), len(native.layers), hidden.shape[-1], heads, kv_heads, head_dim,
        hidden.data_ptr(), residual.data_ptr(), cos2.data_ptr(), sin2.data_ptr(), tables.data_ptr(),
        tables.shape[1], native.block_size, lens.data_ptr(), slots.data_ptr(), m, threads,
    )  # fmt: skip
    if rc == -1:
        raise MemoryError("wslm_decode_rows: out of memory for a verification step's buffers")
    if rc != 0:
        raise RuntimeError(f"wslm_decode_rows failed ({rc})")
    with torch_threads(threads):
        normed = model.norm(hidden + residual)
        if _head_rows_exact(model.lm_head):
            logits = model.compute_logits(normed)
        else:
            logits = torch.cat([model.compute_logits(row) for row in normed.split(1)])
    if not native.fixed_threads:
        # Steps of 2..K+1 rows share one record: scaled to a two-row step's work (an extra row costs ~0.3-0.5 of
        # the first), so a try that happened to meet shorter steps does not look slower per row than it is.
        chooser.record(threads, (time.perf_counter() - start) * 3.0 / (m + 1))
    native.steps += 1
    return logits
