"""`training.inference.embeddings.SentenceEncoder`: `encode(list of strings)` equals a numpy BERT's mean embeddings
(Hugging Face `tokenizers` ids) of all-MiniLM-L6-v2, in the order given, whatever the batch size."""

import json

import numpy as np
import pytest

from test_hf_export import hugging_face_ids
from test_hf_export import reference_embeddings
from concise_attention.training.inference.embeddings import SentenceEncoder

TEXTS = [
    "A man is playing a guitar.",
    "short",
    "Stock markets fell sharply on Monday, the third fall in a row.",
    "Café naïve résumé",
    "",
    "The cat sat on the mat " * 40,
    "Two dogs run in the park.",
]


@pytest.fixture(scope="module")
def encoder(minilm_dir):
    return SentenceEncoder.from_preset(minilm_dir, sequence_length=64)


def test_encode_gives_the_reference_mean_embeddings_in_order(encoder, minilm_dir):
    expected = reference_embeddings(minilm_dir, hugging_face_ids(minilm_dir / "vocab.txt", TEXTS, 64))
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    for batch_size in (1, 3, 32):
        vectors = encoder.encode(TEXTS, batch_size=batch_size)
        assert vectors.shape == (7, 384) and vectors.dtype == np.float32
        np.testing.assert_allclose(vectors, expected, atol=2e-5)
    raw = encoder.encode(TEXTS[:2], normalize=False)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), expected[:2], atol=2e-5)
    assert encoder.encode([]).shape == (0, 384)
    np.testing.assert_allclose(encoder.encode(np.array(TEXTS[:3])), encoder.encode(iter(TEXTS[:3])), atol=1e-6)
    np.testing.assert_allclose(encoder.encode(iter(TEXTS[:3])), expected[:3], atol=2e-5)  # a generator is read once


@pytest.mark.parametrize(
    "texts, arguments, message",
    [
        (["a"], {"batch_size": 0}, "batch_size"),
        (None, {}, "list of strings"),
        (5, {}, "type int"),
        ({"a": 1}, {}, "type dict"),
        (["a", None], {}, r"texts\[1\] of type NoneType"),
        (["a", "b", 3], {}, r"texts\[2\] of type int"),
        ([b"ok", b"\xff"], {}, r"texts\[1\]` is bytes but not UTF-8"),
        (["a"], {"normalize": "no"}, "normalize"),
        (["a"], {"progress": 3}, "progress"),
        (["a", "b\ud800c"], {}, r"texts\[1\]` is not valid Unicode"),
    ],
)
def test_bad_arguments_name_the_argument(encoder, texts, arguments, message):
    with pytest.raises(ValueError, match=message):
        encoder.encode(texts, **arguments)


def test_bytes_string_tensors_and_numpy_integers_are_read_as_their_text(encoder):
    import tensorflow as tf

    expected = encoder.encode(TEXTS[:4])
    np.testing.assert_array_equal(encoder.encode([text.encode("utf-8") for text in TEXTS[:4]]), expected)
    np.testing.assert_array_equal(encoder.encode(tf.constant(TEXTS[:4])), expected)
    np.testing.assert_array_equal(
        encoder.encode(np.array([text.encode("utf-8") for text in TEXTS[:4]], dtype=object)), expected
    )
    np.testing.assert_allclose(encoder.encode(TEXTS[:4], batch_size=np.int64(3), progress=True), expected, atol=1e-6)


def test_one_text_alone_gives_its_vector(encoder):
    """As sentence-transformers' encode: a str (bytes, a 0-d array or tensor) gives one (width,) row, the row the
    list [text] gives; arguments still checked."""
    import tensorflow as tf

    expected = encoder.encode(TEXTS[:1])[0]
    for one in (TEXTS[0], TEXTS[0].encode("utf-8"), np.array(TEXTS[0]), np.str_(TEXTS[0]), tf.constant(TEXTS[0])):
        vector = encoder.encode(one)
        assert vector.shape == (384,) and vector.dtype == np.float32
        np.testing.assert_array_equal(vector, expected)
    np.testing.assert_array_equal(
        encoder.encode(TEXTS[0], normalize=False), encoder.encode(TEXTS[:1], normalize=False)[0]
    )
    with pytest.raises(ValueError, match="batch_size"):
        encoder.encode(TEXTS[0], batch_size=0)


def test_texts_sorted_a_window_at_a_time_give_the_same_embeddings(encoder, monkeypatch):
    """With a window of 3 texts (32,768 by default) the 7 texts are tokenised and sorted in 3 windows: same rows,
    same order, as the single window gives (batches of other compositions: float noise only)."""
    from concise_attention.training.inference import embeddings

    whole = encoder.encode(TEXTS, batch_size=2)
    monkeypatch.setattr(embeddings, "SORT_WINDOW", 3)
    np.testing.assert_allclose(encoder.encode(TEXTS, batch_size=2, progress=True), whole, atol=1e-5)


def test_a_huge_batch_size_is_cut_to_a_bounded_forward_pass(encoder, monkeypatch):
    """Whatever batch_size asks, one forward pass holds at most MAX_BATCH_TOKENS tokens (here 64 of them: one text
    of the 64-token cut); the embeddings are those of small batches."""
    from concise_attention.training.inference import embeddings

    shapes = []
    forward = encoder._forward
    monkeypatch.setattr(encoder, "_forward", lambda ids, mask: shapes.append(tuple(ids.shape)) or forward(ids, mask))
    monkeypatch.setattr(embeddings, "MAX_BATCH_TOKENS", 64)
    np.testing.assert_allclose(encoder.encode(TEXTS, batch_size=10**9), encoder.encode(TEXTS, batch_size=1), atol=1e-6)
    assert shapes and max(rows for rows, _ in shapes) == 1


def test_a_text_is_read_only_as_far_as_its_cut_needs(encoder, monkeypatch):
    """Each text is tokenised from its first `sequence_length` words at most (the bounded reading the export's
    preprocessor does), so a huge text costs what a long one does; the result equals its first words'."""
    bounds = []
    call = type(encoder.tokenizer).__call__
    monkeypatch.setattr(
        type(encoder.tokenizer),
        "__call__",
        lambda self, text, max_length=None: bounds.append(max_length) or call(self, text, max_length),
    )
    head = "The cat sat on the mat. " * 20
    huge, short = encoder.encode([head + "and a very long tail " * 500_000]), encoder.encode([head])
    assert bounds == [64, 64]
    np.testing.assert_allclose(huge, short, atol=1e-6)  # 120 words already fill the 64-token cut


def test_a_sentence_transformers_folder_reads_its_max_seq_length_and_pooling(minilm_dir):
    """all-MiniLM-L6-v2's sentence_bert_config.json says 256 tokens (read here from the file itself): the default
    cut, checked against a numpy BERT on Hugging Face `tokenizers` ids cut there, for a text of over 300 tokens."""
    length = json.loads((minilm_dir / "sentence_bert_config.json").read_text())["max_seq_length"]
    assert length == 256
    encoder = SentenceEncoder.from_preset(str(minilm_dir))
    assert encoder.sequence_length == length
    long_text = ["The cat sat on the mat, and then it walked away. " * 30]
    ids = hugging_face_ids(minilm_dir / "vocab.txt", long_text, 100_000)
    assert len(ids[0]) > 300
    expected = reference_embeddings(minilm_dir, hugging_face_ids(minilm_dir / "vocab.txt", long_text, length))
    np.testing.assert_allclose(
        encoder.encode(long_text), expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=2e-5
    )


def test_a_sentence_transformers_pooling_other_than_the_mean_is_refused(minilm_dir, cls_pooling_dir):
    from concise_attention.export.savedmodels import _export_settings
    from concise_attention.training import artifacts

    folder = cls_pooling_dir
    with pytest.raises(ValueError, match="cls_token pooling"):
        SentenceEncoder.from_preset(str(folder))
    source = artifacts.read(str(folder))
    with pytest.raises(ValueError, match="cls_token pooling"):
        _export_settings(source, None, None, None)
    assert _export_settings(source, None, None, "cls")["pooling"] == "cls"  # chosen explicitly: exported as asked
    settings = _export_settings(artifacts.read(str(minilm_dir)), None, None, None)
    assert (settings["seq_length"], settings["pooling"], settings["sentence_encoder"]) == (256, "normalized_mean", True)


@pytest.mark.parametrize("length", [2, "256", 256.0, True])
def test_a_bad_max_seq_length_is_refused_naming_the_file(minilm_dir, tmp_path, length):
    for path in minilm_dir.iterdir():
        if path.name != "sentence_bert_config.json":
            (tmp_path / path.name).symlink_to(path)
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": length, "do_lower_case": False}))
    with pytest.raises(
        ValueError, match=r"sentence_bert_config.json: `max_seq_length` must be an integer of at least 3"
    ):
        SentenceEncoder.from_preset(str(tmp_path))


def test_a_sequence_length_beyond_the_encoders_positions_is_refused(encoder):
    with pytest.raises(ValueError, match="max_sequence_length=512"):
        SentenceEncoder(encoder.backbone, encoder.tokenizer, sequence_length=513)


def _ship(minilm_dir, root, monkeypatch):
    """all-MiniLM-L6-v2 as a shipped preset `minilm_f16` (float16 weights, manifest) under `root`."""
    from concise_attention.models import presets
    from concise_attention.models.hf_import import load_hf_bert

    folder = root / "minilm_f16"
    presets.save_to_preset(load_hf_bert(minilm_dir), folder, weights_dtype="float16")
    presets.save_tokenizer(folder, (minilm_dir / "vocab.txt").read_text(encoding="utf-8"), True, True)
    presets.write_manifest(folder)
    monkeypatch.setattr(presets, "SHIPPED_DIR", str(root))
    return folder


def test_a_shipped_float16_preset_loads_by_name_and_its_manifest_is_checked(minilm_dir, tmp_path, monkeypatch):
    from concise_attention.models import presets

    folder = _ship(minilm_dir, tmp_path / "shipped", monkeypatch)
    assert (folder / presets.WEIGHTS_FILE).stat().st_size < 22_713_216 * 2 * 1.01  # 2 bytes a parameter: float16
    assert presets.shipped_presets() == ["minilm_f16"]
    expected = reference_embeddings(minilm_dir, hugging_face_ids(minilm_dir / "vocab.txt", TEXTS, 64))
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    hashed = []
    monkeypatch.setattr(presets, "_sha256", lambda path, real=presets._sha256: hashed.append(path) or real(path))
    vectors = SentenceEncoder.from_preset("minilm_f16", sequence_length=64).encode(TEXTS)
    assert sorted(hashed) == sorted(
        str(folder / name) for name in json.loads((folder / presets.MANIFEST_FILE).read_text())["sha256"]
    )
    np.testing.assert_allclose(vectors, expected, atol=3e-3)  # float16 weights
    assert np.min(np.sum(vectors * expected, axis=1)) > 0.9999
    with pytest.raises(ValueError, match="Not a directory: 'minilm_l6' \\(.*a shipped preset: minilm_f16\\)"):
        SentenceEncoder.from_preset("minilm_l6")
    vocabulary = folder / presets.VOCABULARY_ASSET
    vocabulary.write_text(vocabulary.read_text(encoding="utf-8").replace("[UNK]", "[UNKNOWN]"), encoding="utf-8")
    with pytest.raises(ValueError, match="vocabulary.txt is missing or does not match the sha256"):
        SentenceEncoder.from_preset("minilm_f16")


def test_a_preset_folder_without_a_manifest_is_refused_unless_named_and_a_restored_mtime_does_not_hide_a_change(
    minilm_dir, tmp_path, monkeypatch
):
    import os

    from concise_attention.models import presets

    folder = _ship(minilm_dir, tmp_path / "shipped", monkeypatch)
    SentenceEncoder.from_preset(str(folder))  # verified once: its stamp is kept in this process
    vocabulary = folder / presets.VOCABULARY_ASSET
    stat, text = vocabulary.stat(), vocabulary.read_text(encoding="utf-8")
    vocabulary.write_text(text.replace("[UNK]", "[UNX]"), encoding="utf-8")  # same size
    os.utime(vocabulary, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same mtime
    with pytest.raises(ValueError, match="vocabulary.txt is missing or does not match the sha256"):
        SentenceEncoder.from_preset(str(folder))
    vocabulary.write_text(text, encoding="utf-8")
    (folder / presets.MANIFEST_FILE).unlink()
    with pytest.raises(ValueError, match=f"manifest.json is missing.*{presets.UNVERIFIED_VARIABLE}"):
        SentenceEncoder.from_preset(str(folder))
    monkeypatch.setenv(presets.UNVERIFIED_VARIABLE, os.pathsep.join(["/elsewhere", str(folder)]))
    assert SentenceEncoder.from_preset(str(folder)).width == 384
