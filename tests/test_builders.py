"""BERT encoder, MLM pretrainer and causal LM: contracts, causality, saving, JAX."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from concise_attention.models.bert import BertPretrainer
from concise_attention.training.run import configs


def _bert_inputs(batch=2, length=8, vocab=1000, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, size=(batch, length)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, length // 2 :] = 0
    return {"input_word_ids": ids * mask, "input_mask": mask, "input_type_ids": np.zeros_like(ids)}


def _lm_inputs(length=8):
    tokens = np.arange(1, 2 * length + 1, dtype="int32").reshape(2, length)  # distinct tokens
    return {
        "token_ids": tokens,
        "segment_ids": np.ones_like(tokens),
        "positions": np.tile(np.arange(length, dtype="int32"), (2, 1)),
    }


@pytest.mark.parametrize("preset", ["tiny_bert_standard", "tiny_bert_fixed", "tiny_bert_collaborative"])
def test_bert_encoder_tf_hub_outputs(preset):
    encoder = configs.load_config(preset).build_model()
    assert sorted(i.name for i in encoder.inputs) == ["input_mask", "input_type_ids", "input_word_ids"]
    outputs = encoder(_bert_inputs())
    assert set(outputs) == {"sequence_output", "pooled_output", "encoder_outputs"}
    assert outputs["sequence_output"].shape == (2, 8, 32) and outputs["pooled_output"].shape == (2, 32)
    assert len(outputs["encoder_outputs"]) == 2
    np.testing.assert_array_equal(np.asarray(outputs["encoder_outputs"][-1]), np.asarray(outputs["sequence_output"]))


def test_an_output_projection_maps_the_last_layer_and_commutes_with_mean_pooling():
    """output_size: sequence_output is the last layer's tokens times W plus b (numpy), so the mean of the real
    projected tokens is the projected mean (the Dense module sentence-transformers applies after pooling); the
    pooler and a saved config follow the output width, and the MLM head still reads the residual stream."""
    config = configs.load_config("tiny_bert_fixed", ["model.output_size=24"])
    encoder = config.build_model()
    inputs = _bert_inputs()
    outputs = encoder(inputs)
    last = np.asarray(outputs["encoder_outputs"][-1], np.float64)
    kernel, bias = (np.asarray(w, np.float64) for w in encoder.output_projection.weights)
    np.testing.assert_allclose(np.asarray(outputs["sequence_output"]), last @ kernel + bias, atol=1e-5)
    mask = inputs["input_mask"][:, :, None].astype(np.float64)
    mean_of_projected = (np.asarray(outputs["sequence_output"]) * mask).sum(1) / mask.sum(1)
    np.testing.assert_allclose(mean_of_projected, ((last * mask).sum(1) / mask.sum(1)) @ kernel + bias, atol=1e-5)
    assert outputs["pooled_output"].shape == (2, 24) and encoder.embedding_size == 24 and encoder.hidden_size == 32
    assert type(encoder).from_config(encoder.get_config()).embedding_size == 24
    pretrainer = BertPretrainer(encoder)
    logits = pretrainer(dict(inputs, masked_lm_positions=np.array([[1, 3], [0, 2]], "int32")))["mlm_logits"]
    assert logits.shape == (2, 2, 1000)


FUNNEL = ["model.stem_layers=1", "model.stem_width=48", "model.stem_heads=4", "model.stem_intermediate_size=96"]


def test_a_funnel_reads_its_table_at_the_stem_width_and_saves_and_loads(tmp_path):
    """A funnel's token table and stem run at stem_width, its layers at hidden_size; the MLM head reads the table
    at its width; the model saves and loads with equal outputs."""
    encoder = configs.load_config("tiny_bert_fixed", FUNNEL).build_model()
    assert encoder.word_embeddings.embeddings.shape == (1000, 48) and encoder.stem_projection.kernel.shape == (48, 32)
    inputs = _bert_inputs()
    outputs = encoder(inputs)
    assert outputs["sequence_output"].shape == (2, 8, 32) and len(outputs["encoder_outputs"]) == encoder.num_layers
    pretrainer = BertPretrainer(encoder)
    masked = dict(inputs, masked_lm_positions=np.array([[1, 3], [0, 2]], "int32"))
    assert pretrainer(masked)["mlm_logits"].shape == (2, 2, 1000)
    encoder.save(tmp_path / "funnel.keras")
    restored = keras.models.load_model(tmp_path / "funnel.keras")
    assert restored.get_config() == encoder.get_config()
    np.testing.assert_allclose(
        np.asarray(restored(inputs)["sequence_output"]), np.asarray(outputs["sequence_output"]), atol=1e-6
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.stem_heads=5"], "stem_width=48, stem_heads=5"),
        (["model.stem_intermediate_size=0"], "stem_intermediate_size=0"),
        (["model.relative_attention_buckets=32", "model.stem_heads=8"], "stem_heads=8, num_heads=4"),
        (["model.stem_width=100000"], r"`model.stem_width` must be a number > 0 and <= 65,536"),
    ],
)
def test_a_bad_funnel_is_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        configs.load_config("tiny_bert_fixed", FUNNEL + overrides).build_model()


def test_padding_does_not_change_real_tokens():
    encoder = configs.load_config("tiny_bert_fixed").build_model()
    inputs = _bert_inputs()
    changed = dict(inputs, input_word_ids=np.where(inputs["input_mask"] == 1, inputs["input_word_ids"], 7))
    before, after = encoder(inputs)["sequence_output"], encoder(changed)["sequence_output"]
    real = inputs["input_mask"].astype(bool)
    np.testing.assert_allclose(np.asarray(after)[real], np.asarray(before)[real], atol=1e-6)


def test_mlm_head_is_tied_to_the_word_embeddings():
    encoder = configs.load_config("tiny_bert_fixed").build_model()
    pretrainer = BertPretrainer(encoder)
    inputs = dict(_bert_inputs(), masked_lm_positions=np.array([[1, 3], [0, 2]], "int32"))
    logits = pretrainer(inputs)["mlm_logits"]
    assert logits.shape == (2, 2, 1000)
    # Only the head's transform, its norm and the output bias are new: no output matrix.
    assert pretrainer.count_params() - encoder.count_params() == 32 * 32 + 32 + 2 * 32 + 1000
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(pretrainer(inputs)["mlm_logits"][:, :, 5])
    gradient = tape.gradient(loss, encoder.word_embeddings.embeddings)
    assert np.abs(tf.convert_to_tensor(gradient).numpy()[5]).sum() > 0  # row 5 is the output vector of token 5


def _causal_gradients(model, inputs, position):
    """|d logits[:, position] / d token embedding row| for every row (untied: rows are inputs only)."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(inputs)[:, position])
    gradient = tf.convert_to_tensor(tape.gradient(loss, model.token_embeddings.embeddings)).numpy()
    return np.abs(gradient).sum(axis=1)


@pytest.mark.parametrize("attention_type", ["standard", "fixed", "collaborative"])
def test_causal_lm_later_tokens_have_zero_gradient_on_earlier_outputs(attention_type):
    attention = {
        "standard": "{type: standard}",
        "fixed": "{type: fixed, head_size: 16}",
        "collaborative": "{type: collaborative, head_size: 8, shared_key_dim: 8}",
    }[attention_type]
    config = configs.load_config(
        "tiny_lm", [f"model.attention={attention}", "model.tie_embeddings=false", "model.dropout=0"]
    )
    model = config.build_model()
    inputs = _lm_inputs()
    for position in (0, 3, 7):
        row_gradient = _causal_gradients(model, inputs, position)
        tokens = inputs["token_ids"]
        assert np.all(row_gradient[tokens[:, position + 1 :]] == 0.0), position
        assert np.all(row_gradient[tokens[:, : position + 1]] > 0.0), position


def test_packed_sentences_do_not_see_each_other():
    model = configs.load_config("tiny_lm", ["model.tie_embeddings=false", "model.dropout=0"]).build_model()
    inputs = _lm_inputs()
    inputs["segment_ids"] = np.array([[1, 1, 1, 2, 2, 2, 2, 2]] * 2, "int32")
    inputs["positions"] = np.array([[0, 1, 2, 0, 1, 2, 3, 4]] * 2, "int32")
    row_gradient = _causal_gradients(model, inputs, position=6)
    tokens = inputs["token_ids"]
    assert np.all(row_gradient[tokens[:, :3]] == 0.0)  # the first sentence is invisible
    assert np.all(row_gradient[tokens[:, 3:7]] > 0.0)


@pytest.mark.parametrize("overrides", [[], ["model.position_embedding=learned", "model.tie_embeddings=false"]])
def test_sequence_longer_than_max_positions_fails(overrides):
    model = configs.load_config("tiny_lm", ["model.max_sequence_length=8", *overrides]).build_model()
    with pytest.raises(ValueError, match="max_sequence_length=8.*sequence length 9"):
        model(_lm_inputs(length=9))
    encoder = configs.load_config("tiny_bert_standard", ["model.max_sequence_length=8"]).build_model()
    with pytest.raises(ValueError, match="max_sequence_length=8"):
        encoder(_bert_inputs(length=9))


def test_sinusoidal_positions_are_the_tensor2tensor_timing_signal():
    from concise_attention.models.embedding import PositionEmbedding

    table = np.asarray(PositionEmbedding(16, kind="sinusoidal")(np.zeros((1, 16, 8), "float32"))[0])
    inverse_timescales = np.exp(-np.log(1e4) * np.arange(4) / 3)
    angles = np.arange(16)[:, None] * inverse_timescales[None, :]
    np.testing.assert_allclose(table, np.concatenate([np.sin(angles), np.cos(angles)], axis=1), atol=1e-5)


@pytest.mark.parametrize(
    "name, make_inputs",
    [
        ("tiny_bert_collaborative", _bert_inputs),
        ("tiny_lm", _lm_inputs),
        ("tiny_lm_deep_single_head_admin", _lm_inputs),
    ],
)
def test_builders_survive_keras_save_and_load(name, make_inputs, tmp_path):
    model = configs.load_config(name).build_model()
    inputs = make_inputs()
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    assert type(restored) is type(model) and restored.get_config() == model.get_config()
    expected, outputs = model(inputs), restored(inputs)
    for a, b in zip(keras.tree.flatten(expected), keras.tree.flatten(outputs)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6)


def test_pretrainer_survives_keras_save_and_load(tmp_path):
    pretrainer = BertPretrainer(configs.load_config("tiny_bert_fixed").build_model())
    inputs = dict(_bert_inputs(), masked_lm_positions=np.array([[1, 3], [0, 2]], "int32"))
    pretrainer.save(tmp_path / "pretrainer.keras")
    restored = keras.models.load_model(tmp_path / "pretrainer.keras")
    np.testing.assert_allclose(
        np.asarray(restored(inputs)["mlm_logits"]), np.asarray(pretrainer(inputs)["mlm_logits"]), atol=1e-6
    )
    assert len(restored.weights) == len(pretrainer.weights)  # still tied after reload


def test_untied_lm_has_its_own_output_matrix():
    tied = configs.load_config("tiny_lm").build_model().count_params()
    untied = configs.load_config("tiny_lm", ["model.tie_embeddings=false"]).build_model().count_params()
    assert untied - tied == 1000 * 32


_JAX_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from concise_attention.training.run import configs
    data = np.load(sys.argv[1])
    for name in ("tiny_bert_fixed", "tiny_lm_deep_single_head_admin"):
        model = configs.load_config(name).build_model()
        model.load_weights(sys.argv[2] + f"/{name}.weights.h5")
        keys = [k for k in data.files if k.startswith(name + ".")]
        inputs = {k.split(".", 1)[1]: data[k] for k in keys}
        outputs = model(inputs)
        outputs = outputs["sequence_output"] if isinstance(outputs, dict) else outputs
        np.save(sys.argv[2] + f"/{name}.npy", np.asarray(outputs))
    print("ok")
    """
)


@pytest.mark.slow
def test_builders_run_under_jax(tmp_path):
    arrays, expected = {}, {}
    for name, inputs in (("tiny_bert_fixed", _bert_inputs()), ("tiny_lm_deep_single_head_admin", _lm_inputs())):
        model = configs.load_config(name).build_model()
        if name.endswith("admin"):
            model.initialize_admin(inputs)
        model.save_weights(tmp_path / f"{name}.weights.h5")
        outputs = model(inputs)
        expected[name] = np.asarray(outputs["sequence_output"] if isinstance(outputs, dict) else outputs)
        arrays.update({f"{name}.{key}": value for key, value in inputs.items()})
    np.savez(tmp_path / "inputs.npz", **arrays)
    result = subprocess.run(
        [sys.executable, "-c", _JAX_SCRIPT, str(tmp_path / "inputs.npz"), str(tmp_path)],
        env=dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for name, outputs in expected.items():
        np.testing.assert_allclose(np.load(tmp_path / f"{name}.npy"), outputs, atol=1e-5)
