"""Fine-tuning heads: outputs against a numpy computation on the encoder's own outputs, and .keras round trips."""

import keras
import numpy as np

from concise_attention.models.heads import BertClassifier
from concise_attention.models.heads import BertSpanLabeler
from concise_attention.training.run import configs


def _inputs():
    ids = np.array([[2, 7, 8, 9, 3, 0], [2, 5, 3, 6, 3, 0]], "int32")
    return {"input_word_ids": ids, "input_mask": (ids > 0).astype("int32"), "input_type_ids": np.zeros_like(ids)}


def test_classifier_is_a_dense_layer_on_the_pooled_output_and_round_trips(tmp_path):
    classifier = BertClassifier(configs.load_config("tiny_bert_fixed").build_model(), num_outputs=3)
    inputs = _inputs()
    pooled = np.asarray(classifier.encoder(inputs)["pooled_output"])
    kernel, bias = (np.asarray(w) for w in classifier.classifier.weights)
    logits = np.asarray(classifier(inputs)["logits"])
    np.testing.assert_allclose(logits, pooled @ kernel + bias, rtol=1e-5, atol=1e-6)
    classifier.save(tmp_path / "c.keras")
    np.testing.assert_allclose(np.asarray(keras.saving.load_model(tmp_path / "c.keras")(inputs)["logits"]), logits, atol=1e-6)


def test_span_labeler_scores_every_real_token_and_masks_padding(tmp_path):
    labeler = BertSpanLabeler(configs.load_config("tiny_bert_fixed").build_model())
    inputs = _inputs()
    sequence = np.asarray(labeler.encoder(inputs)["sequence_output"])
    kernel, bias = (np.asarray(w) for w in labeler.span.weights)
    outputs = labeler(inputs)
    expected = sequence @ kernel + bias
    np.testing.assert_allclose(np.asarray(outputs["start_logits"])[:, :5], expected[:, :5, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(outputs["end_logits"])[:, :5], expected[:, :5, 1], rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(outputs["start_logits"])[:, 5] < -1e8)  # padding can never be a span end point
    labeler.save(tmp_path / "s.keras")
    reloaded = keras.saving.load_model(tmp_path / "s.keras")
    np.testing.assert_allclose(np.asarray(reloaded(inputs)["end_logits"]), np.asarray(outputs["end_logits"]), atol=1e-5)
