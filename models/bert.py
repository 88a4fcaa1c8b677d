"""The BERT encoder (TF-Hub input/output names) and its masked-language-model pretrainer."""

import typing

import keras
from keras import ops

from concise_attention.models.attention import _check_positive_int
from concise_attention.models.attention import _check_rate
from concise_attention.models.attention import attention_config
from concise_attention.models.builder import ArgumentsAreConfig
from concise_attention.models.embedding import PositionEmbedding
from concise_attention.models.presets import PresetMixin
from concise_attention.models.presets import TaskPresetMixin
from concise_attention.models.transformer import build_blocks
from concise_attention.models.transformer import admin_initialize
from concise_attention.models.transformer import get_activation


def _check_sizes(dropout, attention_dropout, **sizes):
    """The sizes (positive integers) and dropout rates ([0, 1)) of a backbone, each error naming its argument."""
    for name, value in sizes.items():
        _check_positive_int(name, value)
    _check_rate("dropout", dropout)
    _check_rate("attention_dropout", attention_dropout)


@keras.saving.register_keras_serializable(package="concise_attention")
class BertEncoder(PresetMixin, ArgumentsAreConfig, keras.Model):
    """A BERT encoder with any attention variant, in the TF-Hub BERT contract.

    Inputs (dict of int32 (B, T)): `input_word_ids`, `input_mask` (1 = real token),
    `input_type_ids`. Outputs (dict): `sequence_output` (B, T, D), `pooled_output`
    (B, D) (tanh dense on the first token), `encoder_outputs` (one (B, T, D) per layer).
    Post-LN blocks as BERT; with attention={"type": "fixed", ...} this is the fixed-head-size
    BERT of Bhojanapalli et al. (2020), e.g. width 512 with head size 128.

    Args:
        vocab_size, hidden_size, num_layers, num_heads, intermediate_size: sizes.
        attention: the attention variant as one nested config, e.g. {"type": "fixed",
            "head_size": 128}; None is standard attention (see
            `models.attention.attention_config`).
        max_sequence_length: rows of the position table.
        type_vocab_size: number of segment types.
        activation: feed-forward activation ("gelu" = exact erf GELU, as BERT).
        dropout, attention_dropout: dropout rates.
        layer_norm_epsilon: LayerNormalization epsilon.
        residual_scaling: "none" or "admin" (then call `initialize_admin` on a batch).
        initializer_range: stddev of the truncated normal initializer.

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
        activation="gelu",
        dropout=0.1,
        attention_dropout=0.1,
        layer_norm_epsilon=1e-12,
        residual_scaling="none",
        initializer_range=0.02,
        dtype=None,
        **kwargs,
    ):
        arguments = dict(locals())  # the constructor arguments, before any other local exists
        arguments["attention"] = attention = attention_config(attention)
        _check_sizes(dropout, attention_dropout, vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers,
                     type_vocab_size=type_vocab_size)
        initializer = keras.initializers.TruncatedNormal(stddev=initializer_range)
        # === Layers ===
        self.word_embeddings = keras.layers.ReversibleEmbedding(
            vocab_size, hidden_size, embeddings_initializer=initializer, dtype=dtype, name="word_embeddings"
        )
        self.position_embeddings = PositionEmbedding(
            max_sequence_length, embeddings_initializer=initializer, dtype=dtype, name="position_embeddings"
        )
        self.type_embeddings = keras.layers.Embedding(
            type_vocab_size, hidden_size, embeddings_initializer=initializer, dtype=dtype, name="type_embeddings"
        )
        self.embeddings_norm = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="embeddings_norm")
        self.embeddings_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embeddings_dropout")
        self.blocks = build_blocks(
            num_layers, num_heads=num_heads, intermediate_size=intermediate_size, attention=attention, activation=activation,
            norm_position="post", residual_scaling=residual_scaling, dropout=dropout, attention_dropout=attention_dropout,
            layer_norm_epsilon=layer_norm_epsilon, kernel_initializer=initializer, dtype=dtype)
        self.pooler = keras.layers.Dense(hidden_size, activation="tanh", kernel_initializer=initializer, dtype=dtype, name="pooler")
        super().__init__(*self._functional_graph(), dtype=dtype, **kwargs)
        self._keep_arguments(arguments)

    def _functional_graph(self):
        """(inputs, outputs): the symbolic tensors that make this a functional model."""
        inputs = {name: keras.Input(shape=(None,), dtype="int32", name=name)
                  for name in ("input_word_ids", "input_mask", "input_type_ids")}
        x = self._embed(inputs)
        encoder_outputs = []
        for block in self.blocks:
            x = block(x, attention_mask=inputs["input_mask"])
            encoder_outputs.append(x)
        return inputs, {"sequence_output": x, "pooled_output": self.pooler(x[:, 0, :]), "encoder_outputs": encoder_outputs}

    def _embed(self, inputs, training=None):
        words = self.word_embeddings(inputs["input_word_ids"])
        x = words + self.position_embeddings(words) + self.type_embeddings(inputs["input_type_ids"])
        return self.embeddings_dropout(self.embeddings_norm(x), training=training)

    def initialize_admin(self, inputs):
        """Admin: sets every block's omegas from a profiling pass over `inputs` (a batch dict)."""
        inputs = {name: ops.convert_to_tensor(value, "int32") for name, value in inputs.items()}
        return admin_initialize(self.blocks, self._embed(inputs, training=False), attention_mask=inputs["input_mask"])


class EncoderHead(TaskPresetMixin, keras.Model):
    """A functional model around `self.encoder` whose config nests the encoder's and holds the
    head's own arguments (`head_arguments`), so `cls.from_config(get_config())` rebuilds it."""

    head_arguments = ()

    def get_config(self):
        return {"name": self.name, "trainable": self.trainable, "encoder": keras.layers.serialize(self.encoder),
                **{name: getattr(self, name) for name in self.head_arguments}}

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
            encoder.hidden_size,
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
        sequence_BxTxD = encoder({name: inputs[name] for name in encoder.input})["sequence_output"]
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
