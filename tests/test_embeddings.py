"""`training.inference.embeddings.SentenceEncoder`: `encode(list of strings)` equals a numpy BERT's mean embeddings
(Hugging Face `tokenizers` ids) of all-MiniLM-L6-v2, in the order given, whatever the batch size."""

import json

import numpy as np
import pytest

from test_hf_export import hugging_face_ids
from test_hf_export import reference_embeddings
from concise_attention.training.inference.embeddings import SentenceEncoder

TEXTS = ["A man is playing a guitar.", "short", "Stock markets fell sharply on Monday, the third fall in a row.",
         "Café naïve résumé", "", "The cat sat on the mat " * 40, "Two dogs run in the park."]


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


@pytest.mark.parametrize("texts, batch_size, message", [
    ("one string", 32, "list of strings"), ([b"bytes"], 32, "list of strings"), (["a"], 0, "batch_size"),
    (None, 32, "list of strings"), (5, 32, "list of strings"),
])
def test_bad_arguments_name_the_argument(encoder, texts, batch_size, message):
    with pytest.raises(ValueError, match=message):
        encoder.encode(texts, batch_size=batch_size)


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
    assert sorted(hashed) == sorted(str(folder / name) for name in json.loads((folder / presets.MANIFEST_FILE).read_text())["sha256"])
    np.testing.assert_allclose(vectors, expected, atol=3e-3)  # float16 weights
    assert np.min(np.sum(vectors * expected, axis=1)) > 0.9999
    with pytest.raises(ValueError, match="Not a directory: 'minilm_l6' \\(.*a shipped preset: minilm_f16\\)"):
        SentenceEncoder.from_preset("minilm_l6")
    vocabulary = folder / presets.VOCABULARY_ASSET
    vocabulary.write_text(vocabulary.read_text(encoding="utf-8").replace("[UNK]", "[UNKNOWN]"), encoding="utf-8")
    with pytest.raises(ValueError, match="vocabulary.txt is missing or does not match the sha256"):
        SentenceEncoder.from_preset("minilm_f16")
