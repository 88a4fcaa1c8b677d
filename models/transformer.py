"""The transformer block: any attention variant, post-LN or pre-LN, optional Admin scaling.

The attention variant is configuration (`attention_type` plus that variant's own
arguments), not a block class of its own. Post-LN (BERT) computes
x_i = LN(omega_i * x_{i-1} + f_i(x_{i-1})) for each of the two sublayers f_i (attention,
feed-forward); omega_i = 1 unless `residual_scaling="admin"`, where omega_i is a learned
vector set by `admin_initialize` from a profiling pass (Liu et al., "Understanding the
Difficulty of Training Transformers", 2020). Pre-LN (tensor2tensor LM) computes
x_i = x_{i-1} + f_i(LN(x_{i-1})).
"""

import inspect
import math

import keras
from keras import ops

from models.attention import CollaborativeAttention
from models.attention import FixedHeadSizeAttention
from models.attention import StandardAttention
from models.attention import clone_initializer

ATTENTION_TYPES = {
    "standard": StandardAttention,
    "fixed": FixedHeadSizeAttention,
    "collaborative": CollaborativeAttention,
}
NORM_POSITIONS = ("post", "pre")


def register_attention(name, layer_class):
    """Adds an attention variant under `name` (then `model.attention_type: name` in a config).

    A variant is a `FixedHeadSizeAttention` subclass that overrides its query/key hooks
    (`_build_query_key`, `_attention_logits`); the builders pass it num_heads and whichever of
    head_size, shared_key_dim and mixing_initializer its constructor accepts.
    """
    if not (isinstance(layer_class, type) and issubclass(layer_class, FixedHeadSizeAttention)):
        raise ValueError(f"An attention variant must subclass FixedHeadSizeAttention. Received: {layer_class!r}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"An attention variant needs a non-empty name. Received: name={name!r}")
    ATTENTION_TYPES[name] = layer_class
    return layer_class
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


# Arguments a builder may set that belong to one attention variant or another.
_VARIANT_ARGUMENTS = ("head_size", "shared_key_dim", "mixing_initializer")


def make_attention(attention_type, num_heads, head_size=None, shared_key_dim=None, mixing_initializer=None, **common):
    """Creates the attention layer named by `attention_type` from builder arguments.

    Arguments that the chosen variant does not take must be unset (None): a config that
    sets `shared_key_dim` for standard attention is a mistake worth an error.
    """
    if attention_type not in ATTENTION_TYPES:
        raise ValueError(
            f"`attention_type` must be one of {sorted(ATTENTION_TYPES)}. Received: attention_type={attention_type!r}"
        )
    layer_class = ATTENTION_TYPES[attention_type]
    accepted = inspect.signature(layer_class.__init__).parameters
    variant = {"head_size": head_size, "shared_key_dim": shared_key_dim, "mixing_initializer": mixing_initializer}
    for name in _VARIANT_ARGUMENTS:
        if variant[name] is not None and name not in accepted:
            raise ValueError(
                f"`{name}` does not apply to attention_type={attention_type!r}. Received: {name}={variant[name]!r}"
            )
    arguments = {name: value for name, value in variant.items() if name in accepted and value is not None}
    if "head_size" in accepted and "head_size" not in arguments:
        raise ValueError(f"`head_size` is required for attention_type={attention_type!r}. Received: head_size=None")
    if "shared_key_dim" in accepted and "shared_key_dim" not in arguments:
        raise ValueError(
            f"`shared_key_dim` is required for attention_type={attention_type!r}. Received: shared_key_dim=None"
        )
    return layer_class(num_heads=num_heads, **arguments, **common)


def head_size_of(spec):
    """The query/key head size of a model or model config (standard: hidden_size / num_heads).

    `spec` is anything with the builder fields attention_type, hidden_size, num_heads and
    head_size: a `BertEncoder`, a `CausalLM`, or their config dataclasses.
    """
    return spec.hidden_size // spec.num_heads if spec.attention_type == "standard" else spec.head_size


@keras.saving.register_keras_serializable(package="concise_attention")
class TransformerBlock(keras.layers.Layer):
    """One transformer layer: self-attention and a feed-forward network, each residual.

    Args:
        num_heads: attention heads.
        intermediate_size: hidden width of the feed-forward network.
        attention_type: "standard", "fixed" or "collaborative".
        head_size: head size (fixed, collaborative).
        shared_key_dim: shared query/key width (collaborative).
        mixing_initializer: collaborative mixing initializer (default "concatenate").
        activation: feed-forward activation ("gelu" is exact erf GELU, as BERT;
            "gelu_approximate" is the tanh form; "relu", ...).
        norm_position: "post" (BERT) or "pre" (tensor2tensor / GPT-2).
        residual_scaling: "none" or "admin" (post-LN only).
        dropout: dropout on each sublayer output.
        attention_dropout: dropout on the attention probabilities.
        layer_norm_epsilon: LayerNormalization epsilon.
        kernel_initializer: initializer of every kernel.

    Call arguments:
        x: (B, T, D) inputs.
        attention_mask: (B, T, T) or (B, T) mask, True = may attend.
        use_causal_mask: causal self-attention.
        training: dropout switch.

    Example:
    >>> block = TransformerBlock(num_heads=8, intermediate_size=2048, attention_type="fixed", head_size=128)
    >>> block(keras.random.normal((2, 16, 512))).shape
    (2, 16, 512)
    """

    def __init__(
        self,
        num_heads,
        intermediate_size,
        attention_type="standard",
        head_size=None,
        shared_key_dim=None,
        mixing_initializer=None,
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
        if isinstance(intermediate_size, bool) or not isinstance(intermediate_size, int) or intermediate_size < 1:
            raise ValueError(f"`intermediate_size` must be a positive integer. Received: intermediate_size={intermediate_size!r}")
        if norm_position not in NORM_POSITIONS:
            raise ValueError(f"`norm_position` must be one of {NORM_POSITIONS}. Received: norm_position={norm_position!r}")
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
        self.attention_type = attention_type
        self.head_size = head_size
        self.shared_key_dim = shared_key_dim
        self.mixing_initializer = mixing_initializer
        self.activation = activation
        self.norm_position = norm_position
        self.residual_scaling = residual_scaling
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self._activation = get_activation(activation)
        self.attention = make_attention(
            attention_type,
            num_heads,
            head_size=head_size,
            shared_key_dim=shared_key_dim,
            mixing_initializer=mixing_initializer,
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
            self.intermediate_size, kernel_initializer=clone_initializer(self.kernel_initializer), dtype=self.dtype_policy, name="intermediate"
        )
        self.intermediate.build(input_shape)
        self.feedforward_output = keras.layers.Dense(
            width, kernel_initializer=clone_initializer(self.kernel_initializer), dtype=self.dtype_policy, name="feedforward_output"
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

    def forward_with_sublayer_outputs(self, x, attention_mask=None, use_causal_mask=False, training=None):
        """The block's output and the outputs f_i(.) of its two sublayers (for profiling)."""
        if self.norm_position == "pre":
            attended = self.attention(self.attention_norm(x), attention_mask=attention_mask, use_causal_mask=use_causal_mask, training=training)
            x = ops.add(x, self.dropout_layer(attended, training=training))
            transformed = self._feedforward(self.feedforward_norm(x))
            return ops.add(x, self.dropout_layer(transformed, training=training)), (attended, transformed)
        attended = self.attention(x, attention_mask=attention_mask, use_causal_mask=use_causal_mask, training=training)
        x = self.attention_norm(ops.add(self._scale_residual(x, "attention"), self.dropout_layer(attended, training=training)))
        transformed = self._feedforward(x)
        x = self.feedforward_norm(ops.add(self._scale_residual(x, "feedforward"), self.dropout_layer(transformed, training=training)))
        return x, (attended, transformed)

    def _scale_residual(self, x, sublayer):
        if self.residual_scaling == "admin":
            return ops.multiply(x, getattr(self, f"{sublayer}_omega"))
        return x

    def call(self, x, attention_mask=None, use_causal_mask=False, training=None):
        return self.forward_with_sublayer_outputs(x, attention_mask, use_causal_mask, training)[0]

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            intermediate_size=self.intermediate_size,
            attention_type=self.attention_type,
            head_size=self.head_size,
            shared_key_dim=self.shared_key_dim,
            mixing_initializer=self.mixing_initializer,
            activation=self.activation,
            norm_position=self.norm_position,
            residual_scaling=self.residual_scaling,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            layer_norm_epsilon=self.layer_norm_epsilon,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config


def admin_initialize(blocks, x, attention_mask=None, use_causal_mask=False):
    """Sets the Admin omegas of `blocks` from one profiling pass over `x`.

    Runs the blocks with every omega at 1 (plain post-LN), records the variance of each
    sublayer output f_j(x_{j-1}) in order (attention then feed-forward, block by block)
    and sets omega_i = sqrt(1 + sum_{j<i} Var[f_j]): the 1 is the variance of the
    layer-normalised embeddings every residual stream starts from.

    Args:
        blocks: the model's `TransformerBlock`s in order, all with residual_scaling="admin".
        x: the first block's input on a profiling batch (embeddings).
        attention_mask, use_causal_mask: as the model passes them to its blocks.

    Returns:
        The list of recorded variances, one per sublayer.
    """
    for block in blocks:
        if block.residual_scaling != "admin":
            raise ValueError(f"Block {block.name!r} has residual_scaling={block.residual_scaling!r}; Admin needs 'admin'.")
        block.attention_omega.assign(ops.ones_like(block.attention_omega))
        block.feedforward_omega.assign(ops.ones_like(block.feedforward_omega))
    variances = []
    for block in blocks:
        x, sublayer_outputs = block.forward_with_sublayer_outputs(x, attention_mask, use_causal_mask, training=False)
        variances.extend(float(ops.var(ops.cast(output, "float32"))) for output in sublayer_outputs)
    for index, block in enumerate(blocks):
        for offset, omega in enumerate((block.attention_omega, block.feedforward_omega)):
            earlier = sum(variances[: 2 * index + offset])
            omega.assign(ops.full(omega.shape, math.sqrt(1.0 + earlier), dtype=omega.dtype))
    return variances



def build_blocks(num_layers, **block_arguments):
    """`num_layers` TransformerBlocks named transformer_layer_0, 1, ... from one set of arguments."""
    return [TransformerBlock(name=f"transformer_layer_{index}", **block_arguments) for index in range(num_layers)]
