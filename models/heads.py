"""Fine-tuning heads on a `BertEncoder`: sentence(-pair) prediction and answer spans.

As tf-models-official's BertClassifier and BertSpanLabeler: the classifier reads the
pooled [CLS] output (or its mean token vector: `pooling`) through dropout and a dense layer (N classes, or 1 output for a
regression score); the span labeler maps every token to a start and an end logit.
"""

import math
import types

import keras
from keras import ops

from concise_attention.models.bert import BertEncoder
from concise_attention.models.bert import EncoderHead
from concise_attention.models.checks import check_integer


POOLINGS = ("mean", "normalized_mean", "cls")  # also what an export serves as its embedding (export.savedmodels)


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
        pooling: what the head reads (POOLINGS): "cls", the encoder's pooled [CLS] output (BERT's);
            "mean", the mean of its token vectors over the real tokens; "normalized_mean", that mean
            at unit length. With "mean" or "normalized_mean" the encoder's pooler, which no output
            then reaches, is left out of the trainable weights.

    Output: `logits` (B, num_outputs), float32.
    """

    head_arguments = ("num_outputs", "dropout", "pooling")

    def __init__(self, encoder, num_outputs, dropout=None, pooling="cls", **kwargs):
        _check_encoder(encoder)
        check_integer("num_outputs", num_outputs)
        if pooling not in POOLINGS:
            raise ValueError(f"`pooling` must be one of {', '.join(POOLINGS)}. Received: pooling={pooling!r}")
        self.encoder = encoder
        rate = encoder.dropout if dropout is None else dropout
        self.head_dropout = keras.layers.Dropout(rate, name="head_dropout")
        self.classifier = keras.layers.Dense(
            num_outputs,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=encoder.initializer_range),
            dtype=encoder.dtype_policy,
            name="classifier",
        )
        inputs = dict(encoder.input)
        logits = ops.cast(self.classifier(self.head_dropout(sentence_vector(encoder, inputs, pooling))), "float32")
        super().__init__(inputs=inputs, outputs={"logits": logits}, **kwargs)
        self.num_outputs, self.dropout, self.pooling = num_outputs, dropout, pooling


def sentence_vector(encoder, inputs, pooling):
    """The vector of `inputs` a head reads, by `pooling` (see BertClassifier); with a mean, the encoder's [CLS]
    pooler no output reaches is made untrainable (it would get no gradient: Keras warns at every trace)."""
    outputs = encoder(inputs)
    if pooling != "cls":
        encoder.pooler.trainable = False
    return pool(outputs, inputs["input_mask"], pooling)


def pool(outputs, mask_BxT, pooling):
    """The sentence vector of an encoder's `outputs` by `pooling` (one of POOLINGS): "cls", its pooled [CLS]
    output; "mean", `mean_pooled` over the real tokens (`mask_BxT`); "normalized_mean", that mean at unit length
    (sentence-transformers' Pooling + Normalize). The heads, `encode` and the exported graphs all pool here."""
    if pooling == "cls":
        return outputs["pooled_output"]
    mean = mean_pooled(outputs["sequence_output"], mask_BxT)
    return unit(mean) if pooling == "normalized_mean" else mean


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
            2,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=encoder.initializer_range),
            dtype=encoder.dtype_policy,
            name="span_logits",
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

    Outputs, float32: `embedding` (B, D), the unit-length mean of the encoder's token vectors (what
    ships); `teacher_space` (B, teacher_width), a unit-length linear projection of that mean, for the
    training objective only; with a `teacher`, `relation` (B,): MiniLMv2's `relation_divergence` of
    the two last layers. The teacher is run frozen and is not saved with the model or its config.

    Args:
        encoder: a `BertEncoder`.
        teacher_width: the teacher's embedding width.
        teacher: None, or a `BertEncoder` of 2 or more layers reading the same vocabulary.
        relation_heads: with a teacher, the relation heads (dividing both last layers' widths).
    """

    head_arguments = ("teacher_width",)

    def __init__(self, encoder, teacher_width, teacher=None, relation_heads=None, **kwargs):
        _check_encoder(encoder)
        check_integer("teacher_width", teacher_width)
        self.encoder = encoder
        self.projection = keras.layers.Dense(
            teacher_width,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=encoder.initializer_range),
            dtype=encoder.dtype_policy,
            name="teacher_projection",
        )
        inputs = dict(encoder.input)
        encoded = encoder(inputs)
        pooled = mean_pooled(encoded["sequence_output"], inputs["input_mask"])
        outputs = {"embedding": unit(pooled), "teacher_space": unit(ops.cast(self.projection(pooled), "float32"))}
        if teacher is not None:
            relation_heads = check_relation_heads(teacher, encoder, relation_heads)
            self.relation = RelationDivergence(teacher, encoder.blocks[-1], relation_heads, name="relation")
            outputs["relation"] = self.relation(inputs, encoded["encoder_outputs"][-2])
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self.teacher_width = teacher_width


class RelationDivergence(keras.layers.Layer):
    """`relation_divergence` of a frozen teacher encoder (run in inference mode, inside this layer, no
    gradient) and the student's last block, given the encoder inputs and that block's input.

    Neither is tracked by this layer: the teacher's weights stay out of the model's weights, checkpoints
    and presets (the task builds it from its source), and the student's block is saved where the
    encoder holds it, so a model with this layer saves exactly the variables of one without.
    """

    def __init__(self, teacher, student_block, heads, **kwargs):
        super().__init__(**kwargs)
        teacher.trainable = False
        # A plain namespace, set past Keras' attribute tracking: neither Keras' saving (which walks
        # layers, lists, tuples and dicts) nor TensorFlow's checkpoints reach into it.
        object.__setattr__(self, "models", types.SimpleNamespace(teacher=teacher, student_block=student_block))
        self.heads = heads

    def call(self, inputs, student_block_input):
        teacher, student_block = self.models.teacher, self.models.student_block
        teacher_block_input = teacher(inputs, training=False)["encoder_outputs"][-2]
        teacher_qkv = [ops.stop_gradient(x) for x in teacher.blocks[-1].attention_projections(teacher_block_input)]
        student_qkv = student_block.attention_projections(student_block_input)
        return relation_divergence(teacher_qkv, student_qkv, inputs["input_mask"], self.heads)

    def compute_output_spec(self, inputs, student_block_input):
        return keras.KerasTensor(student_block_input.shape[:1], dtype="float32")


def attention_widths(encoder):
    """The query, key and value widths (the heads side by side) of `encoder`'s last layer."""
    attention = encoder.blocks[-1].attention
    return [
        math.prod(dense.partial_output_shape[1:])
        for dense in (attention.query_dense, attention.key_dense, attention.value_dense)
    ]


def check_relation_heads(teacher, student, relation_heads=None):
    """The relation heads for `teacher` and `student` (default: the teacher's head count), checked: both have
    2 or more layers and the count divides all six query, key and value widths."""
    _check_encoder(teacher)
    for role, encoder in (("teacher", teacher), ("student", student)):
        if len(encoder.blocks) < 2:
            raise ValueError(
                f"Relation distillation reads the input of the last of 2 or more layers; the {role} has {len(encoder.blocks)}."
            )
    heads = teacher.num_heads if relation_heads is None else relation_heads
    widths = {"teacher": attention_widths(teacher), "student": attention_widths(student)}
    if (
        isinstance(heads, bool)
        or not isinstance(heads, int)
        or heads < 1
        or any(w % heads for v in widths.values() for w in v)
    ):
        raise ValueError(
            f"`relation_heads` must be a positive integer dividing the last layers' query, key and value widths "
            f"(teacher {widths['teacher']}, student {widths['student']}). Received: relation_heads={heads!r}"
        )
    return heads


def relation_divergence(teacher_qkv, student_qkv, mask_BxT, heads):
    """MiniLMv2's self-attention relation distillation, per example (B,), float32.

    For queries, keys and values, each model's (B, T, width) heads are split into `heads`
    relation heads, each giving softmax(X X^T / sqrt(width/heads)) over the real tokens. The
    loss is KL(teacher || student), averaged over relation heads, real tokens and the three (a
    weight of 3 gives the paper's sum), so the models need only a common number of relation
    heads. Collaborative attention's queries and keys are its shared projection, before mixing.
    """
    mask = ops.cast(mask_BxT, "float32")
    key_bias_Bx1x1xS = ((1.0 - mask) * -1e9)[:, None, None, :]
    tokens = ops.maximum(ops.sum(mask, axis=1), 1.0)
    total = 0.0
    for teacher_BxTxW, student_BxTxV in zip(teacher_qkv, student_qkv):
        teacher_log = _relation_log_probabilities(teacher_BxTxW, key_bias_Bx1x1xS, heads)
        student_log = _relation_log_probabilities(student_BxTxV, key_bias_Bx1x1xS, heads)
        divergence_BxRxT = ops.sum(ops.exp(teacher_log) * (teacher_log - student_log), axis=-1)
        total = total + ops.sum(ops.mean(divergence_BxRxT, axis=1) * mask, axis=1) / tokens
    return total / 3.0


def _relation_log_probabilities(x_BxTxW, key_bias_Bx1x1xS, heads):
    x_BxTxW = ops.cast(x_BxTxW, "float32")
    size = x_BxTxW.shape[-1] // heads
    x_BxRxTxH = ops.transpose(
        ops.reshape(x_BxTxW, (ops.shape(x_BxTxW)[0], ops.shape(x_BxTxW)[1], heads, size)), (0, 2, 1, 3)
    )
    logits_BxRxTxS = ops.matmul(x_BxRxTxH, ops.transpose(x_BxRxTxH, (0, 1, 3, 2))) / math.sqrt(size)
    return ops.log_softmax(logits_BxRxTxS + key_bias_Bx1x1xS, axis=-1)
