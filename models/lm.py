"""A decoder-only causal language model (the LM1B study of the fixed-head-size paper)."""

import typing

import keras
from keras import ops

from concise_attention.models.bert import _check_sizes
from concise_attention.models.attention import attention_config
from concise_attention.models.builder import ArgumentsAreConfig
from concise_attention.models.embedding import PositionEmbedding
from concise_attention.models.transformer import build_blocks
from concise_attention.models.transformer import admin_initialize


def packed_segment_mask(segment_ids):
    """(B, T, T) mask for packed rows: attend within one segment, never onto padding (segment 0).

    Keras polarity (True = may attend). Rows packed tensor2tensor-style hold several
    sentences with segment ids 1, 2, ...; with the causal mask that the blocks add, a
    token attends to earlier tokens of its own sentence only.
    """
    segment_ids = ops.cast(segment_ids, "int32")
    same_segment = ops.equal(segment_ids[:, :, None], segment_ids[:, None, :])
    return ops.logical_and(same_segment, ops.not_equal(segment_ids, 0)[:, None, :])


def _norm_if(wanted, epsilon, dtype, name):
    return keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype, name=name) if wanted else None


@keras.saving.register_keras_serializable(package="concise_attention")
class CausalLM(ArgumentsAreConfig, keras.Model):
    """Decoder-only transformer LM with any attention variant.

    Inputs (dict of int32 (B, T)): `token_ids`; `segment_ids` (1, 2, ... per packed
    sentence, 0 for padding; all ones for one unpadded sentence a row) and `positions`
    (restarting at 0 for each packed sentence). Output: logits (B, T, vocab_size).

    Args:
        vocab_size, hidden_size, num_layers, num_heads, intermediate_size: sizes.
        attention: the attention variant as one nested config, e.g. {"type": "fixed", "head_size": 32};
            None is standard attention.
        max_sequence_length: longest sequence (rows of the learned position table).
        position_embedding: "learned" or "sinusoidal" (tensor2tensor timing signal).
        tie_embeddings: output projection = input embedding transposed.
        norm_position: "pre" (tensor2tensor; default) or "post" (needed by Admin).
        residual_scaling: "none" or "admin" (call `initialize_admin` on a batch).
        activation: feed-forward activation (tensor2tensor uses "relu").
        dropout, attention_dropout, layer_norm_epsilon: as named.
        kernel_initializer: initializer of every kernel (tensor2tensor: Xavier uniform).
    """

    def __init__(
        self,
        vocab_size,
        hidden_size,
        num_layers,
        num_heads,
        intermediate_size,
        attention: typing.Optional[dict] = None,
        max_sequence_length=256,
        position_embedding="learned",
        tie_embeddings=True,
        norm_position="pre",
        residual_scaling="none",
        activation="relu",
        dropout=0.1,
        attention_dropout=0.1,
        layer_norm_epsilon=1e-6,
        kernel_initializer="glorot_uniform",
        dtype=None,
        **kwargs,
    ):
        arguments = dict(locals())  # the constructor arguments, before any other local exists
        arguments["attention"] = attention = attention_config(attention)
        _check_sizes(dropout, attention_dropout, vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers)
        self._build_embeddings(vocab_size, hidden_size, max_sequence_length, position_embedding, tie_embeddings, dtype)
        # Post-LN blocks expect a normalised residual stream from the start (as BERT).
        self.embeddings_norm = _norm_if(norm_position == "post", layer_norm_epsilon, dtype, "embeddings_norm")
        self.embeddings_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embeddings_dropout")
        self.blocks = build_blocks(
            num_layers,
            num_heads=num_heads,
            intermediate_size=intermediate_size,
            attention=attention,
            activation=activation,
            norm_position=norm_position,
            residual_scaling=residual_scaling,
            dropout=dropout,
            attention_dropout=attention_dropout,
            layer_norm_epsilon=layer_norm_epsilon,
            kernel_initializer=kernel_initializer,
            dtype=dtype,
        )
        # Pre-LN leaves the residual stream unnormalised: one last norm before the logits.
        self.final_norm = _norm_if(norm_position == "pre", layer_norm_epsilon, dtype, "final_norm")
        super().__init__(*self._functional_graph(), dtype=dtype, **kwargs)
        self._keep_arguments(arguments)

    def _build_embeddings(
        self, vocab_size, hidden_size, max_sequence_length, position_embedding, tie_embeddings, dtype
    ):
        """The token embeddings (tied to the logits or not) and the position embeddings."""
        # tensor2tensor: Xavier kernels; embeddings N(0, 1/d) scaled by sqrt(d) on the way in,
        # so the tied softmax sees d^-0.5-sized rows and the residual stream unit-sized inputs.
        embedding_initializer = keras.initializers.RandomNormal(stddev=hidden_size**-0.5)
        self.token_embeddings = keras.layers.ReversibleEmbedding(
            vocab_size,
            hidden_size,
            tie_weights=tie_embeddings,
            embeddings_initializer=embedding_initializer,
            dtype=dtype,
            name="token_embeddings",
        )
        self.position_embeddings = PositionEmbedding(
            max_sequence_length,
            kind=position_embedding,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=1.0),
            dtype=dtype,
            name="position_embeddings",
        )

    def _functional_graph(self):
        """(inputs, outputs): the symbolic tensors that make this a functional model."""
        inputs = {
            name: keras.Input(shape=(None,), dtype="int32", name=name)
            for name in ("token_ids", "segment_ids", "positions")
        }
        x, mask = self._embed(inputs)
        for block in self.blocks:
            x = block(x, attention_mask=mask, use_causal_mask=True)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return inputs, self.token_embeddings(x, reverse=True)

    def _embed(self, inputs, training=None):
        tokens = self.token_embeddings(inputs["token_ids"])
        tokens = tokens * (tokens.shape[-1] ** 0.5)
        x = tokens + self.position_embeddings(tokens, positions=inputs["positions"])
        if self.embeddings_norm is not None:
            x = self.embeddings_norm(x)
        return self.embeddings_dropout(x, training=training), packed_segment_mask(inputs["segment_ids"])

    def initialize_admin(self, inputs):
        """Admin: sets every block's omegas from a profiling pass over `inputs` (a batch dict)."""
        inputs = {name: ops.convert_to_tensor(value, "int32") for name, value in inputs.items()}
        x, mask = self._embed(inputs, training=False)
        return admin_initialize(self.blocks, x, attention_mask=mask, use_causal_mask=True)
