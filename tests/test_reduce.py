"""`concise-reduce`: an encoder narrowed to its leading principal directions, written as a preset folder."""

import numpy as np
import pytest
from sklearn.decomposition import PCA

from concise_attention.cli.reduce import main
from concise_attention.training.inference.embeddings import SentenceEncoder

WORDS = "river market violin doctor winter engine garden lawyer planet bread camera soldier ocean poem".split()


def _corpus(folder, count=120):
    """A corpus folder (train/ and heldout/) of `count` distinct short sentences."""
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, 6)) + f" number {i}." for i in range(count)]
    for split in ("train", "heldout"):
        (folder / split).mkdir(parents=True)
        (folder / split / "part.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    return texts


def test_the_reduced_preset_gives_the_sources_embeddings_projected_on_their_principal_directions(
    minilm_dir, tmp_path, capsys
):
    """Reference: scikit-learn's PCA fitted on all-MiniLM-L6-v2's unit embeddings of the same texts (the corpus is
    smaller than --fit-count, so every text is drawn); the preset's unit embeddings are the source's projected on
    its 16 leading directions without the mean, at unit length (an exact linear map inside the encoder), to
    cosine 0.99999 (float32)."""
    texts = _corpus(tmp_path / "corpus")
    assert (
        main([str(minilm_dir), "--width", "16", "--fit-texts", str(tmp_path / "corpus"), "--out", str(tmp_path / "r")])
        == 0
    )
    assert "at width 16, fitted on 120 texts (all --fit-texts holds: fewer than --fit-count=20,000)" in (
        capsys.readouterr().out
    )
    source = SentenceEncoder.from_preset(minilm_dir)
    reduced = SentenceEncoder.from_preset(str(tmp_path / "r"))
    assert (reduced.width, reduced.sequence_length) == (16, source.sequence_length)
    fitted = source.encode(texts)
    probe = ["A man is playing a guitar.", "Stock markets fell sharply today.", "winter ocean poem"]
    expected = source.encode(probe) @ PCA(16, random_state=0).fit(fitted).components_.T
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    cosines = np.sum(reduced.encode(probe) * expected, axis=1)  # unit rows: the float32 forward pass's rounding only
    assert cosines.min() >= 0.99999, cosines


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--width", "384"], "--width must be narrower than the encoder's 384. Received: --width=384"),
        (["--width", "0"], "`--width` must be a positive integer"),
        (["--width", "200"], "gives 120 texts: more than --width=200 are needed"),
        (["--width", "16", "--fit-texts", "missing.txt"], "not found. Received: --fit-texts='missing.txt'"),
        (["--width", "16", "--fit-texts", __file__], f"nor a .txt file. Received: --fit-texts={__file__!r}"),
    ],
)
def test_a_bad_width_is_one_line_and_nothing_is_written(minilm_dir, tmp_path, capsys, extra, message):
    _corpus(tmp_path / "corpus")
    with pytest.raises(SystemExit) as exit_info:
        main([str(minilm_dir), "--fit-texts", str(tmp_path / "corpus"), "--out", str(tmp_path / "r"), *extra])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in error and len(error.strip().splitlines()) == 1, error
    assert sorted(path.name for path in tmp_path.iterdir()) == ["corpus"]


def test_one_text_file_fits_as_the_folder_that_holds_it(minilm_dir, tmp_path):
    """--fit-texts takes one .txt file of the user's own texts, one a line: the same texts, held-out lines and
    directions as a folder holding only that file."""
    texts = _corpus(tmp_path / "corpus")
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    for name, fit in (("from_file", tmp_path / "own" / "texts.txt"), ("from_folder", tmp_path / "own")):
        assert main([str(minilm_dir), "--width", "16", "--fit-texts", str(fit), "--out", str(tmp_path / name)]) == 0
    probe = ["A man is playing a guitar.", "winter ocean poem"]
    from_file, from_folder = (
        SentenceEncoder.from_preset(str(tmp_path / name)) for name in ("from_file", "from_folder")
    )
    np.testing.assert_array_equal(from_file.encode(probe), from_folder.encode(probe))
