"""GLUE readers on files written in the original layouts, and on tfds mock data.

The expected examples are written by hand from the GLUE files' published layouts (the
columns BERT's run_classifier.py and tf-models-official's classifier_data_lib.py read).
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from concise_attention.training.data import glue
from concise_attention.training.data.glue import TextExample


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(row) + "\n" for row in rows), encoding="utf-8")
    return path


MNLI_TRAIN_HEADER = [
    "index",
    "promptID",
    "pairID",
    "genre",
    "sentence1_binary_parse",
    "sentence2_binary_parse",
    "sentence1_parse",
    "sentence2_parse",
    "sentence1",
    "sentence2",
    "label1",
    "gold_label",
]
MNLI_DEV_HEADER = MNLI_TRAIN_HEADER[:11] + ["label2", "label3", "label4", "label5", "gold_label"]


def _mnli_row(index, premise, hypothesis, labels):
    return [
        str(index),
        "31193",
        f"{index}n",
        "government",
        "( ( x ) )",
        "( y )",
        "(ROOT x)",
        "(ROOT y)",
        premise,
        hypothesis,
        *labels,
    ]


def test_mnli_reads_sentence_columns_8_9_and_the_last_label(tmp_path):
    train = _write(
        tmp_path / "MNLI" / "train.tsv",
        [
            MNLI_TRAIN_HEADER,
            _mnli_row(0, 'He said "yes".', "He agreed.", ["entailment", "entailment"]),
            _mnli_row(1, "It's 5' tall", 'A "tall" thing', ["neutral", "neutral"]),
        ],
    )
    _write(
        tmp_path / "MNLI" / "dev_matched.tsv",
        [
            MNLI_DEV_HEADER,
            _mnli_row(
                0,
                "The cat sat.",
                "No cat sat.",
                ["contradiction", "neutral", "contradiction", "contradiction", "contradiction", "contradiction"],
            ),
        ],
    )
    assert glue.read_glue_tsv(train, "mnli") == [
        TextExample('He said "yes".', "He agreed.", "entailment", 2),
        TextExample("It's 5' tall", 'A "tall" thing', "neutral", 3),
    ]
    dev = glue.glue_examples("mnli", "dev", tmp_path / "MNLI", "tsv")
    assert dev == [TextExample("The cat sat.", "No cat sat.", "contradiction", 2)]


def test_the_other_original_layouts(tmp_path):
    rows = {
        "sst2": [["sentence", "label"], ['a "gripping" film ', "1"], ['"unbalanced quote', "0"]],
        "mrpc": [
            ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
            ["1", "702876", "702977", "He said.", "He stated."],
        ],
        "qnli": [["index", "question", "sentence", "label"], ["0", "Who?", "Him.", "not_entailment"]],
        "rte": [["index", "sentence1", "sentence2", "label"], ["0", "A dog runs.", "An animal runs.", "entailment"]],
        "wnli": [["index", "sentence1", "sentence2", "label"], ["0", "I put it in.", "It fit.", "1"]],
        "qqp": [
            ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
            ["7", "15", "16", "How?", "Why?", "0"],
        ],
        "stsb": [
            [
                "index",
                "genre",
                "filename",
                "year",
                "old_index",
                "source1",
                "source2",
                "sentence1",
                "sentence2",
                "score",
            ],
            [
                "0",
                "main-captions",
                "MSRvid",
                "2012test",
                "0001",
                "none",
                "none",
                "A plane takes off.",
                "An air plane is taking off.",
                "5.000",
            ],
        ],
        "cola": [["gj04", "1", "", "Our friends won't buy this analysis."], ["gj04", "0", "*", "They drank the pub."]],
    }
    expected = {
        "sst2": [TextExample('a "gripping" film ', None, "1", 2), TextExample('"unbalanced quote', None, "0", 3)],
        "mrpc": [TextExample("He said.", "He stated.", "1", 2)],
        "qnli": [TextExample("Who?", "Him.", "not_entailment", 2)],
        "rte": [TextExample("A dog runs.", "An animal runs.", "entailment", 2)],
        "wnli": [TextExample("I put it in.", "It fit.", "1", 2)],
        "qqp": [TextExample("How?", "Why?", "0", 2)],
        "stsb": [TextExample("A plane takes off.", "An air plane is taking off.", 5.0, 2)],
        # CoLA's train/dev files have no header: the first line is an example.
        "cola": [
            TextExample("Our friends won't buy this analysis.", None, "1", 1),
            TextExample("They drank the pub.", None, "0", 2),
        ],
    }
    for task, task_rows in rows.items():
        path = _write(tmp_path / task / "train.tsv", task_rows)
        assert glue.read_glue_tsv(path, task) == expected[task], task
        assert glue.glue_examples(task, "train", str(tmp_path / task), "tsv") == expected[task], task


def test_generic_tsv_layout_is_found_from_the_header(tmp_path):
    pair = _write(
        tmp_path / "pair" / "train.tsv", [["id", "label", "sentence2", "sentence1"], ["a", "yes", "second", "first"]]
    )
    _write(tmp_path / "single" / "dev.tsv", [["sentence", "label"], ["only one", "no"]])
    assert glue.read_glue_tsv(pair, "tsv") == [TextExample("first", "second", "yes", 2)]
    assert glue.glue_examples("tsv", "dev", tmp_path / "single", "tsv") == [TextExample("only one", None, "no", 2)]
    bad = _write(tmp_path / "bad.tsv", [["text", "label"], ["x", "y"]])
    with pytest.raises(ValueError, match=r"bad\.tsv line 1: the header must name the columns 'sentence'"):
        glue.read_glue_tsv(bad, "tsv")


def test_short_row_names_file_and_line(tmp_path):
    rows = [MNLI_DEV_HEADER] + [_mnli_row(i, "p", "h", ["neutral"] * 6) for i in range(15)] + [["17", "x", "y"]]
    path = _write(tmp_path / "dev_matched.tsv", rows)
    with pytest.raises(ValueError, match=r"dev_matched\.tsv line 17: expected at least 11 columns, found 3"):
        glue.read_glue_tsv(path, "mnli")
    stsb = _write(tmp_path / "stsb.tsv", [["h"] * 10, ["0"] * 7 + ["a", "b", "high"]])
    with pytest.raises(ValueError, match=r"stsb\.tsv line 2: expected a float score as the label, found 'high'"):
        glue.read_glue_tsv(stsb, "stsb")
    huge = _write(tmp_path / "huge.tsv", [["sentence", "label"], ["ok", "1"], ["x" * 200_000, "0"]])
    with pytest.raises(ValueError, match=r"huge\.tsv line 3: field larger than field limit"):
        glue.read_glue_tsv(huge, "sst2")


def test_labels_come_from_the_training_split(tmp_path):
    header = ["index", "question", "sentence", "label"]
    train = glue.read_glue_tsv(
        _write(tmp_path / "train.tsv", [header, ["0", "q", "s", "not_entailment"], ["1", "q", "s", "entailment"]]),
        "qnli",
    )
    vocabulary = glue.label_vocabulary(train)
    assert vocabulary == ["entailment", "not_entailment"]
    np.testing.assert_array_equal(glue.encode_labels(train, vocabulary, "train.tsv"), np.array([1, 0], np.int32))
    dev_path = _write(tmp_path / "dev.tsv", [header, ["0", "q", "s", "entailment"], ["1", "q", "s", "contradiction"]])
    dev = glue.read_glue_tsv(dev_path, "qnli")
    with pytest.raises(ValueError, match=r"dev\.tsv line 3: label 'contradiction' is not among the training labels"):
        glue.encode_labels(dev, vocabulary, glue.glue_source("qnli", "dev", tmp_path, "tsv"))
    with pytest.raises(ValueError, match="regression scores have no vocabulary"):
        glue.label_vocabulary([TextExample("a", "b", 3.5)])
    assert glue.positive_label_id("mrpc", ["0", "1"]) == 1
    assert glue.positive_label_id("qqp", ["duplicate", "not_duplicate"]) == 0


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda tmp: glue.read_glue_tsv(tmp / "missing.tsv", "sst2"), "TSV file not found"),
        (
            lambda tmp: glue.label_vocabulary([TextExample("a", None, "pos")] * 3, "one/train.tsv"),
            r"one/train\.tsv: a classifier needs at least 2 labels. Received: \['pos'\]",
        ),
        (lambda tmp: glue.label_vocabulary([], "empty/train.tsv"), "empty/train.tsv: .* Received: no examples"),
        (lambda tmp: glue.read_glue_tsv(tmp / "x.tsv", "imdb"), "Unknown GLUE task"),
        (lambda tmp: glue.glue_examples("sst2", "test", tmp, "tsv"), "split must be one of"),
        (lambda tmp: glue.glue_examples("sst2", "train", tmp, "csv"), "source must be one of"),
        (lambda tmp: glue.glue_examples("sst2", "train", None, "tsv"), "need a data_dir"),
        (lambda tmp: glue.glue_examples("tsv", "train", None, "tfds"), "needs source='tsv'"),
    ],
)
def test_bad_arguments_are_named(tmp_path, call, message):
    with pytest.raises(ValueError, match=message):
        call(tmp_path)


def test_tsv_is_read_through_tf_io_gfile(tmp_path):
    """A non-local tf.io.gfile filesystem (TensorFlow's in-memory ram://) stands in for gs://."""
    with tf.io.gfile.GFile("ram://glue_test/SST-2/train.tsv", "w") as file:
        file.write("sentence\tlabel\nfine film\t1\n")
    assert glue.glue_examples("sst2", "train", "ram://glue_test/SST-2", "tsv") == [
        TextExample("fine film", None, "1", 2)
    ]


@pytest.mark.parametrize("task, pair", [("sst2", False), ("mrpc", True), ("stsb", True)])
def test_tfds_mock_data_gives_text_examples(task, pair):
    with tfds.testing.mock_data(num_examples=6):
        names = tfds.builder(f"glue/{task}").info.features["label"]
        examples = glue.glue_examples(task, "dev", None, "tfds")
    assert len(examples) == 6
    for example in examples:
        assert isinstance(example.text_a, str) and example.line == 0
        assert isinstance(example.text_b, str) if pair else example.text_b is None
        if task == "stsb":
            assert type(example.label) is float
        else:
            assert example.label in names.names
    if task != "stsb":
        assert set(glue.label_vocabulary(examples)) <= set(names.names)


def test_tfds_records_are_ordered_by_idx_with_premise_first():
    records = [
        {"premise": "p2", "hypothesis": "h2", "label": 2, "idx": 2},
        {"premise": "p0", "hypothesis": "h0", "label": 0, "idx": 0},
        {"premise": "p1", "hypothesis": "h1", "label": 1, "idx": 1},
    ]
    splits_read = []

    def as_dataset(self, split, **kwargs):
        splits_read.append(str(split))
        return tf.data.Dataset.from_generator(
            lambda: iter(records), output_types=self.info.features.dtype, output_shapes=self.info.features.shape
        )

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        examples = glue.glue_examples("mnli", "dev", None, "tfds")
    assert splits_read == ["validation_matched"]
    # glue/mnli's ClassLabel names: entailment, neutral, contradiction.
    assert examples == [
        TextExample("p0", "h0", "entailment"),
        TextExample("p1", "h1", "neutral"),
        TextExample("p2", "h2", "contradiction"),
    ]
