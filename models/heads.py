"""Fine-tuning heads on a `BertEncoder`: sentence(-pair) prediction and answer spans.

As tf-models-official's BertClassifier and BertSpanLabeler: the classifier reads the
pooled [CLS] output through dropout and a dense layer (N classes, or 1 output for a
regression score); the span labeler maps every token to a start and an end logit.
"""

import keras
from keras import ops

from concise_attention.models.bert import BertEncoder
from concise_attention.models.bert import EncoderHead


def _check_encoder(encoder):
    if not isinstance(encoder, BertEncoder):
        raise ValueError(f"`encoder` must be a BertEncoder. Received: encoder={encoder!r}")


@keras.saving.register_keras_serializable(package="concise_attention")
class BertClassifier(EncoderHead):
    """Logits of `num_outputs` classes (or one regression score) from the pooled output.

    Args:
        encoder: a `BertEncoder`.
        num_outputs: classes (a regression head has 1).
        dropout: dropout rate on the pooled output (default: the encoder's).

    Output: `logits` (B, num_outputs), float32.
    """

    head_arguments = ("num_outputs", "dropout")

    def __init__(self, encoder, num_outputs, dropout=None, **kwargs):
        _check_encoder(encoder)
        if isinstance(num_outputs, bool) or not isinstance(num_outputs, int) or num_outputs < 1:
            raise ValueError(f"`num_outputs` must be a positive integer. Received: num_outputs={num_outputs!r}")
        self.encoder = encoder
        rate = encoder.dropout if dropout is None else dropout
        self.head_dropout = keras.layers.Dropout(rate, name="head_dropout")
        self.classifier = keras.layers.Dense(
            num_outputs, kernel_initializer=keras.initializers.TruncatedNormal(stddev=encoder.initializer_range),
            dtype=encoder.dtype_policy, name="classifier",
        )
        inputs = dict(encoder.input)
        pooled = encoder(inputs)["pooled_output"]
        logits = ops.cast(self.classifier(self.head_dropout(pooled)), "float32")
        super().__init__(inputs=inputs, outputs={"logits": logits}, **kwargs)
        self.num_outputs, self.dropout = num_outputs, dropout


@keras.saving.register_keras_serializable(package="concise_attention")
class BertSpanLabeler(EncoderHead):
    """Start and end logits of an answer span over the tokens (SQuAD).

    Output: `start_logits`, `end_logits` (B, T), float32; padding positions get -1e9.
    """

    head_arguments = ()

    def __init__(self, encoder, **kwargs):
        _check_encoder(encoder)
        self.encoder = encoder
        self.span = keras.layers.Dense(
            2, kernel_initializer=keras.initializers.TruncatedNormal(stddev=encoder.initializer_range),
            dtype=encoder.dtype_policy, name="span_logits",
        )
        inputs = dict(encoder.input)
        logits_BxTx2 = ops.cast(self.span(encoder(inputs)["sequence_output"]), "float32")
        padding = (1.0 - ops.cast(inputs["input_mask"], "float32")) * -1e9
        super().__init__(
            inputs=inputs,
            outputs={"start_logits": logits_BxTx2[..., 0] + padding, "end_logits": logits_BxTx2[..., 1] + padding},
            **kwargs,
        )


def mean_pooled(sequence_BxTxD, mask_BxT):
    """The mean of the non-padding token vectors, float32 (B, D): sentence-transformers' mean pooling."""
    mask = ops.cast(mask_BxT, "float32")[:, :, None]
    total = ops.sum(ops.cast(sequence_BxTxD, "float32") * mask, axis=1)
    return total / ops.maximum(ops.sum(mask, axis=1), 1e-9)


def unit(vectors_BxD):
    """Rows scaled to unit length (zero rows stay zero)."""
    return vectors_BxD / ops.maximum(ops.sqrt(ops.sum(ops.square(vectors_BxD), axis=-1, keepdims=True)), 1e-12)


@keras.saving.register_keras_serializable(package="concise_attention")
class SentenceEmbedder(EncoderHead):
    """A sentence embedding and its projection into a teacher's embedding space (distillation).

    Outputs, float32: `embedding` (B, D) the unit-length mean of the encoder's token vectors
    (what the exported encoder serves, at the student's own width D); `teacher_space`
    (B, teacher_width) a unit-length linear projection of the same mean, trained to match the
    teacher's embedding where the widths differ. Only the encoder ships: the projection serves
    the training objective and the cosine-to-teacher measure.

    Args:
        encoder: a `BertEncoder`.
        teacher_width: the teacher's embedding width.
    """

    head_arguments = ("teacher_width",)

    def __init__(self, encoder, teacher_width, **kwargs):
        _check_encoder(encoder)
        if isinstance(teacher_width, bool) or not isinstance(teacher_width, int) or teacher_width < 1:
            raise ValueError(f"`teacher_width` must be a positive integer. Received: teacher_width={teacher_width!r}")
        self.encoder = encoder
        self.projection = keras.layers.Dense(
            teacher_width, kernel_initializer=keras.initializers.TruncatedNormal(stddev=encoder.initializer_range),
            dtype=encoder.dtype_policy, name="teacher_projection",
        )
        inputs = dict(encoder.input)
        pooled = mean_pooled(encoder(inputs)["sequence_output"], inputs["input_mask"])
        outputs = {"embedding": unit(pooled), "teacher_space": unit(ops.cast(self.projection(pooled), "float32"))}
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self.teacher_width = teacher_width
