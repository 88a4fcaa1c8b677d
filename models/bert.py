"""The BERT encoder (TF-Hub input/output names) and its masked-language-model pretrainer."""

import typing

import keras
from keras import ops

from concise_attention.models.attention import _check_rate
from concise_attention.models.attention import attention_config
from concise_attention.models.builder import ArgumentsAreConfig
from concise_attention.models.checks import check_integer
from concise_attention.models.embedding import PositionEmbedding
from concise_attention.models.embedding import RelativePositionBias
from concise_attention.models.presets import PresetMixin
from concise_attention.models.presets import TaskPresetMixin
from concise_attention.models.transformer import build_blocks
from concise_attention.models.transformer import admin_initialize
from concise_attention.models.transformer import get_activation


def _check_sizes(dropout, attention_dropout, **sizes):
    """The sizes (positive integers) and dropout rates ([0, 1)) of a backbone, each error naming its argument."""
    for name, value in sizes.items():
        check_integer(name, value)
    _check_rate("dropout", dropout)
    _check_rate("attention_dropout", attention_dropout)


def embedding_width(model):
    """The width of the sentence embedding of a BERT encoder's config (a dict): its output_size, else its width."""
    return int(model.get("output_size") or model["hidden_size"])


def _stem_width(a):
    """The token table's width from the constructor's arguments `a`, the funnel's settings checked: one line naming
    the argument."""
    if not a["stem_layers"]:
        return a["hidden_size"]
    for name in ("stem_width", "stem_heads", "stem_intermediate_size"):
        check_integer(name, a[name])
    if a["stem_width"] % a["stem_heads"]:
        raise ValueError(
            f"`stem_width` must be a multiple of `stem_heads`. Received: stem_width={a['stem_width']}, "
            f"stem_heads={a['stem_heads']}"
        )
    if a["relative_attention_buckets"] and a["stem_heads"] != a["num_heads"]:
        raise ValueError(
            "The relative position bias is shared by every layer: `stem_heads` must equal `num_heads`. "
            f"Received: stem_heads={a['stem_heads']}, num_heads={a['num_heads']}"
        )
    return a["stem_width"]


@keras.saving.register_keras_serializable(package="concise_attention")
class BertEncoder(PresetMixin, ArgumentsAreConfig, keras.Model):
    """A post-LN BERT encoder with any attention variant, in the TF-Hub BERT contract.

    Inputs, int32 (B, T): `input_word_ids`, `input_mask` (1 = token), `input_type_ids`.
    Outputs: `sequence_output` (B, T, E), `pooled_output` (B, E), `encoder_outputs` (per layer).

    Args:
        vocab_size, hidden_size, num_layers, num_heads, intermediate_size: sizes.
        attention: the nested attention config; None is standard attention.
        max_sequence_length, type_vocab_size (0: none), activation, dropout,
            attention_dropout, layer_norm_epsilon, initializer_range: as in BERT.
        position_offset: None, or p: real tokens at positions p, p + 1, ... (MPNet).
        relative_attention_buckets, relative_attention_max_distance: 0, or MPNet's
            relative position bias.
        residual_scaling: "none" or "admin" (then call `initialize_admin`).
        output_size: None, or E: a linear map to `sequence_output`.
        stem_layers, stem_width, stem_heads, stem_intermediate_size: 0, or a funnel: the token table and the
            first `stem_layers` layers (standard attention, `stem_heads` heads, feed-forward
            `stem_intermediate_size`) at `stem_width`, then a learned linear map (`stem_projection`) to
            `hidden_size`, where the `num_layers` layers run. `encoder_outputs` lists those layers only.

    Example:
    >>> encoder = BertEncoder(vocab_size=100, hidden_size=32, num_layers=2, num_heads=4,
    ...                       intermediate_size=64, attention={"type": "fixed", "head_size": 16})
    >>> ids = np.ones((2, 8), "int32")
    >>> encoder({"input_word_ids": ids, "input_mask": ids, "input_type_ids": 0 * ids})["pooled_output"].shape
    (2, 32)
    """

    def __init__(
        self,
        vocab_size,
        hidden_size,
        num_layers,
        num_heads,
        intermediate_size,
        attention: typing.Optional[dict] = None,
        max_sequence_length=512,
        type_vocab_size=2,
        position_offset=None,
        relative_attention_buckets=0,
        relative_attention_max_distance=128,
        activation="gelu",
        dropout=0.1,
        attention_dropout=0.1,
        layer_norm_epsilon=1e-12,
        residual_scaling="none",
        initializer_range=0.02,
        output_size=None,
        stem_layers=0,
        stem_width=None,
        stem_heads=None,
        stem_intermediate_size=None,
        dtype=None,
        **kwargs,
    ):
        arguments = dict(locals())  # the constructor arguments, before any other local exists
        arguments["attention"] = attention_config(attention)
        _check_sizes(dropout, attention_dropout, vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers)
        for name, value, least in (
            ("type_vocab_size", type_vocab_size, 0),
            ("position_offset", position_offset or 1, 1),
            ("relative_attention_buckets", relative_attention_buckets, 0),
            ("output_size", output_size or 1, 1),
            ("stem_layers", stem_layers, 0),
        ):
            check_integer(name, value, least)
        self.max_sequence_length, self.position_offset = max_sequence_length, position_offset  # read by _embed
        initializer = keras.initializers.TruncatedNormal(stddev=initializer_range)
        self._build_embeddings({**arguments, "hidden_size": _stem_width(arguments)}, initializer)
        self._build_layers(arguments, initializer)
        self.output_projection = (
            keras.layers.Dense(output_size, kernel_initializer=initializer, dtype=dtype, name="output_projection")
            if output_size
            else None
        )
        self.pooler = keras.layers.Dense(
            output_size or hidden_size, activation="tanh", kernel_initializer=initializer, dtype=dtype, name="pooler"
        )
        super().__init__(*self._functional_graph(), dtype=dtype, **kwargs)
        self._keep_arguments(arguments)

    def _build_layers(self, a, initializer):
        """A funnel's stem layers and projection (none without a funnel), then the `num_layers` blocks, from the
        constructor's arguments `a`."""
        shared = dict(
            activation=a["activation"],
            norm_position="post",
            dropout=a["dropout"],
            attention_dropout=a["attention_dropout"],
            layer_norm_epsilon=a["layer_norm_epsilon"],
            kernel_initializer=initializer,
            dtype=a["dtype"],
        )
        self.stem_blocks = build_blocks(
            a["stem_layers"],
            prefix="stem_layer",
            num_heads=a["stem_heads"],
            intermediate_size=a["stem_intermediate_size"],
            attention=attention_config(None),
            residual_scaling="none",
            **shared,
        )
        self.stem_projection = (
            keras.layers.Dense(
                a["hidden_size"], kernel_initializer=initializer, dtype=a["dtype"], name="stem_projection"
            )
            if a["stem_layers"]
            else None
        )
        self.blocks = build_blocks(
            a["num_layers"],
            num_heads=a["num_heads"],
            intermediate_size=a["intermediate_size"],
            attention=a["attention"],
            residual_scaling=a["residual_scaling"],
            **shared,
        )

    def _build_embeddings(self, a, initializer):
        """The word, position and token-type embeddings, the relative attention bias, their norm and dropout, from
        the constructor's arguments `a`."""
        dtype = a["dtype"]
        self.word_embeddings = keras.layers.ReversibleEmbedding(
            a["vocab_size"], a["hidden_size"], embeddings_initializer=initializer, dtype=dtype, name="word_embeddings"
        )
        self.position_embeddings = PositionEmbedding(
            a["max_sequence_length"] + (a["position_offset"] or 0),
            embeddings_initializer=initializer,
            dtype=dtype,
            name="position_embeddings",
        )
        self.type_embeddings = (
            keras.layers.Embedding(
                a["type_vocab_size"],
                a["hidden_size"],
                embeddings_initializer=initializer,
                dtype=dtype,
                name="type_embeddings",
            )
            if a["type_vocab_size"]
            else None
        )
        self.relative_attention_bias = (
            RelativePositionBias(
                a["num_heads"],
                a["max_sequence_length"],
                a["relative_attention_buckets"],
                a["relative_attention_max_distance"],
                dtype=dtype,
                name="relative_attention_bias",
            )
            if a["relative_attention_buckets"]
            else None
        )
        self.embeddings_norm = keras.layers.LayerNormalization(
            epsilon=a["layer_norm_epsilon"], dtype=dtype, name="embeddings_norm"
        )
        self.embeddings_dropout = keras.layers.Dropout(a["dropout"], dtype=dtype, name="embeddings_dropout")

    def _functional_graph(self):
        """(inputs, outputs): the symbolic tensors that make this a functional model."""
        inputs = {
            name: keras.Input(shape=(None,), dtype="int32", name=name)
            for name in ("input_word_ids", "input_mask", "input_type_ids")
        }
        x = self._embed(inputs)
        bias = self.attention_bias(x)
        x = self._stem(x, inputs["input_mask"], bias)
        encoder_outputs = []
        for block in self.blocks:
            x = block(x, attention_mask=inputs["input_mask"], attention_bias=bias)
            encoder_outputs.append(x)
        if self.output_projection is not None:
            x = self.output_projection(x)
        return inputs, {
            "sequence_output": x,
            "pooled_output": self.pooler(x[:, 0, :]),
            "encoder_outputs": encoder_outputs,
        }

    def _stem(self, x, mask, bias, training=None):
        """The funnel's stem layers and projection to `hidden_size` on embedded tokens `x`; `x` itself without one."""
        for block in self.stem_blocks:
            x = block(x, attention_mask=mask, attention_bias=bias, training=training)
        return x if self.stem_projection is None else self.stem_projection(x)

    @property
    def token_width(self):
        """The width of the token table (and of the stem layers, where there are any)."""
        return self.stem_width if self.stem_layers else self.hidden_size

    @property
    def embedding_size(self):
        """The width of `sequence_output` and of a sentence embedding pooled from it."""
        return embedding_width({"output_size": self.output_size, "hidden_size": self.hidden_size})

    def _embed(self, inputs, training=None):
        words = self.word_embeddings(inputs["input_word_ids"])
        length = words.shape[1]
        if isinstance(length, int) and length > self.max_sequence_length:
            raise ValueError(
                f"The sequence is longer than the model's max_sequence_length={self.max_sequence_length}. "
                f"Received: sequence length {length}"
            )
        positions = None
        if self.position_offset is not None:
            mask = ops.cast(inputs["input_mask"], "int32")
            positions = ops.cumsum(mask, axis=1) * mask + (self.position_offset - 1)
        x = words + self.position_embeddings(words, positions=positions)
        if self.type_embeddings is not None:
            x = x + self.type_embeddings(inputs["input_type_ids"])
        return self.embeddings_dropout(self.embeddings_norm(x), training=training)

    def attention_bias(self, x):
        """The relative position bias (1, N, T, T) of a sequence like `x` (B, T, D), or None."""
        return self.relative_attention_bias(x) if self.relative_attention_bias else None

    def initialize_admin(self, inputs):
        """Admin: sets every block's omegas from a profiling pass over `inputs` (a batch dict)."""
        inputs = {name: ops.convert_to_tensor(value, "int32") for name, value in inputs.items()}
        x = self._embed(inputs, training=False)
        bias = self.attention_bias(x)
        x = self._stem(x, inputs["input_mask"], bias, training=False)
        return admin_initialize(self.blocks, x, attention_mask=inputs["input_mask"], attention_bias=bias)


class EncoderHead(TaskPresetMixin, keras.Model):
    """A functional model around `self.encoder` whose config nests the encoder's and holds the
    head's own arguments (`head_arguments`), so `cls.from_config(get_config())` rebuilds it."""

    head_arguments = ()

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "encoder": keras.layers.serialize(self.encoder),
            **{name: getattr(self, name) for name in self.head_arguments},
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["encoder"] = keras.layers.deserialize(config["encoder"])
        return cls(**config)


@keras.saving.register_keras_serializable(package="concise_attention")
class BertPretrainer(EncoderHead):
    """BERT's masked-language-model head on a `BertEncoder`, output embedding tied.

    Inputs: the encoder's three plus `masked_lm_positions` (int32 (B, P)). Output:
    `mlm_logits` (B, P, vocab_size) = LN(act(W h + b)) E^T + bias, with E the
    encoder's word embeddings (as BERT and tf-models-official's MaskedLM).

    Args:
        encoder: a `BertEncoder`.
        activation: activation of the head's transform (default: the encoder's).
    """

    head_arguments = ("activation",)

    def __init__(self, encoder, activation=None, **kwargs):
        if not isinstance(encoder, BertEncoder):
            raise ValueError(f"`encoder` must be a BertEncoder. Received: encoder={encoder!r}")
        self.encoder = encoder
        self.transform = keras.layers.Dense(
            encoder.token_width,
            activation=get_activation(activation or encoder.activation),
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=encoder.initializer_range),
            dtype=encoder.dtype_policy,
            name="mlm_transform",
        )
        self.transform_norm = keras.layers.LayerNormalization(
            epsilon=encoder.layer_norm_epsilon, dtype=encoder.dtype_policy, name="mlm_transform_norm"
        )
        self.output_bias = _Bias(dtype=encoder.dtype_policy, name="mlm_output_bias")

        inputs = dict(encoder.input)
        inputs["masked_lm_positions"] = keras.Input(shape=(None,), dtype="int32", name="masked_lm_positions")
        sequence_BxTxD = encoder({name: inputs[name] for name in encoder.input})["encoder_outputs"][-1]
        logits = self.masked_lm_logits(sequence_BxTxD, inputs["masked_lm_positions"])
        super().__init__(inputs=inputs, outputs={"mlm_logits": logits}, **kwargs)
        self.activation = activation

    def masked_lm_logits(self, sequence_BxTxD, positions_BxP):
        """The MLM head on encoder outputs already computed: logits (B, P, vocab_size)."""
        masked_BxPxD = ops.take_along_axis(sequence_BxTxD, positions_BxP[:, :, None], axis=1)
        hidden = self.transform_norm(self.transform(masked_BxPxD))
        return self.output_bias(self.encoder.word_embeddings(hidden, reverse=True))


@keras.saving.register_keras_serializable(package="concise_attention")
class _Bias(keras.layers.Layer):
    """Adds a learned bias over the last axis (the MLM output bias)."""

    def build(self, input_shape):
        self.bias = self.add_weight(name="bias", shape=(input_shape[-1],), initializer="zeros")

    def call(self, x):
        return ops.add(x, self.bias)
