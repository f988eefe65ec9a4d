"""bench/fidelity.py's pure parts: the windows, the perplexity / top-1 / KL math, and its text (no engines)."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import fidelity  # noqa: E402


@pytest.mark.parametrize("n,window,stride", [(10, 4, 2), (2, 4, 1), (4, 4, 3), (1000, 512, 256), (513, 512, 256),
                                             (7, 3, 1), (100, 8, 7)])  # fmt: skip
def test_windows_score_every_target_once_within_the_window(n, window, stride):
    spans = fidelity.windows(n, window, stride)
    scored = [t for _, end, first in spans for t in range(first, end)]
    assert scored == list(range(1, n))  # every target once, in order
    for start, end, first in spans:
        assert 0 <= start < first <= end <= n and end - start <= window
        assert first - start - 1 >= 0  # the position that predicts the first target is in the window
    assert fidelity.windows(1, window, stride) == []


def test_windows_reject_bad_sizes():
    with pytest.raises(ValueError, match="stride"):
        fidelity.windows(10, 4, 4)
    with pytest.raises(ValueError, match="window"):
        fidelity.windows(10, 1, 1)


def test_scores_perplexity_top1_and_kl():
    ref = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]]))
    x = np.log(np.array([[0.25, 0.5, 0.25], [0.1, 0.2, 0.7]]))
    targets = np.array([0, 2])
    s = fidelity.Scores()
    s.add(x, targets, ref)
    r = s.result()
    assert r["positions"] == 2
    assert r["ppl"] == pytest.approx(np.exp(-(np.log(0.25) + np.log(0.7)) / 2))
    assert r["top1"] == 0.5  # row 0's argmax differs, row 1's agrees
    kl0 = 0.5 * np.log(0.5 / 0.25) + 0.25 * np.log(0.25 / 0.5)  # row 1 is identical: 0
    assert r["kl"] == pytest.approx(kl0 / 2)
    same = fidelity.Scores()
    same.add(ref, targets, ref)
    assert same.result()["kl"] == pytest.approx(0.0, abs=1e-12) and same.result()["top1"] == 1.0


def test_log_softmax_and_score_windows_against_a_reference(tmp_path):
    rng = np.random.default_rng(0)
    vocab, tokens = 7, list(rng.integers(0, 7, size=23))
    lp = fidelity.log_softmax(rng.normal(size=(5, vocab)) * 30)  # large logits: no overflow
    assert np.allclose(np.exp(lp).sum(-1), 1.0) and np.isfinite(lp).all()
    table = rng.normal(size=(len(tokens), vocab)).astype(np.float32)  # logits by absolute position

    def logits_for(spans):
        state = iter(spans)

        def window_logits(ids):
            start, end, _ = next(state)
            assert ids == tokens[start:end]
            return table[start : end - 1]  # the rows for positions start..end-2, as an engine gives them

        return window_logits

    spans = fidelity.windows(len(tokens), 6, 4)
    ref_rows = np.concatenate([fidelity.log_softmax(table[first - 1 : end - 1]) for _, end, first in spans])
    np.save(tmp_path / "ref.npy", ref_rows.astype(np.float32))
    r = fidelity.score_windows(spans, tokens, logits_for(spans), tmp_path / "ref.npy", vocab)
    assert r["positions"] == len(tokens) - 1 and r["top1"] == 1.0 and r["kl"] == pytest.approx(0.0, abs=1e-6)
    direct = fidelity.log_softmax(table[:-1])[np.arange(len(tokens) - 1), tokens[1:]]
    assert r["ppl"] == pytest.approx(float(np.exp(-direct.mean())), rel=1e-6)


def test_text_is_fixed_and_long_enough(demo_tok):
    text = fidelity.load_text()
    assert not text.startswith("<!--") and "山城" in text and "def " in text and "#include" in text
    assert "public domain" in fidelity.TEXT.read_text(encoding="utf-8").split("-->")[0]  # its licence header
    assert len(demo_tok(text, add_special_tokens=False).input_ids) >= 2000


def test_second_reference_scores_beside_the_first(tmp_path):
    """ref_file.npy beside ref.npy (bench/fidelity_formats.py: the file dequantized) gives kl_file / top1_file."""
    rng = np.random.default_rng(1)
    vocab, tokens = 5, list(rng.integers(0, 5, size=11))
    table = rng.normal(size=(len(tokens), vocab)).astype(np.float32)
    spans = fidelity.windows(len(tokens), 4, 2)
    mine = np.concatenate([fidelity.log_softmax(table[first - 1 : end - 1]) for _, end, first in spans])
    other = fidelity.log_softmax(mine + rng.normal(size=mine.shape))
    np.save(tmp_path / "ref.npy", other.astype(np.float32))  # first reference: another distribution
    np.save(tmp_path / "ref_file.npy", mine.astype(np.float32))  # second: the engine's own

    it = iter(spans)

    def window_logits(ids):
        start, end, _ = next(it)
        return table[start : end - 1]

    r = fidelity.score_windows(spans, tokens, window_logits, tmp_path / "ref.npy", vocab)
    assert r["kl_file"] == pytest.approx(0.0, abs=1e-6) and r["top1_file"] == 1.0
    assert r["kl"] > 0.01
    s = fidelity.Scores()
    s.add(mine, np.asarray(tokens[1:]), other)
    assert r["kl"] == pytest.approx(s.result()["kl"], rel=1e-5) and "kl_file" not in s.result()


def test_formats_table_names_the_target(tmp_path):
    import fidelity_formats

    base = {"ppl": 10.0}
    row = {"ppl": 11.0, "kl": 0.2, "top1": 0.8, "kl_file": 0.003, "top1_file": 0.95}
    res = {"Q4_0": {"file": "demo-Q4_0.gguf", "types": "Q4_0 79%, Q8_0 21%", "dequantized": {"ppl": 11.0},
                    "engines": {"wslm blocks": row, "wslm repacked": {**row, "ppl": 11.1, "kl": 0.3},
                                "llama.cpp": {**row, "kl": 0.25}}}}  # fmt: skip
    rows, verdict = fidelity_formats.table(res, base)
    assert "| demo-Q4_0.gguf (Q4_0 79%, Q8_0 21%) | wslm blocks | 11.0000 | +0.00% | 0.20000 |" in rows
    assert verdict[0].startswith("Q4_0, wslm blocks: perplexity within 0.5% of llama.cpp's met (+0.00%); KL vs "
                                 "float32 no larger met")  # fmt: skip
    assert "perplexity within 0.5% of llama.cpp's NOT met (+0.91%)" in verdict[1] and "NOT met (0.30000" in verdict[1]
    assert set(fidelity_formats.FTYPES) == set(fidelity_formats.FORMATS)
