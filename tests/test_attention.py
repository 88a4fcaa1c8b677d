"""The attention family against keras.layers.MultiHeadAttention, the papers' formulas and theorem."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import harness
from concise_attention.models import CollaborativeAttention
from concise_attention.models import ConcatenateMixing
from concise_attention.models import FixedHeadSizeAttention
from concise_attention.models import StandardAttention

WIDTH, HEADS, LENGTH, BATCH = 16, 4, 7, 3


def _random(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def _padding_mask():
    """(B, S) padding mask: example b has LENGTH - b real tokens."""
    return np.arange(LENGTH)[None, :] < (LENGTH - np.arange(BATCH))[:, None]


def _randomize(layer):
    """Random weights everywhere, biases included, so that no term hides behind a zero."""
    rng = np.random.default_rng(7)
    layer.set_weights([rng.normal(scale=0.5, size=w.shape).astype("float32") for w in layer.get_weights()])
    return layer


def _keras_mha(num_heads, key_dim, query, value):
    mha = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=key_dim)
    mha(query, value)
    return _randomize(mha)


def _np(x):
    return keras.ops.convert_to_numpy(x)


# --------------------------------------------------------------------------------------
# Exactness against keras.layers.MultiHeadAttention


@pytest.mark.parametrize("head_size", [WIDTH // HEADS, 12], ids=["width_over_heads", "independent"])
@pytest.mark.parametrize("masking", ["none", "padding", "causal", "padding_and_causal"])
def test_fixed_head_size_reproduces_keras_multi_head_attention(head_size, masking):
    query, value = _random(BATCH, LENGTH, WIDTH, seed=1), _random(BATCH, LENGTH, WIDTH, seed=2)
    reference = _keras_mha(HEADS, head_size, query, value)
    layer = FixedHeadSizeAttention(num_heads=HEADS, head_size=head_size)
    layer(query, value)
    layer.set_weights(reference.get_weights())
    mask = np.broadcast_to(_padding_mask()[:, None, :], (BATCH, LENGTH, LENGTH))
    kwargs = {
        "attention_mask": mask if "padding" in masking else None,
        "use_causal_mask": "causal" in masking,
        "return_attention_scores": True,
    }
    expected, expected_probs = reference(query, value, **kwargs)
    outputs, probs = layer(query, value, **kwargs)
    np.testing.assert_allclose(_np(outputs), _np(expected), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_np(probs), _np(expected_probs), rtol=1e-5, atol=1e-6)


def test_standard_reproduces_keras_multi_head_attention():
    query = _random(BATCH, LENGTH, WIDTH)
    reference = _keras_mha(HEADS, WIDTH // HEADS, query, query)
    layer = StandardAttention(num_heads=HEADS)
    layer(query)
    layer.set_weights(reference.get_weights())
    mask = _padding_mask()
    expected = reference(query, query, attention_mask=np.broadcast_to(mask[:, None, :], (BATCH, LENGTH, LENGTH)))
    np.testing.assert_allclose(_np(layer(query, attention_mask=mask)), _np(expected), rtol=1e-5, atol=1e-5)
    assert layer.get_config()["num_heads"] == HEADS and "head_size" not in layer.get_config()


def test_collaborative_with_concatenate_mixing_reproduces_standard_attention():
    """Cordonnier et al.: D~k = N * d_k with block mixing is standard attention, given its weights.

    The standard layer has random biases; its query bias must fold into the content
    bias v_i = W_K^(i) b_Q^(i) and its key bias must cancel in the softmax.
    """
    head_size = WIDTH // HEADS
    query = _random(BATCH, LENGTH, WIDTH)
    standard = _randomize(StandardAttention(num_heads=HEADS))
    standard.build(query.shape)
    _randomize(standard)
    collaborative = CollaborativeAttention(num_heads=HEADS, shared_key_dim=HEADS * head_size, head_size=head_size)
    collaborative.build(query.shape)

    q_kernel, q_bias = _np(standard._query_dense.kernel), _np(standard._query_dense.bias)
    k_kernel = _np(standard._key_dense.kernel)
    collaborative._query_dense.kernel.assign(q_kernel.reshape(WIDTH, -1))
    collaborative._key_dense.kernel.assign(k_kernel.reshape(WIDTH, -1))
    collaborative.content_bias.assign(np.einsum("INH,NH->IN", k_kernel, q_bias))
    for source, target in (
        (standard._value_dense, collaborative._value_dense),
        (standard._output_dense, collaborative._output_dense),
    ):
        target.set_weights(source.get_weights())
    expected_mixing = np.kron(np.eye(HEADS), np.ones((1, head_size)))
    np.testing.assert_array_equal(_np(collaborative.mixing), expected_mixing)

    for kwargs in ({}, {"use_causal_mask": True}, {"attention_mask": _padding_mask()}):
        expected, expected_probs = standard(query, return_attention_scores=True, **kwargs)
        outputs, probs = collaborative(query, return_attention_scores=True, **kwargs)
        np.testing.assert_allclose(_np(outputs), _np(expected), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(_np(probs), _np(expected_probs), rtol=1e-5, atol=1e-6)


def test_concatenate_mixing_gives_uneven_last_blocks():
    mixing = _np(ConcatenateMixing()((3, 7)))
    np.testing.assert_array_equal(mixing, [[1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0, 1]])


@pytest.mark.parametrize(
    "mixing_initializer, check",
    [
        ("all_ones", lambda m: np.all(m == 1)),
        ("random", lambda m: 0.1 < m.std() < 0.3 and abs(m.mean()) < 0.05),
        ("random_uniform", lambda m: np.all(np.abs(m) <= 0.05) and m.std() > 0),
    ],
)
def test_mixing_initializers(mixing_initializer, check):
    layer = CollaborativeAttention(num_heads=8, shared_key_dim=128, head_size=8, mixing_initializer=mixing_initializer)
    layer.build((1, 4, 32))
    assert check(_np(layer.mixing))


# --------------------------------------------------------------------------------------
# Parameter counts: the papers' formulas


def _weight_sizes(layer):
    return {w.path.split("/", 1)[1]: int(np.prod(w.shape)) for w in layer.weights}


def test_fixed_head_size_parameter_count_is_four_d_h_dp():
    """Bhojanapalli et al.: the attention layer has 4 * d * h * d_p weights (+ biases)."""
    width, heads, head_size = 512, 8, 128
    layer = FixedHeadSizeAttention(num_heads=heads, head_size=head_size)
    layer.build((None, None, width))
    biases = 3 * heads * head_size + width
    assert layer.count_params() == 4 * width * heads * head_size + biases
    assert _weight_sizes(layer)["attention_output/kernel"] == width * heads * head_size


def test_standard_parameter_count_is_four_d_squared():
    layer = StandardAttention(num_heads=12)
    layer.build((None, None, 768))
    assert layer.count_params() == 4 * 768 * 768 + 4 * 768


def test_collaborative_query_key_parameter_count():
    """Cordonnier et al.: the query/key path has (2 * D_in + N_h) * D~k parameters, biases aside."""
    width, heads, shared = 768, 12, 192
    layer = CollaborativeAttention(num_heads=heads, shared_key_dim=shared, head_size=64)
    layer.build((None, None, width))
    sizes = _weight_sizes(layer)
    assert sizes["query/kernel"] + sizes["key/kernel"] + sizes["mixing"] == (2 * width + heads) * shared
    assert sizes["content_bias"] == width * heads
    value_output = 2 * width * heads * 64 + heads * 64 + width
    assert layer.count_params() == (2 * width + heads) * shared + width * heads + value_output


# --------------------------------------------------------------------------------------
# Theorem 1 of the low-rank-bottleneck paper


@pytest.mark.parametrize("head_size", [6, 9])
def test_theorem_1_head_size_at_least_length_represents_any_stochastic_matrix(head_size):
    """Bhojanapalli et al., Theorem 1, with the construction of its proof.

    The paper writes tokens as columns of X (d x n) and P as column stochastic:
    P = Softmax(X^T W_k^T W_q X / sqrt(d_p)), softmax over each column (one per query).
    Our layer's rows are queries, so its probabilities must equal P^T.
    """
    n, d = 6, 10  # d_p = head_size >= n; X of full column rank needs d >= n
    rng = np.random.default_rng(3)
    x_dxn = rng.normal(size=(d, n))
    p_nxn = rng.uniform(0.05, 1.0, size=(n, n))
    p_nxn /= p_nxn.sum(axis=0, keepdims=True)  # positive, column stochastic
    # The proof: X^T W_k^T = [I_n 0] and W_q X = sqrt(d_p) [log P ; 0] (columns shift freely).
    pseudo_inverse_nxd = np.linalg.inv(x_dxn.T @ x_dxn) @ x_dxn.T
    w_k_pxd = np.zeros((head_size, d))
    w_k_pxd[:n] = pseudo_inverse_nxd
    w_q_pxd = np.zeros((head_size, d))
    w_q_pxd[:n] = np.sqrt(head_size) * np.log(p_nxn) @ pseudo_inverse_nxd

    layer = FixedHeadSizeAttention(num_heads=1, head_size=head_size, use_bias=False)
    tokens = x_dxn.T[None].astype("float32")  # (1, n, d): rows are tokens
    layer.build(tokens.shape)
    layer._query_dense.kernel.assign(w_q_pxd.T[:, None, :])
    layer._key_dense.kernel.assign(w_k_pxd.T[:, None, :])
    _, probs = layer(tokens, return_attention_scores=True)
    np.testing.assert_allclose(_np(probs)[0, 0], p_nxn.T, atol=1e-5)


def test_theorem_1_counter_example_d1_n2_cannot_be_represented():
    """With d = 1 and n = 2 every head sees logits c * x x^T for a scalar c = w_q w_k,
    so P[0, j] = sigmoid(c x_j (x_0 - x_1)) and both columns lean the same way for
    x = (1, 2). P with P[0, 0] = 0.9 and P[0, 1] = 0.1 is out of reach: some entry
    stays >= 0.4 off, whatever the weights."""
    target = np.array([[0.9, 0.1], [0.1, 0.9]])  # column stochastic
    tokens = np.array([[[1.0], [2.0]]], dtype="float32")
    layer = FixedHeadSizeAttention(num_heads=1, head_size=1, use_bias=False)
    layer.build(tokens.shape)
    layer._query_dense.kernel.assign(np.ones((1, 1, 1)))
    best = np.inf
    for c in np.concatenate([-np.logspace(-3, 2, 400), [0.0], np.logspace(-3, 2, 400)]):
        layer._key_dense.kernel.assign(np.full((1, 1, 1), c))
        _, probs = layer(tokens, return_attention_scores=True)
        best = min(best, np.abs(_np(probs)[0, 0] - target.T).max())
    assert best >= 0.399


# --------------------------------------------------------------------------------------
# Masks: Keras polarity, checked through what a masked position can change

VARIANTS = {
    "standard": lambda: StandardAttention(num_heads=HEADS),
    "fixed": lambda: FixedHeadSizeAttention(num_heads=HEADS, head_size=12, value_head_size=5),
    "collaborative": lambda: CollaborativeAttention(
        num_heads=HEADS, shared_key_dim=6, head_size=4, mixing_initializer="random"
    ),
}


@pytest.fixture(params=sorted(VARIANTS))
def layer(request):
    layer = VARIANTS[request.param]()
    layer.build((BATCH, LENGTH, WIDTH))
    return _randomize(layer)


def test_causal_mask_future_token_does_not_change_earlier_outputs(layer):
    tokens = _random(BATCH, LENGTH, WIDTH)
    changed = tokens.copy()
    changed[:, 4:] += 10.0
    before = _np(layer(tokens, use_causal_mask=True))
    after = _np(layer(changed, use_causal_mask=True))
    np.testing.assert_allclose(after[:, :4], before[:, :4], rtol=1e-6, atol=1e-6)
    assert np.abs(after[:, 4:] - before[:, 4:]).max() > 1e-2  # and the mask is not "attend to nothing"


@pytest.mark.parametrize("mask_rank", [2, 3])
def test_padding_does_not_change_other_positions(layer, mask_rank):
    tokens = _random(BATCH, LENGTH, WIDTH)
    padding = _padding_mask()
    mask = padding if mask_rank == 2 else padding[:, None, :] & padding[:, :, None]
    changed = np.where(padding[:, :, None], tokens, 100.0 * _random(BATCH, LENGTH, WIDTH, seed=9))
    before, after = _np(layer(tokens, attention_mask=mask)), _np(layer(changed, attention_mask=mask))
    np.testing.assert_allclose(after[padding], before[padding], rtol=1e-5, atol=1e-5)
    unmasked = _np(layer(changed))
    assert np.abs(unmasked[padding] - before[padding]).max() > 1e-2


def test_keras_implicit_masks_are_used(layer):
    """Masked Keras inputs (e.g. Embedding(mask_zero=True)) mask the keys like a padding mask."""
    ids = np.where(_padding_mask(), np.arange(1, LENGTH + 1)[None, :], 0)
    embedding = keras.layers.Embedding(LENGTH + 1, WIDTH, mask_zero=True)
    tokens = embedding(ids)
    explicit = _np(layer(tokens, tokens, attention_mask=_padding_mask()[:, None, :] & _padding_mask()[:, :, None]))
    implicit = _np(layer(tokens, tokens))
    np.testing.assert_allclose(implicit, explicit, rtol=1e-6, atol=1e-6)


def test_dropout_only_in_training(layer):
    tokens = _random(BATCH, LENGTH, WIDTH)
    dropping = layer.__class__.from_config(layer.get_config() | {"dropout": 0.5})
    dropping(tokens)
    dropping.set_weights(layer.get_weights())
    inference = _np(dropping(tokens, training=False))
    np.testing.assert_allclose(inference, _np(layer(tokens)), rtol=1e-6, atol=1e-6)
    assert np.abs(_np(dropping(tokens, training=True)) - inference).max() > 1e-3


# --------------------------------------------------------------------------------------
# The shared harness: config, saving, XLA, mixed precision


def test_config_round_trip(layer):
    harness.check_config_round_trip(layer, [_random(BATCH, LENGTH, WIDTH)])


def test_saved_keras_round_trip(layer, tmp_path):
    harness.check_saved_model_round_trip(layer, [_random(BATCH, LENGTH, WIDTH)], tmp_path)


def test_jit_compile(layer):
    harness.check_jit_compile(layer, [_random(BATCH, LENGTH, WIDTH)], use_causal_mask=True)


def test_mixed_precision(layer):
    harness.check_mixed_precision(layer, [_random(BATCH, LENGTH, WIDTH)], attention_mask=_padding_mask())


def test_float16_masking_does_not_overflow():
    """Large logits and a mask in float16: the mask value must not become -inf or nan."""
    layer = FixedHeadSizeAttention(num_heads=2, head_size=8, dtype="mixed_float16")
    tokens = 30.0 * _random(BATCH, LENGTH, WIDTH)
    outputs, probs = layer(tokens, attention_mask=_padding_mask(), use_causal_mask=True, return_attention_scores=True)
    assert np.all(np.isfinite(_np(outputs))) and np.all(np.isfinite(_np(probs)))
    np.testing.assert_allclose(_np(probs).astype("float32").sum(-1), 1.0, atol=2e-3)
    assert np.all(_np(probs)[~np.broadcast_to(_padding_mask()[:, None, None, :], probs.shape)] == 0)


# --------------------------------------------------------------------------------------
# Invalid arguments name the argument and the value


@pytest.mark.parametrize(
    "factory, message",
    [
        (lambda: FixedHeadSizeAttention(num_heads=0, head_size=8), "num_heads=0"),
        (lambda: FixedHeadSizeAttention(num_heads=4, head_size=-1), "head_size=-1"),
        (lambda: FixedHeadSizeAttention(num_heads=4, head_size=None), "head_size=None"),
        (lambda: FixedHeadSizeAttention(num_heads=4, head_size=2.5), "head_size=2.5"),
        (lambda: FixedHeadSizeAttention(num_heads=4, head_size=8, value_head_size=0), "value_head_size=0"),
        (lambda: FixedHeadSizeAttention(num_heads=4, head_size=8, dropout=1.5), "dropout=1.5"),
        (lambda: StandardAttention(num_heads=-2), "num_heads=-2"),
        (lambda: CollaborativeAttention(num_heads=4, shared_key_dim=0, head_size=8), "shared_key_dim=0"),
        (
            lambda: CollaborativeAttention(num_heads=4, shared_key_dim=8, head_size=8, mixing_initializer="nope"),
            "mixing_initializer='nope'",
        ),
    ],
)
def test_invalid_arguments_name_the_argument_and_value(factory, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        factory()


def test_standard_width_not_divisible_by_heads():
    with pytest.raises(ValueError, match="hidden_size=512, num_heads=12"):
        StandardAttention(num_heads=12).build((None, None, 512))


@pytest.mark.parametrize(
    "mask_shape", [(BATCH, LENGTH, LENGTH + 1), (BATCH, LENGTH + 2), (BATCH + 1, LENGTH, LENGTH), (LENGTH,)]
)
def test_mismatched_mask_shape(layer, mask_shape):
    with pytest.raises(ValueError, match=r"attention_mask.shape=\(" + ", ".join(map(str, mask_shape))):
        layer(_random(BATCH, LENGTH, WIDTH), attention_mask=np.ones(mask_shape, bool))


def test_wrong_input_rank():
    with pytest.raises(ValueError, match=r"query.shape=\(2, 16\)"):
        FixedHeadSizeAttention(num_heads=2, head_size=4)(np.zeros((2, 16), "float32"))


def test_functional_model_with_attention_probabilities(layer):
    """Symbolic Keras inputs: the output structure follows `return_attention_scores`."""
    tokens = keras.Input((LENGTH, WIDTH))
    padding = keras.Input((LENGTH,), dtype="bool")
    outputs, probs = layer(tokens, attention_mask=padding, return_attention_scores=True)
    assert tuple(outputs.shape) == (None, LENGTH, WIDTH)
    assert tuple(probs.shape) == (None, HEADS, LENGTH, LENGTH)
    model = keras.Model([tokens, padding], [outputs, probs])
    _, eager_probs = model([_random(BATCH, LENGTH, WIDTH), _padding_mask()])
    np.testing.assert_allclose(_np(eager_probs).sum(-1), 1.0, rtol=1e-5)


def test_flop_count_needs_a_built_layer():
    with pytest.raises(ValueError, match="build or call the layer first"):
        FixedHeadSizeAttention(num_heads=2, head_size=4).query_key_flops(8)


# --------------------------------------------------------------------------------------
# The fused path (keras.ops.dot_product_attention) against the explicit one

FUSABLE = {
    "standard": lambda **kwargs: StandardAttention(num_heads=HEADS, **kwargs),
    "fixed": lambda **kwargs: FixedHeadSizeAttention(num_heads=HEADS, head_size=12, **kwargs),
}
MASKINGS = {
    "none": {},
    "causal": {"use_causal_mask": True},
    # The last example is all padding: its queries have no key to attend to.
    "padding": {"attention_mask": _padding_mask() & (np.arange(BATCH) < BATCH - 1)[:, None]},
    "padding_and_causal": {"attention_mask": _padding_mask(), "use_causal_mask": True},
}


@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the calls of keras.ops.dot_product_attention (the layers call it through `keras.ops`)."""
    calls = []
    original = keras.ops.dot_product_attention

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(keras.ops, "dot_product_attention", counting)
    return calls


def _fused_and_explicit(factory, **kwargs):
    fused = _randomize(factory(use_fused=True, **kwargs))
    fused.build((BATCH, LENGTH, WIDTH))
    _randomize(fused)
    explicit = fused.__class__.from_config(fused.get_config() | {"use_fused": False})
    explicit.build((BATCH, LENGTH, WIDTH))
    explicit.set_weights(fused.get_weights())
    return fused, explicit


def _outputs_and_gradients(layer, tokens, **kwargs):
    import tensorflow as tf

    tokens = tf.constant(tokens)
    with tf.GradientTape() as tape:
        tape.watch(tokens)
        outputs = layer(tokens, training=True, **kwargs)
        loss = tf.reduce_sum(tf.square(outputs))
    gradients = tape.gradient(loss, [tokens, *layer.trainable_variables])
    return outputs.numpy(), [g.numpy() for g in gradients]


@pytest.mark.parametrize("masking", sorted(MASKINGS))
@pytest.mark.parametrize("variant", sorted(FUSABLE))
def test_fused_path_matches_explicit_outputs_and_gradients(variant, masking, fused_calls):
    fused, explicit = _fused_and_explicit(FUSABLE[variant])
    tokens = _random(BATCH, LENGTH, WIDTH)
    outputs, gradients = _outputs_and_gradients(fused, tokens, **MASKINGS[masking])
    assert len(fused_calls) == 1 and fused_calls[0]["is_causal"] == ("causal" in masking)
    expected, expected_gradients = _outputs_and_gradients(explicit, tokens, **MASKINGS[masking])
    assert len(fused_calls) == 1
    np.testing.assert_allclose(outputs, expected, rtol=1e-5, atol=1e-5)
    _assert_gradients_close(gradients, expected_gradients)


def _assert_gradients_close(gradients, expected_gradients, err_msg=""):
    """float32 agreement relative to the largest gradient.

    The key bias's gradient is zero in exact arithmetic (the bias cancels in the
    softmax), so its float32 value is rounding noise of the other terms' size.
    """
    scale = max(np.abs(expected).max() for expected in expected_gradients)
    for i, (gradient, expected) in enumerate(zip(gradients, expected_gradients)):
        np.testing.assert_allclose(gradient, expected, rtol=1e-5, atol=1e-5 * scale, err_msg=f"{err_msg} gradient {i}")


@pytest.mark.parametrize("use_fused", [True, False], ids=["fused", "explicit"])
def test_query_without_keys_attends_uniformly(use_fused):
    """Today's behaviour, kept by both paths: a query whose keys are all masked averages all values.

    The reference is computed by hand from the value and output projections.
    """
    layer = _randomize(FixedHeadSizeAttention(num_heads=HEADS, head_size=12, use_fused=use_fused))
    layer.build((BATCH, LENGTH, WIDTH))
    _randomize(layer)
    tokens = _random(BATCH, LENGTH, WIDTH)
    mask = np.ones((BATCH, LENGTH, LENGTH), bool)
    mask[1, 2] = False  # query 2 of example 1 may attend to nothing
    outputs = _np(layer(tokens, attention_mask=mask))
    values_SxNxH = np.einsum("SI,INH->SNH", tokens[1], _np(layer.value_dense.kernel)) + _np(layer.value_dense.bias)
    output_dense = layer.output_dense
    expected = np.einsum("NH,NHO->O", values_SxNxH.mean(0), _np(output_dense.kernel)) + _np(output_dense.bias)
    np.testing.assert_allclose(outputs[1, 2], expected, rtol=1e-5, atol=1e-5)


def test_attention_dropout_in_training_falls_back_to_the_explicit_path(fused_calls):
    fused, explicit = _fused_and_explicit(FUSABLE["fixed"], dropout=0.5)
    tokens = _random(BATCH, LENGTH, WIDTH)
    dropped = _np(fused(tokens, attention_mask=_padding_mask(), training=True))
    assert not fused_calls
    inference = _np(fused(tokens, attention_mask=_padding_mask(), training=False))
    assert len(fused_calls) == 1
    np.testing.assert_allclose(inference, _np(explicit(tokens, attention_mask=_padding_mask())), rtol=1e-5, atol=1e-5)
    assert np.abs(dropped - inference).max() > 1e-3


@pytest.mark.parametrize(
    "factory, call_kwargs",
    [
        (lambda: FUSABLE["fixed"](use_fused=True), {"return_attention_scores": True}),
        (lambda: FixedHeadSizeAttention(num_heads=HEADS, head_size=12, value_head_size=5), {}),
        (lambda: CollaborativeAttention(num_heads=HEADS, shared_key_dim=6, head_size=4), {}),
        (lambda: StandardAttention(num_heads=HEADS, use_fused=False), {}),
    ],
    ids=["scores_returned", "value_heads_differ", "collaborative", "use_fused_false"],
)
def test_explicit_path_where_the_fused_one_cannot_or_must_not_run(factory, call_kwargs, fused_calls):
    factory()(_random(BATCH, LENGTH, WIDTH), **call_kwargs)
    assert not fused_calls


def test_use_fused_is_serialised_and_old_configs_load():
    layer = StandardAttention(num_heads=HEADS, use_fused=False)
    assert layer.get_config()["use_fused"] is False
    assert StandardAttention.from_config(layer.get_config()).use_fused is False
    old_config = {key: value for key, value in layer.get_config().items() if key != "use_fused"}
    assert StandardAttention.from_config(old_config).use_fused == "auto"
    with pytest.raises(ValueError, match="use_fused='yes'"):
        FixedHeadSizeAttention(num_heads=HEADS, head_size=8, use_fused="yes")


def test_auto_takes_the_fused_path_only_where_a_fused_kernel_exists(fused_calls, monkeypatch):
    """On this CPU under TensorFlow "auto" (the default) runs the explicit path (the fused call
    is the same XLA computation there, 1-3% slower); with JAX on a GPU it takes the fused one."""
    from concise_attention.models import attention

    for factory in FUSABLE.values():
        assert factory().use_fused == "auto"
        factory()(_random(BATCH, LENGTH, WIDTH))
    assert not attention.fused_kernel_available() and not fused_calls
    monkeypatch.setattr(keras.config, "backend", lambda: "jax")
    monkeypatch.setattr(keras.distribution, "list_devices", lambda device_type=None: ["gpu:0"])
    assert attention.fused_kernel_available()
    layer = FUSABLE["fixed"]()
    layer.build((BATCH, LENGTH, WIDTH))
    assert layer._uses_fused_path(return_attention_scores=False, training=False)
    assert not layer._uses_fused_path(return_attention_scores=True, training=False)
    monkeypatch.setattr(keras.distribution, "list_devices", lambda device_type=None: ["cpu:0"])
    assert not layer._uses_fused_path(return_attention_scores=False, training=False)


# --------------------------------------------------------------------------------------
# JAX backend, in one subprocess (importing Keras there costs ~10 s): the same outputs,
# the analytic FLOP counts match XLA's cost analysis, and the fused path
# (jax.nn.dot_product_attention there) matches the explicit one, gradients included

_JAX_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import jax
    import keras
    from concise_attention.models import CollaborativeAttention, FixedHeadSizeAttention, StandardAttention

    data = np.load(sys.argv[1], allow_pickle=False)
    tokens, mask = data["tokens"], data["mask"]
    flops, arrays = {}, {}
    for name, layer in (
        ("standard", StandardAttention(num_heads=4)),
        ("fixed", FixedHeadSizeAttention(num_heads=4, head_size=12)),
        ("collaborative", CollaborativeAttention(num_heads=4, shared_key_dim=6, head_size=4)),
    ):
        layer.build(tokens.shape)
        layer.set_weights([data[f"{name}_{i}"] for i in range(len(layer.weights))])
        arrays[name] = np.asarray(layer(tokens, attention_mask=mask, use_causal_mask=True))
        logits = jax.jit(lambda q: layer._attention_logits(q, q))
        cost = logits.lower(tokens).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        flops[name] = {"xla": cost["flops"], "ours": layer.query_key_flops(tokens.shape[1]) * tokens.shape[0]}

    fully_padded_mask = data["fully_padded_mask"]
    for path, use_fused in (("fused", True), ("explicit", False)):
        layer = FixedHeadSizeAttention(num_heads=4, head_size=12, use_fused=use_fused)
        layer.build(tokens.shape)
        layer.set_weights([data[f"fixed_{i}"] for i in range(len(layer.weights))])

        def loss(trainable, x):
            outputs, _ = layer.stateless_call(trainable, [], x, attention_mask=fully_padded_mask, use_causal_mask=True)
            return (outputs**2).sum(), outputs

        (_, outputs), (weight_gradients, input_gradient) = jax.jit(
            jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
        )([v.value for v in layer.trainable_variables], tokens)
        arrays[f"{path}_outputs"] = np.asarray(outputs)
        for i, gradient in enumerate([input_gradient, *weight_gradients]):
            arrays[f"{path}_gradient_{i}"] = np.asarray(gradient)
    np.savez(sys.argv[2], **arrays)
    print(json.dumps(flops))
    """
)


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory):
    """Runs `_JAX_SCRIPT` on random weights; returns the weights' TF layers, the JAX arrays and FLOP counts."""
    directory = tmp_path_factory.mktemp("jax")
    tokens = _random(BATCH, LENGTH, WIDTH)
    inputs = {"tokens": tokens, "mask": _padding_mask(), "fully_padded_mask": MASKINGS["padding"]["attention_mask"]}
    layers = {}
    for name, factory in (
        ("standard", lambda: StandardAttention(num_heads=4)),
        ("fixed", lambda: FixedHeadSizeAttention(num_heads=4, head_size=12, use_fused=False)),
        ("collaborative", lambda: CollaborativeAttention(num_heads=4, shared_key_dim=6, head_size=4)),
    ):
        layers[name] = factory()
        layers[name].build(tokens.shape)
        _randomize(layers[name])
        inputs.update({f"{name}_{i}": w for i, w in enumerate(layers[name].get_weights())})
    np.savez(directory / "inputs.npz", **inputs)
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-c", _JAX_SCRIPT, str(directory / "inputs.npz"), str(directory / "outputs.npz")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    flops = json.loads(result.stdout.strip().splitlines()[-1])
    return inputs, layers, dict(np.load(directory / "outputs.npz")), flops


@pytest.mark.slow
def test_layers_run_under_jax_with_the_same_outputs_and_flop_counts(jax_run):
    inputs, layers, jax_arrays, flops = jax_run
    for name, layer in layers.items():
        expected = _np(layer(inputs["tokens"], attention_mask=inputs["mask"], use_causal_mask=True))
        np.testing.assert_allclose(jax_arrays[name], expected, rtol=1e-5, atol=1e-5, err_msg=name)
        assert flops[name]["ours"] == pytest.approx(flops[name]["xla"], rel=0.02), (name, flops[name])


@pytest.mark.slow
def test_fused_path_matches_explicit_under_jax(jax_run):
    """Padding (one example all padding: queries with no key) and causal masks; the
    reference is TensorFlow's explicit path here."""
    inputs, layers, jax_arrays, _ = jax_run
    expected, expected_gradients = _outputs_and_gradients(
        layers["fixed"], inputs["tokens"], attention_mask=inputs["fully_padded_mask"], use_causal_mask=True
    )
    for path in ("fused", "explicit"):
        np.testing.assert_allclose(jax_arrays[f"{path}_outputs"], expected, rtol=1e-5, atol=1e-5, err_msg=path)
        gradients = [jax_arrays[f"{path}_gradient_{i}"] for i in range(len(expected_gradients))]
        _assert_gradients_close(gradients, expected_gradients, err_msg=path)
