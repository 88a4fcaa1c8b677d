"""The transformer block against keras-hub's TransformerEncoder; Admin initialisation and training."""

import keras
import keras_hub
import numpy as np
import pytest

import harness
from concise_attention.models.transformer import TransformerBlock
from concise_attention.models.transformer import admin_initialize
from concise_attention.models.attention import FixedHeadSizeAttention
from concise_attention.models.attention import StandardAttention
from concise_attention.models.attention import make_attention

WIDTH, HEADS, LENGTH, BATCH = 16, 4, 6, 2


def _random(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def _padding():
    return np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], bool)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_standard_block_matches_keras_hub_transformer_encoder(norm_position):
    x = _random(BATCH, LENGTH, WIDTH)
    reference = keras_hub.layers.TransformerEncoder(
        intermediate_dim=32,
        num_heads=HEADS,
        activation="relu",
        normalize_first=norm_position == "pre",
        layer_norm_epsilon=1e-6,
    )
    reference(x)
    rng = np.random.default_rng(5)
    reference.set_weights([rng.normal(scale=0.3, size=w.shape).astype("float32") for w in reference.get_weights()])
    block = TransformerBlock(
        num_heads=HEADS, intermediate_size=32, activation="relu", norm_position=norm_position, layer_norm_epsilon=1e-6
    )
    block(x)
    pairs = [
        (block.attention, reference._self_attention_layer),
        (block.attention_norm, reference._self_attention_layer_norm),
        (block.intermediate, reference._feedforward_intermediate_dense),
        (block.feedforward_output, reference._feedforward_output_dense),
        (block.feedforward_norm, reference._feedforward_layer_norm),
    ]
    for ours, theirs in pairs:
        ours.set_weights(theirs.get_weights())
    expected = reference(x, padding_mask=_padding())
    np.testing.assert_allclose(np.asarray(block(x, attention_mask=_padding())), np.asarray(expected), atol=1e-5)


@pytest.mark.parametrize(
    "attention, message",
    [
        (
            {"type": "linear"},
            r"attention.type` must be one of \['collaborative', 'fixed', 'standard'\]. Received: attention.type='linear'",
        ),
        ({"type": "fixed"}, "`attention.head_size` is required for attention type 'fixed'"),
        (
            {"type": "standard", "head_size": 8},
            "Unknown key `attention.head_size` for attention type 'standard'.*Known keys: type, output_size",
        ),
        ({"type": "collaborative", "head_size": 8}, "`attention.shared_key_dim` is required"),
        ({"type": "fixed", "head_size": 8, "shared_key_dim": 4}, "Unknown key `attention.shared_key_dim`.*'fixed'"),
        (
            {"type": "fixed", "head_size": 8, "dropout": 0.5},
            r"`attention.dropout` is set by the model \(attention_dropout\)",
        ),
        ({"type": "fixed", "head_size": 8, "name": "x"}, "Unknown key `attention.name`"),
        ("fixed", "`attention` must be a mapping"),
    ],
)
def test_attention_factory_errors(attention, message):
    with pytest.raises(ValueError, match=message):
        make_attention(attention, num_heads=2)


def test_attention_factory_passes_the_nested_config_unchanged():
    """Every key but `type` reaches the variant's constructor, including ones no builder knows of."""
    layer = make_attention(
        {"type": "fixed", "head_size": 8, "value_head_size": 4, "use_fused": False, "output_size": None},
        num_heads=2,
        dropout=0.25,
        name="attention",
    )
    assert type(layer) is FixedHeadSizeAttention
    assert (layer.head_size, layer.value_head_size, layer.use_fused, layer.output_size, layer.dropout) == (
        8,
        4,
        False,
        None,
        0.25,
    )
    assert type(make_attention(None, num_heads=2)) is StandardAttention


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"norm_position": "middle"}, "norm_position='middle'"),
        ({"residual_scaling": "rezero"}, "residual_scaling='rezero'"),
        ({"residual_scaling": "admin", "norm_position": "pre"}, "post-LN"),
        ({"intermediate_size": 0}, "intermediate_size=0"),
        ({"activation": "nope"}, "activation='nope'"),
    ],
)
def test_block_argument_errors(arguments, message):
    with pytest.raises(ValueError, match=message):
        TransformerBlock(**({"num_heads": 2, "intermediate_size": 8} | arguments))


@pytest.fixture(params=["standard", "fixed", "collaborative_admin"])
def block(request):
    kwargs = {
        "standard": {},
        "fixed": {"attention": {"type": "fixed", "head_size": 8}, "norm_position": "pre"},
        "collaborative_admin": {
            "attention": {"type": "collaborative", "head_size": 4, "shared_key_dim": 8},
            "residual_scaling": "admin",
        },
    }[request.param]
    block = TransformerBlock(num_heads=HEADS, intermediate_size=32, **kwargs)
    block.build((BATCH, LENGTH, WIDTH))
    return block


def test_block_config_round_trip(block):
    harness.check_config_round_trip(block, [_random(BATCH, LENGTH, WIDTH)])


def test_block_saved_keras_round_trip(block, tmp_path):
    harness.check_saved_model_round_trip(block, [_random(BATCH, LENGTH, WIDTH)], tmp_path)


def test_block_jit_compile(block):
    harness.check_jit_compile(block, [_random(BATCH, LENGTH, WIDTH)], use_causal_mask=True)


def test_admin_omegas_follow_the_profiled_variances():
    """omega_i^2 = 1 + sum of Var[f_j(x_{j-1})] over the earlier sublayers j < i, with the
    variances recomputed here by hand through each block's public sublayers (omega = 1)."""
    blocks = [
        TransformerBlock(
            num_heads=1,
            intermediate_size=16,
            attention={"type": "fixed", "head_size": 8},
            residual_scaling="admin",
            name=f"b{i}",
        )
        for i in range(4)
    ]
    x = _random(BATCH, LENGTH, WIDTH)
    for block in blocks:
        block.build(x.shape)
    admin_initialize(blocks, x, attention_mask=_padding())

    variances, h = [], x
    for block in blocks:
        attended = np.asarray(block.attention(h, attention_mask=_padding()))
        h = np.asarray(block.attention_norm(h + attended))
        transformed = np.asarray(
            block.feedforward_output(keras.activations.gelu(block.intermediate(h), approximate=False))
        )
        h = np.asarray(block.feedforward_norm(h + transformed))
        variances += [attended.var(), transformed.var()]
    omegas = [np.asarray(omega) for block in blocks for omega in (block.attention_omega, block.feedforward_omega)]
    for index, omega in enumerate(omegas):
        np.testing.assert_allclose(omega**2, 1.0 + sum(variances[:index]), rtol=1e-4)
    assert omegas[0][0] == pytest.approx(1.0) and omegas[-1][0] > omegas[1][0]


def test_admin_needs_admin_blocks():
    block = TransformerBlock(num_heads=2, intermediate_size=8)
    block.build((1, 4, 8))
    with pytest.raises(ValueError, match="residual_scaling='none'"):
        admin_initialize([block], np.zeros((1, 4, 8), "float32"))
