"""GLUE examples from the original TSV files or from tensorflow-datasets.

The TSV layouts are those BERT's run_classifier.py reads (google-research/bert,
`MnliProcessor`, `MrpcProcessor`, `ColaProcessor`) and tf-models-official's
official/nlp/data/classifier_data_lib.py (`SstProcessor`, `QnliProcessor`, `RteProcessor`,
`StsBProcessor`, `QqpProcessor`, `WnliProcessor`): tab-separated, no quoting (a field's
quotes are kept as they are), a header row except in CoLA's train/dev files. A `tsv`
layout reads users' own data through a header naming its columns.

Labels are read from the data, never hard-coded: `label_vocabulary` lists the distinct
labels of the training split and `encode_labels` maps them to ids. TSV files spell them
as in the files ("0"/"1", "entailment", ...); tensorflow-datasets gives the ClassLabel
names ("negative"/"positive", ...). STS-B labels are float scores.
"""

import csv
import dataclasses
import os

import numpy as np
import tensorflow as tf

SPLITS = ("train", "dev")
SOURCES = ("tsv", "tfds")
LAST_COLUMN = -1


@dataclasses.dataclass(frozen=True)
class TextExample:
    """One text (or text pair) and its label.

    Attributes:
        text_a: the first (or only) text.
        text_b: the second text of a pair task, else None.
        label: a string for classification, a float for regression (STS-B).
        line: 1-based line of the TSV file the example was read from; 0 when it did not
            come from a file (tensorflow-datasets).
    """

    text_a: str
    text_b: str | None
    label: str | float
    line: int = 0


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """Where a GLUE task keeps its fields, in the TSV files and in tensorflow-datasets (TFDS).

    Attributes:
        name: the task as TFDS names it (`glue/<name>`).
        text_columns: TSV columns of text_a (and text_b).
        label_column: TSV column of the label (LAST_COLUMN: the last one).
        has_header: whether the train/dev TSV files start with a header row.
        min_columns: fewest columns a TSV row may have.
        tfds_features: TFDS feature names of text_a (and text_b).
        tfds_dev_split, dev_file: the TFDS split and the TSV file of "dev".
        is_regression: labels are float scores.
        metrics: the `training.tasks.metrics` functions GLUE reports for the task.
        positive_labels: spellings of F1's positive class (TSV and TFDS).
    """

    name: str
    text_columns: tuple[int, ...]
    label_column: int
    has_header: bool
    min_columns: int
    tfds_features: tuple[str, ...]
    tfds_dev_split: str = "validation"
    dev_file: str = "dev.tsv"
    is_regression: bool = False
    metrics: tuple[str, ...] = ("accuracy",)
    positive_labels: frozenset = frozenset()


GLUE_TASKS = {
    task.name: task
    for task in (
        GlueTask("cola", (3,), 1, False, 4, ("sentence",), metrics=("matthews_corrcoef",)),
        GlueTask("sst2", (0,), 1, True, 2, ("sentence",)),
        GlueTask(
            "mrpc",
            (3, 4),
            0,
            True,
            5,
            ("sentence1", "sentence2"),
            metrics=("accuracy", "f1"),
            positive_labels=frozenset({"1", "equivalent"}),
        ),
        GlueTask(
            "qqp",
            (3, 4),
            5,
            True,
            6,
            ("question1", "question2"),
            metrics=("accuracy", "f1"),
            positive_labels=frozenset({"1", "duplicate"}),
        ),
        GlueTask(
            "stsb",
            (7, 8),
            LAST_COLUMN,
            True,
            10,
            ("sentence1", "sentence2"),
            is_regression=True,
            metrics=("pearson", "spearman"),
        ),
        GlueTask(
            "mnli",
            (8, 9),
            LAST_COLUMN,
            True,
            11,
            ("premise", "hypothesis"),
            tfds_dev_split="validation_matched",
            dev_file="dev_matched.tsv",
        ),
        GlueTask("qnli", (1, 2), LAST_COLUMN, True, 4, ("question", "sentence")),
        GlueTask("rte", (1, 2), LAST_COLUMN, True, 4, ("sentence1", "sentence2")),
        GlueTask("wnli", (1, 2), LAST_COLUMN, True, 4, ("sentence1", "sentence2")),
    )
}
# Users' own data: the columns are found from the header row (see `_read_headed_tsv`).
GENERIC_TSV = "tsv"


def glue_task(task):
    """The `GlueTask` named `task`."""
    if task not in GLUE_TASKS:
        raise ValueError(
            f"Unknown GLUE task; expected one of {sorted(GLUE_TASKS)} or {GENERIC_TSV!r}. Received: task={task!r}"
        )
    return GLUE_TASKS[task]


def _tsv_rows(path):
    """(1-based line number, fields) of each non-blank line of a TSV file, as BERT splits it."""
    path = str(path)
    if not tf.io.gfile.exists(path):
        raise ValueError(f"TSV file not found. Received: path={path!r}")
    with tf.io.gfile.GFile(path, "r") as file:
        # QUOTE_NONE: a quote is an ordinary character, as BERT's quotechar=None reads it.
        reader = csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE)
        while True:
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as error:
                raise ValueError(f"{path} line {reader.line_num}: {error}") from None
            if fields:  # a blank line (e.g. at the end of a hand-edited file) holds no example
                yield reader.line_num, fields


def _float_label(text, path, line):
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{path} line {line}: expected a float score as the label, found {text!r}") from None


def _read_headed_tsv(path):
    """Users' own TSV: a header names `sentence` (or `sentence1`, `sentence2`) and `label`."""
    rows = _tsv_rows(path)
    header_line, header = next(rows, (1, []))
    columns = {name.strip(): index for index, name in enumerate(header)}
    if "sentence1" in columns and "sentence2" in columns:
        text_columns = (columns["sentence1"], columns["sentence2"])
    elif "sentence" in columns:
        text_columns = (columns["sentence"],)
    else:
        text_columns = ()
    if not text_columns or "label" not in columns:
        raise ValueError(
            f"{path} line {header_line}: the header must name the columns 'sentence' (or 'sentence1' and "
            f"'sentence2') and 'label'. Received: {header}"
        )
    needed = max(*text_columns, columns["label"]) + 1
    examples = []
    for line, fields in rows:
        if len(fields) < needed:
            raise ValueError(f"{path} line {line}: expected at least {needed} columns, found {len(fields)}")
        texts = [fields[column] for column in text_columns]
        examples.append(TextExample(texts[0], texts[1] if len(texts) > 1 else None, fields[columns["label"]], line))
    return examples


def read_glue_tsv(path, task):
    """Examples of a GLUE TSV file in its original layout (or the generic `tsv` one).

    Args:
        path: the file, on any tf.io.gfile filesystem (local, gs://, ...).
        task: a GLUE task name (`GLUE_TASKS`) or "tsv" for a file whose header names
            its columns `sentence` (or `sentence1` and `sentence2`) and `label`.

    Returns:
        list of TextExample with their line numbers; STS-B labels are floats, the others
        the label strings of the file.
    """
    if task == GENERIC_TSV:
        return _read_headed_tsv(path)
    layout = glue_task(task)
    rows = _tsv_rows(path)
    if layout.has_header:
        next(rows, None)
    examples = []
    for line, fields in rows:
        if len(fields) < layout.min_columns:
            raise ValueError(f"{path} line {line}: expected at least {layout.min_columns} columns, found {len(fields)}")
        texts = [fields[column] for column in layout.text_columns]
        label = fields[layout.label_column]
        if layout.is_regression:
            label = _float_label(label, path, line)
        examples.append(TextExample(texts[0], texts[1] if len(texts) > 1 else None, label, line))
    return examples


def tfds_glue_examples(task, split, data_dir=None):
    """Examples of `glue/<task>` from tensorflow-datasets, in the order of their `idx`.

    Args:
        task: a GLUE task name (`GLUE_TASKS`).
        split: a tensorflow-datasets split ("train", "validation", "validation_matched", ...);
            test splits have no labels and are refused.
        data_dir: tensorflow-datasets data directory (None: its default). Data not there
            yet is downloaded and prepared, as `tfds.load` does.

    Returns:
        list of TextExample whose labels are the builder's ClassLabel names (floats for STS-B).
    """
    import tensorflow_datasets as tfds  # heavy; only the TFDS readers need it

    layout = glue_task(task)
    builder = tfds.builder(f"glue/{task}", data_dir=data_dir)
    builder.download_and_prepare()
    label_names = None if layout.is_regression else builder.info.features["label"].names
    records = sorted(
        tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)), key=lambda record: int(record["idx"])
    )
    examples = []
    for record in records:
        texts = [record[feature].decode("utf-8") for feature in layout.tfds_features]
        if layout.is_regression:
            label = float(record["label"])
        elif 0 <= int(record["label"]) < len(label_names):
            label = label_names[int(record["label"])]
        else:
            raise ValueError(
                f"tfds glue/{task} split {split!r} has no labels (idx {int(record['idx'])} has label {int(record['label'])})"
            )
        examples.append(TextExample(texts[0], texts[1] if len(texts) > 1 else None, label))
    return examples


def _tfds_split(task, split):
    return "train" if split == "train" else glue_task(task).tfds_dev_split


def glue_source(task, split, data_dir, source):
    """Where `glue_examples` reads: the TSV file's path, or "tfds glue/<task> <split>"."""
    if split not in SPLITS:
        raise ValueError(f"GLUE split must be one of {SPLITS}. Received: split={split!r}")
    if source not in SOURCES:
        raise ValueError(f"GLUE source must be one of {SOURCES}. Received: source={source!r}")
    if source == "tfds":
        if task == GENERIC_TSV:
            raise ValueError(
                f"task={GENERIC_TSV!r} reads users' own files: it needs source='tsv'. Received: source='tfds'"
            )
        return f"tfds glue/{task} {_tfds_split(task, split)}"
    if data_dir is None:
        raise ValueError(
            f"GLUE TSV files need a data_dir holding train.tsv and dev.tsv. Received: data_dir=None (task={task!r})"
        )
    dev_file = "dev.tsv" if task == GENERIC_TSV else glue_task(task).dev_file
    return os.path.join(str(data_dir), "train.tsv" if split == "train" else dev_file)


def glue_examples(task, split, data_dir, source):
    """The examples of a GLUE task's split, from its TSV files or from tensorflow-datasets.

    Args:
        task: a GLUE task name (`GLUE_TASKS`) or "tsv" (users' own files, see `read_glue_tsv`).
        split: "train" or "dev" (MNLI's dev is dev_matched / validation_matched).
        data_dir: for source "tsv", the task's folder holding train.tsv and dev.tsv
            (dev_matched.tsv for MNLI) as the GLUE download lays them out; for "tfds",
            the tensorflow-datasets data directory (None: its default). Any tf.io.gfile path.
        source: "tsv" or "tfds".

    Returns:
        list of TextExample.
    """
    where = glue_source(task, split, data_dir, source)
    if source == "tfds":
        return tfds_glue_examples(task, _tfds_split(task, split), data_dir)
    return read_glue_tsv(where, task)


def label_vocabulary(examples, source="the training split"):
    """The sorted distinct labels (strings) of a training split (`source`, named in errors): label id i is
    entry i. At least 2: a classifier of one class would learn nothing."""
    labels = {example.label for example in examples}
    not_strings = sorted({repr(label) for label in labels if not isinstance(label, str)})
    if not_strings:
        raise ValueError(
            f"Classification labels must be strings (regression scores have no vocabulary). Received: {not_strings[:5]}"
        )
    if len(labels) < 2:
        raise ValueError(
            f"{source}: a classifier needs at least 2 labels. Received: {sorted(labels) if labels else 'no examples'}"
        )
    return sorted(labels)


def encode_labels(examples, vocabulary, source):
    """Label ids (int32 array) of `examples` in `vocabulary`.

    Args:
        examples: list of TextExample.
        vocabulary: list of label strings, as `label_vocabulary` gives for the training split.
        source: where the examples came from (e.g. `glue_source(...)`), named in errors.

    Raises:
        ValueError naming the source and the line (or example index) of a label that is
        not in the vocabulary.
    """
    ids = {label: index for index, label in enumerate(vocabulary)}
    encoded = np.empty(len(examples), dtype=np.int32)
    for index, example in enumerate(examples):
        if example.label not in ids:
            where = f"line {example.line}" if example.line else f"example {index}"
            raise ValueError(
                f"{source} {where}: label {example.label!r} is not among the training labels {list(vocabulary)}"
            )
        encoded[index] = ids[example.label]
    return encoded


def positive_label_id(task, vocabulary):
    """Id in `vocabulary` of the class whose F1 GLUE reports (MRPC, QQP), whichever source
    spelled the labels ("1" in the TSV files, "equivalent"/"duplicate" in tensorflow-datasets)."""
    positive = glue_task(task).positive_labels
    found = [index for index, label in enumerate(vocabulary) if label in positive]
    if len(found) != 1:
        raise ValueError(
            f"GLUE {task}: expected one of {sorted(positive)} in the label vocabulary. Received: vocabulary={list(vocabulary)}"
        )
    return found[0]
