"""`span_qa`: extractive question answering (SQuAD v1.1), as google-research/bert's run_squad.py.

`task.dataset` names the data:
    squad/v1.1    tensorflow-datasets `squad/v1.1` (task.data_dir: its data_dir, gs:// too)
    squad_json    the original files <data_dir>/train-v1.1.json and dev-v1.1.json
Every example becomes `[CLS] question [SEP] window [SEP]` rows of training.sequence_length
tokens sliding over its context by `doc_stride` (`training.data.squad.make_features`). Training
examples whose answer text is not found at its offset are dropped, as BERT drops them; a
training window that does not hold the whole answer points at [CLS]. The loss is the mean of
the start and end cross-entropies. The final evaluation predicts every dev window (padded to
whole batches, the padding weighted 0), decodes one answer per question from all its windows
(`best_answer`) and reports the official SQuAD exact match and F1, in percent.
"""

import dataclasses
import typing

import keras
import numpy as np
import tensorflow as tf

from concise_attention.models.checks import check_integer
from concise_attention.models.heads import BertSpanLabeler
from concise_attention.training.data import squad
from concise_attention.training.tasks import metrics as metric_functions
from concise_attention.training.tasks.base import Task
from concise_attention.training.tasks.base import TaskData
from concise_attention.training.tasks.base import TaskSettings

DATASETS = {"squad/v1.1": "tfds", "squad_json": "json"}
# Words tokenised per tokenizer call when the word cache is filled.
WORDS_PER_CALL = 20_000


@dataclasses.dataclass(frozen=True)
class SpanQASettings(TaskSettings):
    """dataset: see the module docstring; doc_stride: tokens between window starts;
    max_query_length: the question is cut to this many tokens; max_answer_length and
    n_best_size: the decoding's longest span and its candidates per window and end."""

    dataset: str = "squad/v1.1"
    data_dir: typing.Optional[str] = None
    doc_stride: int = 128
    max_query_length: int = 64
    max_answer_length: int = 30
    n_best_size: int = 20

    def __post_init__(self):
        if self.dataset not in DATASETS:
            raise ValueError(
                f"`task.dataset` must be one of {sorted(DATASETS)}. Received: task.dataset={self.dataset!r}"
            )
        if DATASETS[self.dataset] == "json" and not self.data_dir:
            raise ValueError(
                f"task.dataset={self.dataset!r} reads train-v1.1.json and dev-v1.1.json: set task.data_dir to their folder."
            )
        for name in ("doc_stride", "max_query_length", "max_answer_length", "n_best_size"):
            check_integer(f"task.{name}", getattr(self, name))


class CachedWordTokenizer:
    """`tokenize_words` for `make_features`: list of words -> list of token-id lists.

    Tokenising word by word with one TensorFlow call per example is slow over SQuAD's
    100k questions, so the words are tokenised in large batches once (`add`) and looked up.

    Args:
        tokenizer: the run's tokenizer: string [B] -> int32 ragged [B, (pieces)].
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.cache = {}

    def add(self, words):
        """Tokenises the words not seen yet, WORDS_PER_CALL at a time."""
        new = list(dict.fromkeys(word for word in words if word not in self.cache))
        for begin in range(0, len(new), WORDS_PER_CALL):
            chunk = new[begin : begin + WORDS_PER_CALL]
            for word, ids in zip(chunk, self.tokenizer(tf.constant(chunk)).to_list()):
                self.cache[word] = tuple(ids)

    def __call__(self, words):
        self.add(words)
        return [list(self.cache[word]) for word in words]


def _example_words(examples):
    for example in examples:
        yield from example.question.split()
        yield from squad.split_context(example.context)[0]
        for text, _ in example.answers[:1]:
            yield from text.split()


class SpanQATask(Task):
    """A question on a context -> the start and end of its answer span (`BertSpanLabeler`)."""

    name, Config = "span_qa", SpanQASettings

    def check(self):
        super().check()
        length, query = self.training.sequence_length, self.settings.max_query_length
        if length < query + 4:
            raise ValueError(
                "training.sequence_length must leave room for [CLS], the question, two [SEP] and one context token. "
                f"Received: training.sequence_length={length}, task.max_query_length={query}"
            )

    def load_data(self):
        source, data_dir = DATASETS[self.settings.dataset], self.settings.data_dir
        train_examples = squad.squad_examples("train", data_dir, source)
        self.train_examples = [
            example for example in train_examples if example.answers and squad.answer_found_in_context(example)
        ]
        if not self.train_examples:
            raise ValueError(
                f"task.dataset={self.settings.dataset!r}: none of the {len(train_examples)} training questions "
                "has an answer found in its context."
            )
        self.dev_examples = squad.squad_examples("dev", data_dir, source)
        if not self.dev_examples:
            raise ValueError(f"task.dataset={self.settings.dataset!r}: the dev split has no questions.")

    def num_train_examples(self):
        return len(self.train_examples)

    def build_model(self, backbone):
        return BertSpanLabeler(backbone)

    def compile_arguments(self):
        # run_squad.py's loss: (start cross-entropy + end cross-entropy) / 2.
        # The padding windows of the evaluation (weight 0) do not dilute val_loss.
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight")
        return {
            "loss": {"start_logits": loss, "end_logits": loss},
            "loss_weights": {"start_logits": 0.5, "end_logits": 0.5},
        }

    def features(self, tokenizer, examples):
        """The SquadFeatures of each example, windows of training.sequence_length tokens."""
        tokenize_words = CachedWordTokenizer(tokenizer)
        tokenize_words.add(_example_words(examples))
        special_ids = {name: tokenizer.token_to_id(f"[{name.upper()}]") for name in squad.SPECIAL_TOKENS}
        settings = self.settings
        return [
            squad.make_features(
                example,
                tokenize_words,
                special_ids,
                self.training.sequence_length,
                settings.doc_stride,
                settings.max_query_length,
            )
            for example in examples
        ]

    def datasets(self, tokenizer, skip_batches):
        training = self.training
        train_rows = _rows(self.features(tokenizer, self.train_examples))
        train = tf.data.Dataset.from_tensor_slices(train_rows)
        train = train.shuffle(len(train_rows[2]), seed=training.seed, reshuffle_each_iteration=True).repeat()
        train = train.batch(training.batch_size, drop_remainder=True).skip(skip_batches)
        dev_features = self.features(tokenizer, self.dev_examples)
        pad_id = tokenizer.token_to_id("[PAD]")
        dev = tf.data.Dataset.from_tensor_slices(_padded_rows(_rows(dev_features), training.batch_size, pad_id))
        dev = dev.batch(training.batch_size, drop_remainder=True).cache()
        return TaskData(train.prefetch(tf.data.AUTOTUNE), dev, final=(dev, dev_features))

    def dev_logits(self, model, dev, dev_features):
        """(start_logits, end_logits) of every dev window, float [windows, seq] (padding dropped)."""
        outputs = model.predict(dev, verbose=0)
        windows = sum(len(features) for features in dev_features)
        return np.asarray(outputs["start_logits"][:windows]), np.asarray(outputs["end_logits"][:windows])

    def predict_answers(self, start_logits, end_logits, dev_features):
        """dict question id -> predicted answer text, decoded from the logits of all its windows."""
        answers, first = {}, 0
        for example, features in zip(self.dev_examples, dev_features):
            last = first + len(features)
            answers[example.id] = squad.best_answer(
                example,
                features,
                start_logits[first:last],
                end_logits[first:last],
                self.settings.n_best_size,
                self.settings.max_answer_length,
            )
            first = last
        return answers

    def evaluate(self, model, final):
        # final: the whole dev split (whatever training.eval_batches kept for the per-epoch val_loss) and its windows;
        # the loss is computed from the same logits (one pass), averaged over the real windows.
        dev, dev_features = final
        start_logits, end_logits = self.dev_logits(model, dev, dev_features)
        _, labels, _ = _rows(dev_features)
        loss = 0.5 * (
            _cross_entropy(start_logits, labels["start_logits"]) + _cross_entropy(end_logits, labels["end_logits"])
        )
        scores = metric_functions.squad_scores(
            self.predict_answers(start_logits, end_logits, dev_features), self.dev_examples
        )
        return {"eval_loss": loss, "eval_exact_match": scores["exact_match"], "eval_f1": scores["f1"]}


def _cross_entropy(logits, labels):
    """Mean sparse cross-entropy of float64 logits [N, T] against int labels [N]."""
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return float(-log_probabilities[np.arange(len(labels)), labels].mean())


def _rows(features):
    """(inputs, labels, weights) arrays of all windows of `features`, in order."""
    if not any(len(feature) for feature in features):
        raise ValueError("SQuAD: no question has a context with any token.")

    def stack(name):
        return np.concatenate([getattr(feature, name) for feature in features if len(feature)])

    inputs = {name: stack(name) for name in ("input_word_ids", "input_mask", "input_type_ids")}
    labels = {"start_logits": stack("start_positions"), "end_logits": stack("end_positions")}
    return inputs, labels, np.ones(len(labels["start_logits"]), "float32")


def _padded_rows(rows, batch_size, pad_id):
    """Rows padded with empty windows of weight 0 to a whole number of batches."""
    inputs, labels, weights = rows
    padding = -len(weights) % batch_size

    def pad(array, value=0):
        return np.concatenate([array, np.full((padding, *array.shape[1:]), value, array.dtype)])

    inputs = {name: pad(array, pad_id if name == "input_word_ids" else 0) for name, array in inputs.items()}
    return inputs, {name: pad(array) for name, array in labels.items()}, pad(weights)
