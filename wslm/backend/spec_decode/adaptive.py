"""How many tokens a sequence speculates, from how many of its recent proposals were accepted (vLLM's
adaptive speculation, in spirit): a proposal costs a verification row, so where the proposals are mostly
rejected (text that does not repeat the prompt) speculating is slower than plain decoding.

Each sequence keeps decayed counts of accepted and rejected proposals, which estimate the chance a that the
next proposed token is accepted. With k proposals a step yields (1 - a^(k + 1)) / (1 - a) tokens on average
(the run stops at the first rejection) and costs 1 + row_cost * k decode rows' time; the k in 0..K with the
most tokens per unit of cost is used. row_cost is measured: the wall time of a lone sequence's verification
steps against its plain decode steps (`observe`), so where a step of several rows spreads worse over the
cores than a one-row step (or the machine is busy), speculation backs off by what it really costs. k = 0 pauses the sequence's speculation for a few steps (doubling
while its probes keep failing, up to MAX_PAUSE), after which it probes again from a milder estimate."""

from __future__ import annotations

from dataclasses import dataclass

# A verification row's cost beside the step's first row until steps are measured. On CPU, a lone chat's rows
# run in one C call that unpacks each weight block once for all rows (platforms/cpu/decode_rows.py): measured
# 0.2-0.5 of a row on the demo GGUF (docs/benchmarks.md); a GPU's extra rows cost less.
ROW_COST = 0.5
ROW_COST_RANGE = (0.02, 2.0)  # a measured cost is kept within these (one odd step must not stop speculation)
SMOOTH = 0.2  # the weight of a new step's time in the running averages
DECAY = 0.8  # the weight of earlier runs in the counts: about the last five runs matter
PRIOR = (5.0, 0.25)  # (accepted, rejected): a new sequence starts at a = 0.95 (copying runs are long); three failed runs bring it to 0.5
FIRST_PAUSE, MAX_PAUSE = 4, 64  # steps


@dataclass(slots=True)
class _State:
    accepted: float = PRIOR[0]
    rejected: float = PRIOR[1]
    pause: int = 0  # steps left without proposals
    backoff: int = FIRST_PAUSE
    probing: bool = False  # the first run after a pause: a failure pauses again at once


def best_k(a: float, k_max: int, row_cost: float = ROW_COST) -> int:
    """The number of proposals (0..k_max) with the most expected tokens per unit of step cost."""
    best, best_rate = 0, 1.0
    for k in range(1, k_max + 1):
        tokens = k + 1 if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)
        rate = tokens / (1.0 + row_cost * k)
        if rate > best_rate:
            best, best_rate = k, rate
    return best


class AdaptiveK:
    def __init__(self, row_cost: float = ROW_COST) -> None:
        self.row_cost = row_cost
        self._seqs: dict[int, _State] = {}
        self._one: float | None = None  # seconds of a lone sequence's one-row step, smoothed

    def observe(self, rows: int, seconds: float) -> None:
        """A step that decoded one sequence alone: rows = 1 (a plain step) or 1 + its proposals (a verification
        step). The extra rows' cost, against the plain steps' time, becomes row_cost."""
        if rows < 1 or seconds <= 0.0:
            return
        if rows == 1:
            self._one = seconds if self._one is None else (1 - SMOOTH) * self._one + SMOOTH * seconds
            return
        if self._one is None:
            return
        # Averaged from the prior, one step at most doubling what it says: a verification step that met a
        # thread-count try or a page fault must not stop speculation on its own.
        lo, hi = ROW_COST_RANGE
        cost = min(max((seconds / self._one - 1.0) / (rows - 1), lo), hi, 2.0 * self.row_cost + 0.1)
        self.row_cost = (1 - SMOOTH) * self.row_cost + SMOOTH * cost

    def forget(self, live: set[int]) -> None:
        self._seqs = {s: v for s, v in self._seqs.items() if s in live}

    def __len__(self) -> int:
        return len(self._seqs)

    def limit(self, seq_id: int, k_max: int) -> int:
        """How many tokens seq may propose this step (0: none; it is paused or its proposals do not pay)."""
        st = self._seqs.get(seq_id)
        if st is None:
            st = self._seqs[seq_id] = _State()
        if st.pause:
            st.pause -= 1
            if st.pause == 0:  # probe again, from an estimate halfway back to the prior
                st.accepted = (st.accepted + PRIOR[0]) / 2
                st.rejected = (st.rejected + PRIOR[1]) / 2
                st.probing = True
            return 0
        k = best_k(st.accepted / (st.accepted + st.rejected), k_max, self.row_cost)
        if k == 0 and st.probing:  # a probe proposes at least one token: else a cost measured high stays so
            k = 1
        if k == 0:
            st.pause, st.backoff = st.backoff, min(st.backoff * 2, MAX_PAUSE)
        return k

    def record(self, seq_id: int, proposed: int, accepted: int) -> None:
        st = self._seqs.get(seq_id)
        if st is None or proposed <= 0:
            return
        st.accepted = st.accepted * DECAY + accepted
        st.rejected = st.rejected * DECAY + (1 if accepted < proposed else 0)
        if accepted == proposed:
            st.backoff = FIRST_PAUSE  # a full run: the text repeats here
        elif st.probing and accepted == 0:
            st.pause, st.backoff = st.backoff, min(st.backoff * 2, MAX_PAUSE)
        st.probing = False
