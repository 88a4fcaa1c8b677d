"""Position embeddings (learned or sinusoidal) that refuse sequences longer than they cover."""

import math

import keras
from keras import ops

POSITION_EMBEDDINGS = ("learned", "sinusoidal")


@keras.saving.register_keras_serializable(package="concise_attention")
class PositionEmbedding(keras.layers.Layer):
    """Adds nothing; returns the (B or 1, T, D) embeddings of positions.

    Args:
        max_sequence_length: the longest sequence the model accepts.
        kind: "learned" (a trained table, BERT) or "sinusoidal" (the fixed timing
            signal of tensor2tensor: sin and cos halves, timescales 1 to 1e4).
        embeddings_initializer: initializer of the learned table.

    Call arguments:
        inputs: (B, T, D) tensor whose length and width are used.
        positions: optional (B, T) integer positions (packed rows restart at 0 per
            sentence); defaults to 0..T-1.

    A sequence longer than `max_sequence_length` is a ValueError when the length is
    known while tracing (always under XLA and JAX); with a dynamic length the table
    lookup itself fails on the out-of-range index.
    """

    def __init__(self, max_sequence_length, kind="learned", embeddings_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if isinstance(max_sequence_length, bool) or not isinstance(max_sequence_length, int) or max_sequence_length < 1:
            raise ValueError(
                f"`max_sequence_length` must be a positive integer. Received: max_sequence_length={max_sequence_length!r}"
            )
        if kind not in POSITION_EMBEDDINGS:
            raise ValueError(f"`kind` must be one of {POSITION_EMBEDDINGS}. Received: kind={kind!r}")
        self.max_sequence_length = max_sequence_length
        self.kind = kind
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, inputs_shape, positions_shape=None):
        width = inputs_shape[-1]
        if self.kind == "learned":
            self.embeddings = self.add_weight(
                name="embeddings", shape=(self.max_sequence_length, width), initializer=self.embeddings_initializer
            )
        elif width % 2:
            raise ValueError(f"Sinusoidal position embeddings need an even width. Received: width={width}")

    def _table(self, width):
        if self.kind == "learned":
            return self.embeddings
        half = width // 2
        inverse_timescales = ops.exp(ops.arange(half, dtype="float32") * -(math.log(1e4) / max(half - 1, 1)))
        angles = ops.arange(self.max_sequence_length, dtype="float32")[:, None] * inverse_timescales[None, :]
        return ops.cast(ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1), self.compute_dtype)

    def call(self, inputs, positions=None):
        length = inputs.shape[1]
        if isinstance(length, int) and length > self.max_sequence_length:
            raise ValueError(
                f"The sequence is longer than the model's max_sequence_length={self.max_sequence_length}. "
                f"Received: sequence length {length}"
            )
        table = self._table(inputs.shape[-1])
        if positions is None:
            return ops.take(table, ops.arange(ops.shape(inputs)[1]), axis=0)[None, :, :]
        return ops.take(table, ops.cast(positions, "int32"), axis=0)

    def get_config(self):
        config = super().get_config()
        config.update(
            max_sequence_length=self.max_sequence_length,
            kind=self.kind,
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
        )
        return config
