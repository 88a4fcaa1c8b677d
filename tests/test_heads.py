"""Fine-tuning heads: outputs against a numpy computation on the encoder's own outputs, and .keras round trips."""

import keras
import numpy as np
import pytest

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
    np.testing.assert_allclose(
        np.asarray(keras.saving.load_model(tmp_path / "c.keras")(inputs)["logits"]), logits, atol=1e-6
    )


@pytest.mark.parametrize("pooling", ["mean", "normalized_mean"])
def test_classifier_reads_the_mean_token_vector_when_asked_and_round_trips(tmp_path, pooling):
    classifier = BertClassifier(configs.load_config("tiny_bert_fixed").build_model(), num_outputs=3, pooling=pooling)
    inputs = _inputs()
    sequence, mask = np.asarray(classifier.encoder(inputs)["sequence_output"]), inputs["input_mask"][:, :, None]
    mean = (sequence * mask).sum(1) / mask.sum(1)  # numpy: the real tokens only
    if pooling == "normalized_mean":
        mean = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    kernel, bias = (np.asarray(w) for w in classifier.classifier.weights)
    logits = np.asarray(classifier(inputs)["logits"])
    np.testing.assert_allclose(logits, mean @ kernel + bias, rtol=1e-5, atol=1e-6)
    # the [CLS] pooler no output reaches is not trained: no "Gradients do not exist" warning, and it stays as it was
    assert not any("pooler" in w.path for w in classifier.trainable_weights) and any(
        "pooler" in w.path for w in classifier.weights
    )
    classifier.save(tmp_path / "c.keras")
    reloaded = keras.saving.load_model(tmp_path / "c.keras")
    assert reloaded.pooling == pooling
    np.testing.assert_allclose(np.asarray(reloaded(inputs)["logits"]), logits, atol=1e-6)
    with pytest.raises(
        ValueError, match="`pooling` must be one of mean, normalized_mean, cls. Received: pooling='max'"
    ):
        BertClassifier(configs.load_config("tiny_bert_fixed").build_model(), num_outputs=3, pooling="max")


def test_a_new_head_on_the_shipped_sentence_encoder_reads_its_mean_token_vector(tmp_path):
    """Its [CLS] pooler was never trained: a head on it would start from a worse vector (docs/tasks.md)."""
    classifier = BertClassifier.from_preset("concise-minilm-d192", num_outputs=2)
    assert classifier.pooling == "mean"
    assert BertClassifier.from_preset("concise-minilm-d192", num_outputs=2, pooling="cls").pooling == "cls"
    ids = np.array([[101, 2023, 2003, 1037, 3231, 102, 0]], "int32")
    inputs = {"input_word_ids": ids, "input_mask": (ids > 0).astype("int32"), "input_type_ids": np.zeros_like(ids)}
    from concise_attention import SentenceEncoder  # its embedding (the unit-length mean), as encode gives it

    embedding = SentenceEncoder.from_preset("concise-minilm-d192").encode(["this is a test"])
    kernel, bias = (np.asarray(w) for w in classifier.classifier.weights)
    # numpy: the real tokens
    mean = np.asarray(classifier.encoder(inputs)["sequence_output"])[0, :6].mean(0, keepdims=True)
    np.testing.assert_allclose(mean / np.linalg.norm(mean), embedding, atol=1e-5)  # the direction encode gives
    np.testing.assert_allclose(np.asarray(classifier(inputs)["logits"]), mean @ kernel + bias, rtol=1e-5, atol=1e-5)
    # a new head on a saved fine-tuned classifier keeps the pooling its head was trained with
    classifier.save_to_preset(tmp_path / "tuned")
    with pytest.warns(UserWarning, match="a new BertClassifier head"):
        assert BertClassifier.from_preset(tmp_path / "tuned", num_outputs=3).pooling == "mean"
    # ... and carries the tokenizer it was loaded with: the saved preset encodes texts as the shipped one does
    np.testing.assert_allclose(
        SentenceEncoder.from_preset(tmp_path / "tuned").encode(["this is a test"]), embedding, atol=1e-5
    )


def test_a_mixed_precision_classifier_saves_and_loads_with_its_policies(tmp_path):
    encoder = configs.load_config("tiny_bert_fixed").build_model()
    encoder = type(encoder).from_config({**encoder.get_config(), "dtype": "mixed_float16"})
    classifier = BertClassifier(encoder, num_outputs=3)
    classifier.save(tmp_path / "c.keras")
    reloaded = keras.saving.load_model(tmp_path / "c.keras")
    for model in (classifier, reloaded):  # the encoder's layers compute in float16, before saving and after
        assert {layer.dtype_policy.name for layer in model.encoder.layers if layer.weights} == {"mixed_float16"}
        assert model.encoder.get_config()["dtype"]["config"]["name"] == "mixed_float16"
    np.testing.assert_array_equal(
        np.asarray(reloaded(_inputs())["logits"]), np.asarray(classifier(_inputs())["logits"])
    )


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
