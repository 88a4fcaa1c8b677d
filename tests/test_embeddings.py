"""`training.embeddings.SentenceEncoder`: `encode(list of strings)` equals a numpy BERT's mean embeddings
(Hugging Face `tokenizers` ids) of all-MiniLM-L6-v2, in the order given, whatever the batch size."""

import numpy as np
import pytest

from test_hf_export import hugging_face_ids
from test_hf_export import reference_embeddings
from training.embeddings import SentenceEncoder

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


@pytest.mark.parametrize("texts, batch_size, message", [
    ("one string", 32, "list of strings"), ([b"bytes"], 32, "list of strings"), (["a"], 0, "batch_size"),
])
def test_bad_arguments_name_the_argument(encoder, texts, batch_size, message):
    with pytest.raises(ValueError, match=message):
        encoder.encode(texts, batch_size=batch_size)
