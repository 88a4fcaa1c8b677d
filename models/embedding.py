"""Position embeddings (learned or sinusoidal) that refuse sequences longer than they cover, and MPNet's
relative position bias."""

import math

import keras
import numpy as np
from keras import ops

from concise_attention.models.checks import check_integer

POSITION_EMBEDDINGS = ("learned", "sinusoidal")


@keras.saving.register_keras_serializable(package="concise_attention")
class PositionEmbedding(keras.layers.Layer):
    """Adds nothing; returns the (B or 1, T, D) embeddings of positions.

    Args:
        max_sequence_length: the longest sequence the model accepts.
        kind: "learned" (a trained table, BERT) or "sinusoidal" (tensor2tensor's fixed timing
            signal: sin and cos halves, timescales 1 to 1e4).
        embeddings_initializer: initializer of the learned table.

    Call arguments:
        inputs: (B, T, D) tensor whose length and width are used.
        positions: optional (B, T) integer positions; defaults to 0..T-1.

    A sequence longer than `max_sequence_length` is a ValueError when its length is known
    while tracing; otherwise the table lookup fails.
    """

    def __init__(self, max_sequence_length, kind="learned", embeddings_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        check_integer("max_sequence_length", max_sequence_length)
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


def relative_position_buckets(max_length, num_buckets, max_distance):
    """The bucket (int32) of each relative position r = key - query, r = -(max_length - 1) .. max_length - 1, in
    that order: MPNet's (and T5's bidirectional) scheme, computed as Hugging Face's `relative_position_bucket`
    does it in float32. Half the buckets are for keys before the query, half for keys after; in each half,
    distances below a quarter of the buckets have one bucket each, longer ones share logarithmically wider
    buckets up to `max_distance`, beyond which all share the last."""
    relative = np.arange(-(max_length - 1), max_length)
    half = num_buckets // 2
    exact = half // 2
    distance = np.abs(relative)
    scaled = np.log(np.maximum(distance, 1).astype(np.float32) / np.float32(exact)) / np.float32(
        math.log(max_distance / exact)
    )
    large = np.minimum(exact + (scaled * np.float32(half - exact)).astype(np.int64), half - 1)
    return ((relative > 0) * half + np.where(distance < exact, distance, large)).astype("int32")


@keras.saving.register_keras_serializable(package="concise_attention")
class RelativePositionBias(keras.layers.Layer):
    """MPNet's relative position bias: a learned (num_buckets, num_heads) table, looked up once per sequence by the
    bucket of each key's position relative to each query (`relative_position_buckets`) and added to every
    layer's attention logits.

    Args:
        num_heads: attention heads (one bias per head and bucket).
        max_sequence_length: the longest sequence it is called on.
        num_buckets: buckets (even, at least 4; MPNet: 32).
        max_distance: the distance from which all positions share the last bucket (MPNet: 128).

    Call arguments:
        inputs: (B, T, D) tensor whose length is used.

    Returns:
        (1, num_heads, T, T) biases.
    """

    def __init__(
        self, num_heads, max_sequence_length, num_buckets=32, max_distance=128, embeddings_initializer="zeros", **kwargs
    ):
        super().__init__(**kwargs)
        for name, value, least in (
            ("num_heads", num_heads, 1),
            ("max_sequence_length", max_sequence_length, 1),
            ("num_buckets", num_buckets, 4),
            ("max_distance", max_distance, 1),
        ):
            check_integer(name, value, least)
        if num_buckets % 2 or max_distance <= num_buckets // 4:
            raise ValueError(
                f"`num_buckets` must be even and `max_distance` above num_buckets / 4. "
                f"Received: num_buckets={num_buckets}, max_distance={max_distance}"
            )
        self.num_heads, self.max_sequence_length = num_heads, max_sequence_length
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self._buckets = relative_position_buckets(max_sequence_length, num_buckets, max_distance)

    def build(self, inputs_shape):
        self.embeddings = self.add_weight(
            name="embeddings", shape=(self.num_buckets, self.num_heads), initializer=self.embeddings_initializer
        )

    def call(self, inputs):
        length = ops.shape(inputs)[1]
        positions = ops.arange(length)
        relative_TxT = positions[None, :] - positions[:, None] + (self.max_sequence_length - 1)
        bias_TxTxN = ops.take(self.embeddings, ops.take(ops.convert_to_tensor(self._buckets), relative_TxT), axis=0)
        return ops.cast(ops.transpose(bias_TxTxN, (2, 0, 1))[None], self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            max_sequence_length=self.max_sequence_length,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
        )
        return config
