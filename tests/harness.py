"""Checks every layer of the zoo must pass, shared by the model tests (as keras-hub's TestCase)."""

import keras
import numpy as np
import tensorflow as tf


def _outputs(layer, inputs, **call_kwargs):
    return keras.ops.convert_to_numpy(layer(*inputs, **call_kwargs))


def check_config_round_trip(layer, inputs):
    """`cls(**get_config())` rebuilds the same layer: same config, same outputs with the same weights."""
    reference = _outputs(layer, inputs)
    clone = layer.__class__.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    clone(*inputs)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(_outputs(clone, inputs), reference, rtol=1e-6, atol=1e-6)


def check_saved_model_round_trip(layer, inputs, directory):
    """A model holding the layer survives `.keras` save and load with identical outputs."""
    symbolic = [keras.Input(shape=x.shape[1:], dtype=x.dtype) for x in inputs]
    model = keras.Model(symbolic, layer(*symbolic))
    path = str(directory / "model.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(restored(inputs)), keras.ops.convert_to_numpy(model(inputs)), rtol=1e-6, atol=1e-6
    )


def check_jit_compile(layer, inputs, **call_kwargs):
    """The layer compiles under XLA and gives the eager outputs; gradients compile too."""
    eager = _outputs(layer, inputs, **call_kwargs)

    @tf.function(jit_compile=True)
    def forward_backward(*args):
        with tf.GradientTape() as tape:
            outputs = layer(*args, **call_kwargs)
            loss = tf.reduce_sum(tf.square(outputs))
        return outputs, tape.gradient(loss, layer.trainable_variables)

    compiled, gradients = forward_backward(*[tf.constant(x) for x in inputs])
    np.testing.assert_allclose(compiled.numpy(), eager, rtol=1e-5, atol=1e-5)
    assert all(g is not None and np.all(np.isfinite(g.numpy())) for g in gradients)


def check_mixed_precision(layer, inputs, tolerances=(("mixed_bfloat16", 3e-2), ("mixed_float16", 3e-3)), **call_kwargs):
    """bf16 and fp16 compute give the float32 outputs within their precision, never inf/nan."""
    reference = _outputs(layer, inputs, **call_kwargs)
    scale = np.max(np.abs(reference))
    for policy, tolerance in tolerances:
        low = layer.__class__.from_config(layer.get_config() | {"dtype": policy})
        low(*inputs, **call_kwargs)
        low.set_weights(layer.get_weights())
        outputs = keras.ops.convert_to_numpy(keras.ops.cast(low(*inputs, **call_kwargs), "float32"))
        assert np.all(np.isfinite(outputs)), policy
        np.testing.assert_allclose(outputs, reference, atol=tolerance * scale, err_msg=policy)
