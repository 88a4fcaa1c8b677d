"""The attention family: standard, fixed head size ("concise") and collaborative.

One attention core (`FixedHeadSizeAttention`) does masking, softmax, dropout, the
value mix and the output projection. The variants override only what their papers
change:

* `StandardAttention` derives the head size from the width (head_size = width / heads).
* `CollaborativeAttention` replaces the per-head query/key projections by shared ones
  re-weighted per head by a mixing matrix, plus per-head content biases.

Shapes in names: B batch, T query length, S key/value length, N heads, H head size,
K shared key dimension, I input width, O output width.

Masks follow the Keras convention everywhere: True / 1 means "may attend".

A model picks its variant with ONE nested config, `attention={"type": "fixed", "head_size": 128}`:
`type` names a variant of the registry `ATTENTION_TYPES` and every other key is an argument of
that variant's constructor, passed unchanged by `make_attention` (the builders and the block
never list them). A new variant is a subclass plus `register_attention("name", Class)`.

Where no attention probabilities are needed (no scores returned, no attention dropout
active), the core hands the per-head queries, keys and values to
`keras.ops.dot_product_attention` (cuDNN flash attention on GPU under JAX, one XLA
computation elsewhere) instead of spelling the softmax out. `use_fused="auto"` (the default)
does so where a fused kernel exists (JAX on a GPU or TPU, keras-hub's rule), since on CPU
the call is 1-3% slower than the explicit path; True always, False never. Both give the
same outputs: float32 masking and softmax, masked logits replaced (not added to), and a
query whose keys are all masked attends uniformly to all.
"""

import inspect
import math

import keras
from keras import ops

from concise_attention.models.checks import check_integer

# Logits are masked in float32 (see `_masked_softmax`), so this value cannot overflow
# in bfloat16 or float16 compute.
_MASKED_LOGIT = -1e9


def _check_rate(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be a float in [0, 1). Received: {name}={value!r}")


def fused_kernel_available():
    """Whether `keras.ops.dot_product_attention` has a fused kernel here: the JAX backend with a
    GPU or TPU (cuDNN / Pallas flash attention). Under TensorFlow (no flash kernel in Keras) and on
    CPU it is the same XLA computation as the explicit path, with extra layout copies (1-3% slower,
    benchmarks/attention_benchmark.py): keras-hub's `fused_attention_op_available` rule."""
    if keras.config.backend() != "jax":
        return False
    return any(device.split(":")[0].lower() in ("gpu", "cuda", "tpu") for device in keras.distribution.list_devices())


@keras.saving.register_keras_serializable(package="concise_attention")
class FixedHeadSizeAttention(keras.layers.Layer):
    """Multi-head attention whose head size is its own hyper-parameter.

    The fixed head size attention of Bhojanapalli et al., "Low-Rank Bottleneck in
    Multi-head Attention Models" (ICML 2020): queries and keys get `head_size`
    dimensions per head whatever the width. The weights have the layout of
    `keras.layers.MultiHeadAttention` (kernels (I, N, H), (I, N, H), (I, N, Hv), (N, Hv, O)).

    Args:
        num_heads: number of heads.
        head_size: query/key size per head; softmax scale 1/sqrt(head_size).
        value_head_size: defaults to `head_size`.
        output_size: defaults to the query's width.
        dropout, seed: rate and seed of the attention dropout.
        use_bias, kernel_initializer, bias_initializer: of the projections.
        use_fused: `keras.ops.dot_product_attention` where no probabilities are needed:
            True, "auto" (where a fused kernel exists) or False.

    Call arguments: as in `keras.layers.MultiHeadAttention` (True = may attend; a (B, S)
    `attention_mask` pads keys), plus `attention_bias` (B or 1, N, T, S), added to the logits.

    Example:
    >>> layer = FixedHeadSizeAttention(num_heads=8, head_size=128)
    >>> layer(keras.random.normal((2, 16, 512)), use_causal_mask=True).shape
    (2, 16, 512)
    """

    # Whether `head_size` is derived from the query width in `build` (standard attention).
    _head_size_from_width = False
    # Whether the logits are the scaled per-head dot products of `_project_query_key`, so
    # that `keras.ops.dot_product_attention` can compute them. A variant that overrides
    # `_attention_logits` is taken at its word (explicit path) unless it sets this to True.
    _logits_are_head_dot_products = True

    def __init__(
        self,
        num_heads,
        head_size,
        value_head_size=None,
        output_size=None,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        use_fused="auto",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_integer("num_heads", num_heads)
        if head_size is not None or not self._head_size_from_width:
            check_integer("head_size", head_size)
        if value_head_size is not None:
            check_integer("value_head_size", value_head_size)
        if output_size is not None:
            check_integer("output_size", output_size)
        _check_rate("dropout", dropout)
        if not isinstance(use_fused, bool) and use_fused != "auto":
            raise ValueError(f"`use_fused` must be True, False or 'auto'. Received: use_fused={use_fused!r}")
        self.num_heads = num_heads
        self.head_size = head_size
        self.value_head_size = value_head_size
        self.output_size = output_size
        self.dropout = dropout
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = seed
        self.use_fused = use_fused
        # Outputs keep the query's Keras mask (each output row is a query position).
        self.supports_masking = True

    # The projections, for weight import and conversion (as keras.layers.MultiHeadAttention).
    @property
    def query_dense(self):
        return self._query_dense

    @property
    def key_dense(self):
        return self._key_dense

    @property
    def value_dense(self):
        return self._value_dense

    @property
    def output_dense(self):
        return self._output_dense

    # ----------------------------------------------------------------------------------
    # Hooks a variant overrides.

    def _resolve_head_size(self, input_size):
        """Returns the query/key head size for a query of width `input_size`."""
        return self.head_size

    def _build_query_key(self, query_shape, key_shape):
        self._query_dense = self._dense("query", "BTI,INH->BTNH", (None, self.num_heads, self._head_size), "NH")
        self._query_dense.build(query_shape)
        self._key_dense = self._dense("key", "BSI,INH->BSNH", (None, self.num_heads, self._head_size), "NH")
        self._key_dense.build(key_shape)

    def _project_query_key(self, query, key):
        """Returns the per-head queries (B, T, N, H) and keys (B, S, N, H) of raw inputs."""
        return self._query_dense(query), self._key_dense(key)

    def _attention_logits(self, query, key):
        """Returns the scaled attention logits (B, N, T, S) of raw query/key inputs."""
        query_BxTxNxH, key_BxSxNxH = self._project_query_key(query, key)
        # Scaling the query costs T*N*H multiplications instead of N*T*S on the logits.
        query_BxTxNxH = ops.multiply(query_BxTxNxH, ops.cast(self._scale, query_BxTxNxH.dtype))
        return ops.einsum("BTNH,BSNH->BNTS", query_BxTxNxH, key_BxSxNxH)

    def query_key_flops(self, query_length, key_length=None):
        """Floating point operations of the query/key path for one example.

        Counts the projections (2 per multiply-add), their biases, the query scaling
        and the logits, i.e. everything `_attention_logits` computes.
        """
        self._check_built("query_key_flops")
        key_length = query_length if key_length is None else key_length
        width, heads, size = self._input_size, self.num_heads, self._head_size
        projections = 2 * (query_length + key_length) * width * heads * size
        biases = (query_length + key_length) * heads * size if self.use_bias else 0
        scaling = query_length * heads * size
        logits = 2 * heads * query_length * key_length * size
        return projections + biases + scaling + logits

    # ----------------------------------------------------------------------------------
    # The shared core.

    def _check_built(self, method):
        if not self.built:
            raise ValueError(f"`{method}` needs the input width: build or call the layer first (layer {self.name!r}).")

    def _dense(self, name, equation, output_shape, bias_axes=None):
        """An `EinsumDense` projection sharing this layer's initializers and policy."""
        dense = keras.layers.EinsumDense(
            equation,
            output_shape=output_shape,
            bias_axes=bias_axes if self.use_bias else None,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )
        # Masks were read by `call`; a projection just lets them pass instead of warning.
        dense.supports_masking = True
        return dense

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        for name, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
            if len(shape) != 3 or shape[-1] is None:
                raise ValueError(
                    f"`{name}` must have shape (batch, length, width) with a known width. "
                    f"Received: {name}.shape={tuple(shape)}"
                )
        if key_shape[1] is not None and value_shape[1] is not None and key_shape[1] != value_shape[1]:
            raise ValueError(
                "`key` and `value` must have the same length. "
                f"Received: key.shape={tuple(key_shape)}, value.shape={tuple(value_shape)}"
            )
        self._input_size = query_shape[-1]
        self._head_size = self._resolve_head_size(query_shape[-1])
        self._value_head_size = self.value_head_size or self._head_size
        self._scale = 1.0 / math.sqrt(self._head_size)
        self._build_query_key(query_shape, key_shape)
        self._value_dense = self._dense("value", "BSI,INH->BSNH", (None, self.num_heads, self._value_head_size), "NH")
        self._value_dense.build(value_shape)
        output_size = self.output_size or query_shape[-1]
        self._output_dense = self._dense("attention_output", "BTNH,NHO->BTO", (None, output_size), "O")
        self._output_dense.build((query_shape[0], query_shape[1], self.num_heads, self._value_head_size))
        self._dropout_layer = keras.layers.Dropout(self.dropout, seed=self.seed, dtype=self.dtype_policy)

    def call(
        self,
        query,
        value=None,
        key=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_bias=None,
    ):
        value = query if value is None else value
        key = value if key is None else key
        fused = self._uses_fused_path(return_attention_scores, training)
        mask_Bx1xTxS = compute_attention_mask(
            query,
            value,
            attention_mask=attention_mask,
            # The fused kernel applies causality itself (cuDNN then skips the masked half).
            use_causal_mask=use_causal_mask and not fused,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
        )
        if fused:
            return self._fused_attention(query, key, value, mask_Bx1xTxS, use_causal_mask, attention_bias)
        logits_BxNxTxS = self._attention_logits(query, key)
        if attention_bias is not None:
            logits_BxNxTxS = ops.add(ops.cast(logits_BxNxTxS, "float32"), ops.cast(attention_bias, "float32"))
        probs_BxNxTxS = _masked_softmax(logits_BxNxTxS, mask_Bx1xTxS, self.compute_dtype)
        value_BxSxNxH = self._value_dense(value)
        context_BxTxNxH = ops.einsum(
            "BNTS,BSNH->BTNH", self._dropout_layer(probs_BxNxTxS, training=training), value_BxSxNxH
        )
        output_BxTxO = self._output_dense(context_BxTxNxH)
        if return_attention_scores:
            return output_BxTxO, probs_BxNxTxS
        return output_BxTxO

    def _uses_fused_path(self, return_attention_scores, training):
        """Whether `keras.ops.dot_product_attention` can compute this call.

        It returns no probabilities and applies no dropout to them, and it needs value
        heads of the query/key head size (`jax.nn.dot_product_attention` checks it).
        """
        overridden = type(self)._attention_logits is not FixedHeadSizeAttention._attention_logits
        return (
            (self.use_fused is True or (self.use_fused == "auto" and fused_kernel_available()))
            and self._logits_are_head_dot_products
            and (not overridden or "_logits_are_head_dot_products" in vars(type(self)))
            and not return_attention_scores
            and not (training and self.dropout > 0)
            and self._value_head_size == self._head_size
        )

    def _fused_attention(self, query, key, value, mask_Bx1xTxS, use_causal_mask, attention_bias=None):
        query_BxTxNxH, key_BxSxNxH = self._project_query_key(query, key)
        value_BxSxNxH = self._value_dense(value)
        context_BxTxNxH = ops.dot_product_attention(
            query_BxTxNxH,
            key_BxSxNxH,
            value_BxSxNxH,
            bias=None if attention_bias is None else ops.cast(attention_bias, query_BxTxNxH.dtype),
            mask=mask_Bx1xTxS,
            scale=self._scale,
            is_causal=use_causal_mask,
            # None lets the backend choose; keras.config.disable_flash_attention() opts out.
            flash_attention=keras.config.is_flash_attention_enabled(),
        )
        return self._output_dense(context_BxTxNxH)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            head_size=self.head_size,
            value_head_size=self.value_head_size,
            output_size=self.output_size,
            dropout=self.dropout,
            use_bias=self.use_bias,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
            seed=self.seed,
            use_fused=self.use_fused,
        )
        return config


@keras.saving.register_keras_serializable(package="concise_attention")
class StandardAttention(FixedHeadSizeAttention):
    """Standard multi-head attention (Vaswani et al., 2017): head size = width / heads.

    This is `FixedHeadSizeAttention` with the head size tied to the query width, which
    is the coupling the low-rank-bottleneck paper argues against: more heads make each
    head smaller. Equivalent to `keras.layers.MultiHeadAttention(num_heads,
    key_dim=width // num_heads)`.

    Args:
        num_heads: number of heads; must divide the query width.
        output_size, dropout, use_bias, kernel_initializer, bias_initializer, seed,
            use_fused: as in `FixedHeadSizeAttention`.

    Example:
    >>> layer = StandardAttention(num_heads=8)
    >>> layer(keras.random.normal((2, 16, 512))).shape
    (2, 16, 512)
    """

    _head_size_from_width = True

    def __init__(
        self,
        num_heads,
        output_size=None,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        use_fused="auto",
        **kwargs,
    ):
        super().__init__(
            num_heads=num_heads,
            head_size=None,
            output_size=output_size,
            dropout=dropout,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            seed=seed,
            use_fused=use_fused,
            **kwargs,
        )

    def _resolve_head_size(self, input_size):
        if input_size % self.num_heads:
            raise ValueError(
                "`num_heads` must divide the width (hidden_size) for standard attention. "
                f"Received: hidden_size={input_size}, num_heads={self.num_heads}"
            )
        return input_size // self.num_heads

    def get_config(self):
        config = super().get_config()
        del config["head_size"], config["value_head_size"]
        return config


@keras.saving.register_keras_serializable(package="concise_attention")
class ConcatenateMixing(keras.initializers.Initializer):
    """Mixing matrix (N, K) of blocks of ones: head i sees shared dimensions
    [i*c, (i+1)*c) with c = ceil(K / N), so collaborative attention starts as
    concatenated heads (Cordonnier et al., 2020; the last heads get fewer dimensions,
    or none, when N does not divide K)."""

    def __call__(self, shape, dtype=None):
        num_heads, shared_key_dim = shape
        block = -(-shared_key_dim // num_heads)
        head_N = ops.arange(num_heads)[:, None]
        column_K = ops.arange(shared_key_dim)[None, :]
        return ops.cast(ops.equal(column_K // block, head_N), dtype or "float32")


_MIXING_INITIALIZERS = {
    "concatenate": ConcatenateMixing,
    "all_ones": lambda: keras.initializers.Ones(),
    # The reference implementation calls this one UNIFORM; it draws N(0, 0.2^2).
    "random": lambda: keras.initializers.RandomNormal(stddev=0.2),
}


@keras.saving.register_keras_serializable(package="concise_attention")
class CollaborativeAttention(FixedHeadSizeAttention):
    """Collaborative multi-head attention (Cordonnier, Loukas and Jaggi, 2020).

    The heads share a query and a key projection of width K, without bias; head i
    re-weights them by row m_i of a learned mixing matrix (N, K) and adds a content bias
    v_i over the keys:

        logits_i = (X Wq diag(m_i) Wk^T X'^T + 1 (X' v_i)^T) / sqrt(head_size).

    Args:
        num_heads: number of heads (N).
        shared_key_dim: K.
        head_size: value head size and the modelled query/key head size (softmax scale).
        mixing_initializer: "concatenate" (starts as concatenated heads), "all_ones",
            "random" (N(0, 0.2^2)) or any Keras initializer.
        use_fused: accepted for a shared config; the explicit path always runs.
        value_head_size, output_size, dropout, use_bias, kernel_initializer,
            bias_initializer, seed: as in `FixedHeadSizeAttention`.

    Example:
    >>> layer = CollaborativeAttention(num_heads=12, shared_key_dim=192, head_size=64)
    >>> layer(keras.random.normal((2, 16, 768))).shape
    (2, 16, 768)
    """

    # keras.ops.dot_product_attention wants keys with as many heads as the values, so
    # the shared (B, S, K) key would be copied N times, and the content bias would go
    # through its `bias` argument, which Keras 3.15's TPU flash kernel ignores (JAX). The
    # explicit path contracts the shared key once instead.
    _logits_are_head_dot_products = False

    def __init__(
        self,
        num_heads,
        shared_key_dim,
        head_size,
        mixing_initializer="concatenate",
        value_head_size=None,
        output_size=None,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        use_fused="auto",
        **kwargs,
    ):
        check_integer("shared_key_dim", shared_key_dim)
        check_integer("head_size", head_size)
        super().__init__(
            num_heads=num_heads,
            head_size=head_size,
            value_head_size=value_head_size,
            output_size=output_size,
            dropout=dropout,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            seed=seed,
            use_fused=use_fused,
            **kwargs,
        )
        self.shared_key_dim = shared_key_dim
        if isinstance(mixing_initializer, str) and mixing_initializer in _MIXING_INITIALIZERS:
            self.mixing_initializer = _MIXING_INITIALIZERS[mixing_initializer]()
        else:
            try:
                self.mixing_initializer = keras.initializers.get(mixing_initializer)
            except ValueError as error:
                raise ValueError(
                    f"`mixing_initializer` must be one of {sorted(_MIXING_INITIALIZERS)} or a Keras "
                    f"initializer. Received: mixing_initializer={mixing_initializer!r}"
                ) from error

    def _build_query_key(self, query_shape, key_shape):
        shared = self.shared_key_dim
        # No bias: the query bias lives in `content_bias`, the key bias cancels.
        self._query_dense = self._dense("query", "BTI,IK->BTK", (None, shared))
        self._query_dense.build(query_shape)
        self._key_dense = self._dense("key", "BSI,IK->BSK", (None, shared))
        self._key_dense.build(key_shape)
        self.mixing = self.add_weight(
            name="mixing", shape=(self.num_heads, shared), initializer=self.mixing_initializer
        )
        self.content_bias = self.add_weight(
            name="content_bias",
            shape=(key_shape[-1], self.num_heads),
            initializer=clone_initializer(self.bias_initializer),
        )

    def _attention_logits(self, query, key):
        scale = ops.cast(self._scale, self.compute_dtype)
        query_BxTxK = ops.multiply(self._query_dense(query), scale)
        key_BxSxK = self._key_dense(key)
        mixed_query_BxTxNxK = ops.multiply(query_BxTxK[:, :, None, :], self.mixing)
        logits_BxNxTxS = ops.einsum("BTNK,BSK->BNTS", mixed_query_BxTxNxK, key_BxSxK)
        content_BxNxS = ops.multiply(ops.einsum("BSI,IN->BNS", key, self.content_bias), scale)
        return ops.add(logits_BxNxTxS, content_BxNxS[:, :, None, :])

    def query_key_flops(self, query_length, key_length=None):
        self._check_built("query_key_flops")
        key_length = query_length if key_length is None else key_length
        width, heads, shared = self._input_size, self.num_heads, self.shared_key_dim
        projections = 2 * (query_length + key_length) * width * shared
        scaling = query_length * shared + heads * key_length
        mixing = query_length * heads * shared
        logits = 2 * heads * query_length * key_length * shared
        content = 2 * key_length * width * heads + heads * query_length * key_length
        return projections + scaling + mixing + logits + content

    def get_config(self):
        config = super().get_config()
        config.update(
            shared_key_dim=self.shared_key_dim, mixing_initializer=keras.initializers.serialize(self.mixing_initializer)
        )
        return config


ATTENTION_TYPES = {
    "standard": StandardAttention,
    "fixed": FixedHeadSizeAttention,
    "collaborative": CollaborativeAttention,
}

# Arguments every variant takes from the model that holds it (the model's own field in brackets),
# never from the nested attention config.
SET_BY_THE_MODEL = {"num_heads": "num_heads", "dropout": "attention_dropout", "kernel_initializer": "its initializer"}


def register_attention(name, layer_class):
    """Adds an attention variant under `name`; then `attention: {type: name, ...}` in a model config.

    A variant is a `FixedHeadSizeAttention` subclass that overrides its query/key hooks
    (`_build_query_key`, `_project_query_key`, `_attention_logits`). Its constructor's arguments
    are the keys its nested config may hold: nothing else is to be registered or re-listed.
    """
    if not (isinstance(layer_class, type) and issubclass(layer_class, FixedHeadSizeAttention)):
        raise ValueError(f"An attention variant must subclass FixedHeadSizeAttention. Received: {layer_class!r}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"An attention variant needs a non-empty name. Received: name={name!r}")
    ATTENTION_TYPES[name] = layer_class
    return layer_class


def _variant_arguments(layer_class):
    """{name: inspect.Parameter} of the arguments a nested config may give `layer_class`."""
    parameters = inspect.signature(layer_class.__init__).parameters.values()
    return {
        parameter.name: parameter
        for parameter in parameters
        if parameter.name != "self"
        and parameter.name not in SET_BY_THE_MODEL
        and parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL)
    }


# The flat attention fields of configs and run directories written before the nested `model.attention` config.
FLAT_ATTENTION_KEYS = {
    "attention_type": "type",
    "head_size": "head_size",
    "shared_key_dim": "shared_key_dim",
    "mixing_initializer": "mixing_initializer",
}


def check_nested_attention(model):
    """Refuses a model section with the flat attention fields of earlier versions, naming the nested field."""
    flat = next((key for key in FLAT_ATTENTION_KEYS if key in model), None)
    if flat is not None:
        nested = f"model.attention.{FLAT_ATTENTION_KEYS[flat]}"
        raise ValueError(
            f"`model.{flat}` is the flat form of `{nested}` that earlier versions wrote, which this version "
            f"does not read: set `{nested}` instead."
        )
    return model


def attention_config(attention=None, prefix="attention"):
    """Checks a nested attention config and returns its canonical form `{"type": ..., **arguments}`.

    None (or no `type`) is standard attention; a null value means "not set" (the variant's
    default). Every other key must be an argument of the variant's constructor, and the
    constructor's required arguments must be there: errors name the key (as `prefix.key`) and
    list the variant's arguments.

    Example:
    >>> attention_config({"type": "fixed", "head_size": 64, "value_head_size": None})
    {'type': 'fixed', 'head_size': 64}
    """
    if attention is None:
        attention = {}
    if not isinstance(attention, dict):
        raise ValueError(
            f"`{prefix}` must be a mapping such as {{type: fixed, head_size: 64}}. Received: {prefix}={attention!r}"
        )
    arguments = {key: value for key, value in attention.items() if value is not None}
    kind = arguments.pop("type", "standard")
    if kind not in ATTENTION_TYPES:
        raise ValueError(f"`{prefix}.type` must be one of {sorted(ATTENTION_TYPES)}. Received: {prefix}.type={kind!r}")
    layer_class = ATTENTION_TYPES[kind]
    known = _variant_arguments(layer_class)
    for key in arguments:
        if key in SET_BY_THE_MODEL:
            raise ValueError(
                f"`{prefix}.{key}` is set by the model ({SET_BY_THE_MODEL[key]}), not by its attention config. "
                f"Received: {prefix}.{key}={arguments[key]!r}"
            )
        if key not in known:
            raise ValueError(
                f"Unknown key `{prefix}.{key}` for attention type {kind!r} ({layer_class.__name__}). "
                f"Known keys: type, {', '.join(known)}"
            )
    missing = [
        name for name, parameter in known.items() if parameter.default is parameter.empty and name not in arguments
    ]
    if missing:
        raise ValueError(
            f"`{prefix}.{missing[0]}` is required for attention type {kind!r} ({layer_class.__name__}). "
            f"Received: {prefix}={attention!r}"
        )
    return {"type": kind, **arguments}


def make_attention(attention, num_heads, **common):
    """The attention layer a nested config describes: `ATTENTION_TYPES[type](num_heads, **rest, **common)`.

    Args:
        attention: the nested config (see `attention_config`); None is standard attention.
        num_heads: the model's number of heads.
        **common: what the model sets for every variant (`dropout`, `kernel_initializer`)
            and base layer arguments (`dtype`, `name`).
    """
    arguments = attention_config(attention)
    layer_class = ATTENTION_TYPES[arguments.pop("type")]
    return layer_class(num_heads=num_heads, **arguments, **common)


def clone_initializer(initializer):
    """A fresh copy, so that seeded initializers do not give every kernel the same values."""
    return initializer.__class__.from_config(initializer.get_config())


def _masked_softmax(logits, mask, dtype):
    """Softmax over the last axis, computed in float32 whatever the compute dtype."""
    logits = ops.cast(logits, "float32")
    if mask is not None:
        logits = ops.where(mask, logits, _MASKED_LOGIT)
    return ops.cast(ops.softmax(logits, axis=-1), dtype)


def compute_attention_mask(
    query, value, attention_mask=None, use_causal_mask=False, query_mask=None, value_mask=None, key_mask=None
):
    """Combines every mask source into one boolean (B or 1, 1, T, S) mask, or None.

    The single place where masks meet. Keras polarity: True = may attend.

    Args:
        query, value: (B, T, ...) and (B, S, ...) tensors.
        attention_mask: (B, T, S), or (B, S) padding over the keys.
        use_causal_mask: if True, query t may attend to keys s <= t only.
        query_mask, value_mask, key_mask: (B, T), (B, S), (B, S) padding masks.
    """
    batch, query_length, key_length = query.shape[0], query.shape[1], value.shape[1]
    masks_BxTxS = []
    if attention_mask is not None:
        expected = {2: (batch, key_length), 3: (batch, query_length, key_length)}.get(len(attention_mask.shape))
        received = tuple(attention_mask.shape)
        if expected is None or any(
            want is not None and got is not None and got != want and not (axis == 0 and got == 1)
            for axis, (got, want) in enumerate(zip(received, expected))
        ):
            raise ValueError(
                "`attention_mask` must have shape (batch, query_length, key_length) = "
                f"{(batch, query_length, key_length)} or (batch, key_length) = {(batch, key_length)}. "
                f"Received: attention_mask.shape={received}"
            )
        attention_mask = ops.cast(attention_mask, "bool")
        masks_BxTxS.append(attention_mask[:, None, :] if len(received) == 2 else attention_mask)
    if query_mask is not None:
        masks_BxTxS.append(ops.cast(query_mask, "bool")[:, :, None])
    for padding_mask in (value_mask, key_mask):
        if padding_mask is not None:
            masks_BxTxS.append(ops.cast(padding_mask, "bool")[:, None, :])
    if use_causal_mask:
        query_position = ops.arange(ops.shape(query)[1])[:, None]
        key_position = ops.arange(ops.shape(value)[1])[None, :]
        masks_BxTxS.append(ops.greater_equal(query_position, key_position)[None, :, :])
    if not masks_BxTxS:
        return None
    mask_BxTxS = masks_BxTxS[0]
    for mask in masks_BxTxS[1:]:
        mask_BxTxS = ops.logical_and(mask_BxTxS, mask)
    return mask_BxTxS[:, None, :, :]
