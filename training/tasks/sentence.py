"""Sentence(-pair) tasks: `classification` (GLUE's classification tasks, users' TSV files, the
shipped WordNet topics) and `regression` (STS-B), as tf-models-official's SentencePredictionTask.

`task.dataset` names the data:
    glue/<task>        tensorflow-datasets `glue/<task>` (task.data_dir: its data_dir, gs:// too)
    glue_tsv/<task>    the original GLUE files <data_dir>/train.tsv, dev.tsv (dev_matched.tsv for MNLI)
    tsv                users' own <data_dir>/train.tsv, dev.tsv with a header naming sentence
                       (or sentence1, sentence2) and label
    wordnet_topics     the labelled sample shipped with the package (6 topics, 3,600 definitions)
Inputs are [CLS] a [SEP] (b [SEP]) packed to training.sequence_length (round-robin truncation).
The final evaluation covers the whole dev split (padded to whole batches, the padding weighted 0).
"""

import dataclasses
import pathlib
import typing

import keras
import numpy as np
import tensorflow as tf

from concise_attention.models.heads import POOLINGS
from concise_attention.models.heads import BertClassifier
from concise_attention.training.data import glue
from concise_attention.training.tasks import metrics as metric_functions
from concise_attention.training.tasks.base import ServingSignature
from concise_attention.training.tasks.base import Task
from concise_attention.training.tasks.base import TaskData
from concise_attention.training.tasks.base import TaskSettings

SHIPPED = {"wordnet_topics": pathlib.Path(__file__).parent.parent / "data" / "wordnet_topics"}


@dataclasses.dataclass(frozen=True)
class SentenceSettings(TaskSettings):
    """dataset: see the module docstring; labels: class names in id order (default: the sorted
    labels of the training split); text_pairs: whether inputs are pairs (default: read off the
    data); dropout: on the pooled output (default: the encoder's); pooling: what the head reads
    (`BertClassifier`: "cls", "mean" or "normalized_mean"; default: "mean" where task.init records a sentence
    embedding, a distill run, a sentence encoder preset or sentence-transformers folder; else "cls")."""

    dataset: str = "glue/mrpc"
    data_dir: typing.Optional[str] = None
    labels: typing.Optional[list] = None
    text_pairs: typing.Optional[bool] = None
    dropout: typing.Optional[float] = None
    pooling: typing.Optional[str] = None

    def __post_init__(self):
        if self.pooling is not None and self.pooling not in POOLINGS:
            raise ValueError(
                f"`task.pooling` must be one of {', '.join(POOLINGS)}. Received: task.pooling={self.pooling!r}"
            )
        kind, _, task = self.dataset.partition("/")
        if not (kind in ("glue", "glue_tsv") and task in glue.GLUE_TASKS) and self.dataset not in ("tsv", *SHIPPED):
            raise ValueError(
                f"`task.dataset` must be glue/<task>, glue_tsv/<task> (task one of {sorted(glue.GLUE_TASKS)}), "
                f"tsv or one of {sorted(SHIPPED)}. Received: task.dataset={self.dataset!r}"
            )
        if (kind == "glue_tsv" or self.dataset == "tsv") and not self.data_dir:
            raise ValueError(f"task.dataset={self.dataset!r} reads TSV files: set task.data_dir to their folder.")
        if self.labels is not None:
            object.__setattr__(self, "labels", _label_names(self.labels))

    def source(self):
        """(GLUE task name or "tsv", "tsv" | "tfds", data_dir)."""
        kind, _, task = self.dataset.partition("/")
        if self.dataset in SHIPPED:
            return glue.GENERIC_TSV, "tsv", str(SHIPPED[self.dataset])
        if self.dataset == "tsv":
            return glue.GENERIC_TSV, "tsv", self.data_dir
        return task, ("tfds" if kind == "glue" else "tsv"), self.data_dir


def _label_names(labels):
    """task.labels as strings, the way the TSV files hold them (YAML reads `[0, 1]` as integers), distinct, at least 2."""
    if not isinstance(labels, (list, tuple)) or any(
        isinstance(label, bool) or not isinstance(label, (str, int)) for label in labels
    ):
        raise ValueError(
            f"`task.labels` must be a list of label names (strings or integers). Received: task.labels={labels!r}"
        )
    names = [str(label) for label in labels]
    if len(set(names)) != len(names) or len(names) < 2:
        raise ValueError(f"`task.labels` must name at least 2 distinct labels. Received: task.labels={labels!r}")
    return names


class ClassificationTask(Task):
    """A sentence or a pair -> one of N classes; accuracy, plus F1 (MRPC, QQP) or Matthews (CoLA)."""

    name, Config = "classification", SentenceSettings
    regression = False

    def check(self):
        super().check()
        task, _, _ = self.settings.source()
        if task != glue.GENERIC_TSV and glue.glue_task(task).is_regression != self.regression:
            raise ValueError(
                f"task.dataset={self.settings.dataset!r} is a {'regression' if not self.regression else 'classification'} "
                f"task: use task.name={'regression' if not self.regression else 'classification'}."
            )

    def load_data(self):
        task, source, data_dir = self.settings.source()
        self.train_examples = glue.glue_examples(task, "train", data_dir, source)
        self.dev_examples = glue.glue_examples(task, "dev", data_dir, source)
        self.train_labels = self._labels(self.train_examples, glue.glue_source(task, "train", data_dir, source))
        self.dev_labels = self._labels(self.dev_examples, glue.glue_source(task, "dev", data_dir, source))
        if self.settings.text_pairs is None:
            pairs = any(example.text_b is not None for example in self.train_examples)
            self.settings = dataclasses.replace(self.settings, text_pairs=pairs)
        self.pairs = self.settings.text_pairs

    def _labels(self, examples, source):
        if self.settings.labels is None:
            self.settings = dataclasses.replace(
                self.settings, labels=glue.label_vocabulary(self.train_examples, source)
            )
        return glue.encode_labels(examples, self.settings.labels, source)

    def num_train_examples(self):
        return len(self.train_examples)

    def build_model(self, backbone):
        return BertClassifier(
            backbone,
            num_outputs=1 if self.regression else len(self.settings.labels),
            dropout=self.settings.dropout,
            pooling=self.settings.pooling or "cls",
        )

    def compile_arguments(self):
        # "mean_with_sample_weight": the held-out batches' padding rows (weight 0) do not dilute val_loss
        return {
            "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight"),
            "weighted_metrics": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        }

    def datasets(self, tokenizer, skip_batches):
        training = self.training
        train = _texts_dataset(self.train_examples, self.train_labels, training.batch_size)
        train = train.repeat().shuffle(len(self.train_examples), seed=training.seed, reshuffle_each_iteration=True)
        train = train.batch(training.batch_size, drop_remainder=True).skip(skip_batches)
        pack = _packer(tokenizer, training.sequence_length, self.pairs)
        # The final evaluation reads the whole dev split, whatever training.eval_batches keeps
        # of it for the per-epoch val_loss.
        dev = _padded_eval(self.dev_examples, self.dev_labels, training.batch_size).map(pack).cache()
        return TaskData(train.map(pack).prefetch(tf.data.AUTOTUNE), dev, final=dev)

    def serving_signature(self, model):
        """`text` (and `text_b` for a pair task) -> `probabilities` [batch, classes] and `label`
        (the class name)."""
        names = tf.constant(self.settings.labels)

        def outputs(inputs):
            probabilities = tf.nn.softmax(model(inputs, training=False)["logits"], axis=-1)
            return {"probabilities": probabilities, "label": tf.gather(names, tf.argmax(probabilities, axis=-1))}

        return ServingSignature(self._serving_texts(), outputs)

    def _serving_texts(self):
        return ("text", "text_b") if self.settings.text_pairs else ("text",)

    def predictions(self, model, eval_data):
        """Model outputs on the whole dev split (padding rows dropped)."""
        logits = model.predict(eval_data, verbose=0)["logits"][: len(self.dev_examples)]
        return logits

    def dev_loss(self, logits):
        """The loss over the dev examples alone, a plain mean: the empty rows that fill the last batch, whose
        weight is 0, count for nothing (`model.evaluate` weighs each batch by its size, padding included)."""
        labels = self.dev_labels[:, None] if self.regression else self.dev_labels
        return float(np.mean(keras.ops.convert_to_numpy(self.compile_arguments()["loss"].call(labels, logits))))

    def evaluate(self, model, final):
        logits = self.predictions(model, final)
        predicted = np.argmax(logits, axis=-1)
        labels = self.dev_labels
        results = {
            "eval_loss": self.dev_loss(logits),
            "eval_accuracy": metric_functions.accuracy(labels, predicted),
            "majority_class_accuracy": metric_functions.accuracy(
                labels, np.full_like(labels, np.bincount(self.train_labels).argmax())
            ),
        }
        task, _, _ = self.settings.source()
        if task != glue.GENERIC_TSV and "f1" in glue.glue_task(task).metrics:
            results["eval_f1"] = metric_functions.f1(
                labels, predicted, positive_label=glue.positive_label_id(task, self.settings.labels)
            )
        if task == "cola":
            results["eval_matthews_corrcoef"] = metric_functions.matthews_corrcoef(labels, predicted)
        return results


class RegressionTask(ClassificationTask):
    """A sentence pair -> a score (STS-B); mean squared error, Pearson and Spearman."""

    name = "regression"
    regression = True

    def _labels(self, examples, source):
        scores = []
        for index, example in enumerate(examples):
            try:
                scores.append(float(example.label))
            except (TypeError, ValueError):
                where = f"line {example.line}" if example.line else f"example {index}"
                raise ValueError(
                    f"{source} {where}: a regression label must be a number. Received: {example.label!r}"
                ) from None
        return np.asarray(scores, "float32")

    def build_model(self, backbone):
        return BertClassifier(
            backbone, num_outputs=1, dropout=self.settings.dropout, pooling=self.settings.pooling or "cls"
        )

    def compile_arguments(self):
        return {"loss": keras.losses.MeanSquaredError(reduction="mean_with_sample_weight")}

    def serving_signature(self, model):
        """`text` (and `text_b`) -> `score` [batch]."""
        return ServingSignature(
            self._serving_texts(), lambda inputs: {"score": model(inputs, training=False)["logits"][:, 0]}
        )

    def evaluate(self, model, final):
        logits = self.predictions(model, final)
        scores = logits[:, 0]
        return {
            "eval_loss": self.dev_loss(logits),
            "eval_pearson": metric_functions.pearson(self.dev_labels, scores),
            "eval_spearman": metric_functions.spearman(self.dev_labels, scores),
        }


def _texts_dataset(examples, labels, batch_size, weights=None):
    text_a = [example.text_a for example in examples]
    text_b = [example.text_b or "" for example in examples]
    weights = np.ones(len(examples), "float32") if weights is None else weights
    labels = np.asarray(labels)
    if labels.dtype.kind == "f":
        labels = labels[:, None]
    return tf.data.Dataset.from_tensor_slices(((text_a, text_b), labels, weights))


def _padded_eval(examples, labels, batch_size):
    """The whole dev split in static batches: padded with empty rows of weight 0."""
    padding = -len(examples) % batch_size
    padded = list(examples) + [glue.TextExample("", None, None)] * padding
    labels = np.concatenate([np.asarray(labels), np.zeros(padding, np.asarray(labels).dtype)])
    weights = np.concatenate([np.ones(len(examples), "float32"), np.zeros(padding, "float32")])
    return _texts_dataset(padded, labels, batch_size, weights).batch(batch_size, drop_remainder=True)


def _packer(tokenizer, sequence_length, pairs):
    """(texts, labels, weights) batches -> (encoder inputs, labels, weights), int32 (B, T): packed as the
    exported preprocessor packs them (`WordPieceTokenizer.pack_batch`)."""

    def pack(texts, labels, weights):
        return tokenizer.pack_batch([texts[0], texts[1]] if pairs else [texts[0]], sequence_length), labels, weights

    return pack
