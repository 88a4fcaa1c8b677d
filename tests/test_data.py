"""Text corpora: packing of sentences into LM rows (tensor2tensor style), corpus checks."""

import numpy as np
import pytest

from concise_attention.training.data.packing import SAMPLE_CORPUS
from concise_attention.training.data.packing import next_token_targets
from concise_attention.training.data.packing import pack_sentences
from concise_attention.training.data.packing import read_lines
from concise_attention.training.data.pipeline import check_utf8


def test_packing_keeps_sentences_whole_and_positions_restart():
    packed = pack_sentences([[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]], sequence_length=5)
    np.testing.assert_array_equal(packed["token_ids"], [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    np.testing.assert_array_equal(packed["segment_ids"], [[1, 1, 1, 2, 2], [1, 1, 1, 1, 2]])
    np.testing.assert_array_equal(packed["positions"], [[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]])
    assert all(array.dtype == np.int32 for array in packed.values())


def test_packing_pads_and_splits_long_sentences():
    packed = pack_sentences([[1, 2, 3, 4, 5, 6, 7], [8]], sequence_length=4)
    np.testing.assert_array_equal(packed["token_ids"], [[1, 2, 3, 4], [5, 6, 7, 8]])
    np.testing.assert_array_equal(packed["segment_ids"], [[1, 1, 1, 1], [1, 1, 1, 2]])
    packed = pack_sentences([[1, 2]], sequence_length=4)
    np.testing.assert_array_equal(packed["segment_ids"], [[1, 1, 0, 0]])


def test_next_token_targets_never_cross_a_sentence():
    packed = pack_sentences([[1, 2, 3], [4, 5]], sequence_length=6)
    labels, weights = next_token_targets(packed)
    np.testing.assert_array_equal(labels[0, :4], [2, 3, 4, 5])
    np.testing.assert_array_equal(weights, [[1, 1, 0, 1, 0, 0]])


def test_sample_corpus_is_real_text():
    lines = read_lines()
    words = sum(len(line.split()) for line in lines)
    assert words > 20000 and SAMPLE_CORPUS.stat().st_size < 1_000_000
    assert any("statement" in line for line in lines)


def test_bad_corpus_paths(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        read_lines(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="empty"):
        read_lines(tmp_path / "empty.txt")


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 5, 1 << 24])
def test_utf8_check_names_the_line_whatever_the_chunk_boundaries(tmp_path, monkeypatch, chunk_bytes):
    """Multi-byte characters split across read chunks are valid; the first bad bytes are
    reported on the line Python's own per-line decoding finds them."""
    monkeypatch.setattr("concise_attention.training.data.pipeline.CHECK_CHUNK_BYTES", chunk_bytes)
    good = "naïve café\n中文 text 😀\n\nÅngström\n".encode("utf-8")
    (tmp_path / "good.txt").write_bytes(good * 3)
    check_utf8(str(tmp_path / "good.txt"))
    for bad_bytes in (
        b"\xff",
        b"\xe4\xb8",
        b"\xc3(",
        b"\xed\xa0\x80",
    ):  # invalid, truncated, bad continuation, surrogate
        data = good * 2 + b"still fine " + bad_bytes + b" here\n" + good
        line = next(
            n
            for n, text in enumerate(data.split(b"\n"), 1)
            if text.decode("utf-8", "replace") != text.decode("utf-8", "ignore")
        )
        (tmp_path / "bad.txt").write_bytes(data)
        with pytest.raises(ValueError, match=rf"bad\.txt, line {line}: not valid UTF-8"):
            check_utf8(str(tmp_path / "bad.txt"))
    (tmp_path / "cut.txt").write_bytes(good + "中".encode("utf-8")[:2])  # a file cut inside its last character
    with pytest.raises(ValueError, match=r"cut\.txt, line 5: not valid UTF-8"):
        check_utf8(str(tmp_path / "cut.txt"))
