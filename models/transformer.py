"""The transformer block: any attention variant, post-LN or pre-LN, optional Admin scaling.

The attention variant is configuration (one nested `attention` config, handed unchanged to
`models.attention.make_attention`), not a block class of its own. Post-LN (BERT) computes
x_i = LN(omega_i * x_{i-1} + f_i(x_{i-1})) for each of the two sublayers f_i (attention,
feed-forward); omega_i = 1 unless `residual_scaling="admin"`, where omega_i is a learned
vector set by `admin_initialize` from a profiling pass (Liu et al., "Understanding the
Difficulty of Training Transformers", 2020). Pre-LN (tensor2tensor LM) computes
x_i = x_{i-1} + f_i(LN(x_{i-1})).
"""

import math

import keras
from keras import ops

from concise_attention.models.attention import ATTENTION_TYPES
from concise_attention.models.attention import attention_config
from concise_attention.models.attention import clone_initializer
from concise_attention.models.attention import make_attention
from concise_attention.models.checks import check_integer

NORM_POSITIONS = ("post", "pre")
RESIDUAL_SCALINGS = ("none", "admin")


def gelu_approximate(x):
    """GELU in its tanh form (GPT-2's "gelu_new", keras-hub's BERT)."""
    return keras.activations.gelu(x, approximate=True)


def get_activation(name):
    """A Keras activation by name; "gelu" is the exact erf form, "gelu_approximate" the tanh one."""
    if name == "gelu_approximate":
        return gelu_approximate
    try:
        return keras.activations.get(name)
    except ValueError as error:
        raise ValueError(f"Unknown activation. Received: activation={name!r}") from error


def head_size_of(spec):
    """The query/key head size of a model or model config (standard: hidden_size / num_heads).

    `spec` is anything with the builder fields `attention`, `hidden_size` and `num_heads`: a
    `BertEncoder`, a `CausalLM`, or their config dataclasses.
    """
    attention = attention_config(spec.attention)
    if ATTENTION_TYPES[attention["type"]]._head_size_from_width:
        return spec.hidden_size // spec.num_heads
    return attention["head_size"]


@keras.saving.register_keras_serializable(package="concise_attention")
class TransformerBlock(keras.layers.Layer):
    """One transformer layer: self-attention and a feed-forward network, each residual.

    Args:
        num_heads: attention heads.
        intermediate_size: hidden width of the feed-forward network.
        attention: the attention variant's nested config; None is standard attention. The
            block sets its num_heads, dropout and kernel_initializer.
        activation: feed-forward activation ("gelu" is exact, as BERT; "gelu_approximate", "relu", ...).
        norm_position: "post" (BERT) or "pre" (GPT-2).
        residual_scaling: "none" or "admin" (post-LN only).
        dropout, attention_dropout: on each sublayer output, on the attention probabilities.
        layer_norm_epsilon, kernel_initializer: of every norm, of every kernel.

    Call arguments: x (B, T, D); attention_mask (B, T, T) or (B, T), True = may attend;
    use_causal_mask; training; attention_bias (B or 1, N, T, T), added to the logits.

    Example:
    >>> block = TransformerBlock(num_heads=8, intermediate_size=2048, attention={"type": "fixed", "head_size": 128})
    >>> block(keras.random.normal((2, 16, 512))).shape
    (2, 16, 512)
    """

    def __init__(
        self,
        num_heads,
        intermediate_size,
        attention=None,
        activation="gelu",
        norm_position="post",
        residual_scaling="none",
        dropout=0.0,
        attention_dropout=0.0,
        layer_norm_epsilon=1e-12,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_integer("intermediate_size", intermediate_size)
        if norm_position not in NORM_POSITIONS:
            raise ValueError(
                f"`norm_position` must be one of {NORM_POSITIONS}. Received: norm_position={norm_position!r}"
            )
        if residual_scaling not in RESIDUAL_SCALINGS:
            raise ValueError(
                f"`residual_scaling` must be one of {RESIDUAL_SCALINGS}. Received: residual_scaling={residual_scaling!r}"
            )
        if residual_scaling == "admin" and norm_position != "post":
            raise ValueError(
                "Admin residual scaling is defined for post-LN blocks (x_i = LN(omega_i * x_{i-1} + f_i(x_{i-1}))). "
                f"Received: residual_scaling='admin', norm_position={norm_position!r}"
            )
        self.num_heads = num_heads
        self.intermediate_size = intermediate_size
        self.attention_config = attention_config(attention)
        self.activation = activation
        self.norm_position = norm_position
        self.residual_scaling = residual_scaling
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self._activation = get_activation(activation)
        self.attention = make_attention(
            self.attention_config,
            num_heads,
            dropout=attention_dropout,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="attention",
        )
        self.supports_masking = True

    def build(self, input_shape):
        width = input_shape[-1]
        self.attention.build(input_shape)
        self.attention_norm = self._norm("attention_norm", input_shape)
        self.intermediate = keras.layers.Dense(
            self.intermediate_size,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="intermediate",
        )
        self.intermediate.build(input_shape)
        self.feedforward_output = keras.layers.Dense(
            width,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="feedforward_output",
        )
        self.feedforward_output.build((*input_shape[:-1], self.intermediate_size))
        self.feedforward_norm = self._norm("feedforward_norm", input_shape)
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        if self.residual_scaling == "admin":
            # Set from a profiling pass by `admin_initialize`; 1 is plain post-LN.
            self.attention_omega = self.add_weight(name="attention_omega", shape=(width,), initializer="ones")
            self.feedforward_omega = self.add_weight(name="feedforward_omega", shape=(width,), initializer="ones")

    def _norm(self, name, input_shape):
        norm = keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name)
        norm.build(input_shape)
        return norm

    def _feedforward(self, x):
        return self.feedforward_output(self._activation(self.intermediate(x)))

    def forward_with_sublayer_outputs(
        self, x, attention_mask=None, use_causal_mask=False, training=None, attention_bias=None
    ):
        """The block's output and the outputs f_i(.) of its two sublayers (for profiling)."""
        if self.norm_position == "pre":
            attended = self.attention(
                self.attention_norm(x),
                attention_mask=attention_mask,
                use_causal_mask=use_causal_mask,
                training=training,
                attention_bias=attention_bias,
            )
            x = ops.add(x, self.dropout_layer(attended, training=training))
            transformed = self._feedforward(self.feedforward_norm(x))
            return ops.add(x, self.dropout_layer(transformed, training=training)), (attended, transformed)
        attended = self.attention(
            x,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            training=training,
            attention_bias=attention_bias,
        )
        x = self.attention_norm(
            ops.add(self._scale_residual(x, "attention"), self.dropout_layer(attended, training=training))
        )
        transformed = self._feedforward(x)
        x = self.feedforward_norm(
            ops.add(self._scale_residual(x, "feedforward"), self.dropout_layer(transformed, training=training))
        )
        return x, (attended, transformed)

    def attention_projections(self, x):
        """The queries, keys and values (each B, T, width: the heads side by side) that this block's
        self-attention computes from its input `x` (MiniLMv2's relation distillation reads them)."""
        attention_input = self.attention_norm(x) if self.norm_position == "pre" else x
        projections = []
        for dense in (self.attention.query_dense, self.attention.key_dense, self.attention.value_dense):
            width = math.prod(dense.partial_output_shape[1:])
            projections.append(ops.reshape(dense(attention_input), (ops.shape(x)[0], ops.shape(x)[1], width)))
        return projections

    def _scale_residual(self, x, sublayer):
        if self.residual_scaling == "admin":
            return ops.multiply(x, getattr(self, f"{sublayer}_omega"))
        return x

    def call(self, x, attention_mask=None, use_causal_mask=False, training=None, attention_bias=None):
        return self.forward_with_sublayer_outputs(x, attention_mask, use_causal_mask, training, attention_bias)[0]

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            intermediate_size=self.intermediate_size,
            attention=dict(self.attention_config),
            activation=self.activation,
            norm_position=self.norm_position,
            residual_scaling=self.residual_scaling,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            layer_norm_epsilon=self.layer_norm_epsilon,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config


def admin_initialize(blocks, x, attention_mask=None, use_causal_mask=False, attention_bias=None):
    """Sets the Admin omegas of `blocks` from one profiling pass over `x`.

    Runs the blocks with every omega at 1 (plain post-LN), records the variance of each
    sublayer output f_j in order and sets omega_i = sqrt(1 + sum_{j<i} Var[f_j]), 1 being
    the variance of the layer-normalised embeddings.

    Args:
        blocks: the model's `TransformerBlock`s in order, all with residual_scaling="admin".
        x: the first block's input.
        attention_mask, use_causal_mask, attention_bias: as the model passes them.

    Returns the variances, one per sublayer.
    """
    for block in blocks:
        if block.residual_scaling != "admin":
            raise ValueError(
                f"Block {block.name!r} has residual_scaling={block.residual_scaling!r}; Admin needs 'admin'."
            )
        block.attention_omega.assign(ops.ones_like(block.attention_omega))
        block.feedforward_omega.assign(ops.ones_like(block.feedforward_omega))
    variances = []
    for block in blocks:
        x, sublayer_outputs = block.forward_with_sublayer_outputs(
            x, attention_mask, use_causal_mask, training=False, attention_bias=attention_bias
        )
        variances.extend(float(ops.var(ops.cast(output, "float32"))) for output in sublayer_outputs)
    for index, block in enumerate(blocks):
        for offset, omega in enumerate((block.attention_omega, block.feedforward_omega)):
            earlier = sum(variances[: 2 * index + offset])
            omega.assign(ops.full(omega.shape, math.sqrt(1.0 + earlier), dtype=omega.dtype))
    return variances


def build_blocks(num_layers, prefix="transformer_layer", **block_arguments):
    """`num_layers` TransformerBlocks named {prefix}_0, 1, ... from one set of arguments."""
    return [TransformerBlock(name=f"{prefix}_{index}", **block_arguments) for index in range(num_layers)]
