"""SQuAD v1.1 readers, BERT's sliding windows and answer decoding.

A deterministic fake tokeniser checks the windows' layout and targets by direct search;
the real all-MiniLM-L6-v2 vocabulary (through Hugging Face `tokenizers`) is checked
against tf-models-official's port of BERT's run_squad.py (`official.nlp.data.squad_lib`,
with BERT's own FullTokenizer): same rows, same targets, same decoded answers.
"""

import json
import re
import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from concise_attention.training.data import squad
from concise_attention.training.data.squad import SquadExample

SPECIAL_IDS = {"pad": 0, "cls": 1, "sep": 2}


class ThreeCharPieces:
    """Stands in for WordPiece: lower-cases, splits punctuation off, cuts each remaining
    run into 3-character pieces ("##" marks a continuation); ids given on first sight."""

    def __init__(self):
        self.vocabulary = {"[PAD]": 0, "[CLS]": 1, "[SEP]": 2}

    @staticmethod
    def pieces(word):
        pieces = []
        for run in re.findall(r"\w+|[^\w\s]", word.lower()):
            pieces += [("##" if index else "") + run[index : index + 3] for index in range(0, len(run), 3)]
        return pieces

    def __call__(self, words):
        return [
            [self.vocabulary.setdefault(piece, len(self.vocabulary)) for piece in self.pieces(word)] for word in words
        ]


def _ids(tokenize_words, text):
    return [token for ids in tokenize_words(text.split()) for token in ids]


def _long_example(answer, question="When was the leader born?"):
    words = [f"word{index}" for index in range(70)]
    words[41:41] = [
        "The",
        "leader",
        "was",
        "John",
        "Smith",
        "(1895-1943).",
        "The",
        "Denver",
        "Broncos,",
        "who",
        "won,",
        "rejoiced.",
    ]
    context = " ".join(words)
    char_start = context.index(answer)
    return SquadExample("q1", question, context, [(answer, char_start)])


@pytest.mark.parametrize("answer", ["1895", "Denver Broncos", "John Smith (1895-1943).", "word12 word13 word14"])
def test_windows_over_a_long_context(answer):
    tokenize_words = ThreeCharPieces()
    example = _long_example(answer)
    max_seq_length, doc_stride, max_query_length = 24, 5, 4
    features = squad.make_features(example, tokenize_words, SPECIAL_IDS, max_seq_length, doc_stride, max_query_length)
    query = _ids(tokenize_words, example.question)[:max_query_length]
    document = _ids(tokenize_words, example.context)
    doc_offset, per_window = len(query) + 2, max_seq_length - len(query) - 3
    assert len(features) > 5 and features.input_word_ids.shape == (len(features), max_seq_length)
    assert all(
        array.dtype == np.int32
        for array in (*features.model_inputs().values(), features.start_positions, features.end_positions)
    )
    answer_ids = _ids(tokenize_words, answer)
    windows_with_answer = 0
    for window in range(len(features)):
        row, start = features.input_word_ids[window], window * doc_stride
        context_ids = document[start : start + per_window]
        expected_row = [1, *query, 2, *context_ids, 2]
        np.testing.assert_array_equal(row, expected_row + [0] * (max_seq_length - len(expected_row)))
        np.testing.assert_array_equal(
            features.input_mask[window], [1] * len(expected_row) + [0] * (max_seq_length - len(expected_row))
        )
        padding = [0] * (max_seq_length - len(expected_row))
        np.testing.assert_array_equal(
            features.input_type_ids[window], [0] * doc_offset + [1] * (len(context_ids) + 1) + padding
        )
        found = [i for i in range(len(context_ids)) if context_ids[i : i + len(answer_ids)] == answer_ids]
        if found:
            windows_with_answer += 1
            expected_positions = (doc_offset + found[0], doc_offset + found[0] + len(answer_ids) - 1)
        else:
            expected_positions = (0, 0)
        assert (features.start_positions[window], features.end_positions[window]) == expected_positions
    assert windows_with_answer >= 1
    assert (
        (len(features) - 1) * doc_stride + per_window >= len(document) > (len(features) - 2) * doc_stride + per_window
    )
    # Every context token has exactly one max-context window.
    counts = {}
    for window, position in zip(*np.nonzero(features.token_is_max_context)):
        key = window * doc_stride + position - doc_offset
        counts[key] = counts.get(key, 0) + 1
    assert sorted(counts) == list(range(len(document))) and set(counts.values()) == {1}


@pytest.mark.parametrize(
    "answer", ["1895", "Denver Broncos", "John Smith (1895-1943).", "word12 word13 word14", "Smith (1895", "rejoiced"]
)
def test_one_hot_logits_of_the_true_span_decode_to_the_answer(answer):
    tokenize_words = ThreeCharPieces()
    example = _long_example(answer)
    features = squad.make_features(
        example, tokenize_words, SPECIAL_IDS, max_seq_length=40, doc_stride=6, max_query_length=4
    )
    # The window where the answer's first token has its most context (it holds the whole
    # answer here: windows of 33 context tokens, answers of at most 12).
    window = next(
        w
        for w in range(len(features))
        if features.start_positions[w] and features.token_is_max_context[w, features.start_positions[w]]
    )
    start_logits, end_logits = np.zeros(features.input_word_ids.shape), np.zeros(features.input_word_ids.shape)
    start_logits[window, features.start_positions[window]] = 10.0
    end_logits[window, features.end_positions[window]] = 10.0
    assert squad.best_answer(example, features, start_logits, end_logits) == answer


def test_decoding_respects_max_context_and_answer_length():
    tokenize_words = ThreeCharPieces()
    example = SquadExample("q", "Who?", "alpha beta gamma delta", [])
    features = squad.make_features(
        example, tokenize_words, SPECIAL_IDS, max_seq_length=16, doc_stride=2, max_query_length=4
    )
    assert len(features) == 1 and not features.start_positions.any()
    doc_offset = len(_ids(tokenize_words, example.question)) + 2  # [CLS] who ? [SEP]
    pieces = ["alp", "##ha", "bet", "##a", "gam", "##ma", "del", "##ta"]
    tokens = {piece: doc_offset + index for index, piece in enumerate(pieces)}
    start_logits, end_logits = np.zeros((1, 16)), np.zeros((1, 16))
    start_logits[0, 0] = end_logits[0, 0] = 100.0  # [CLS]: never an answer in SQuAD v1.1
    start_logits[0, tokens["bet"]], end_logits[0, tokens["##ma"]] = 5.0, 5.0
    start_logits[0, tokens["alp"]], end_logits[0, tokens["##ta"]] = 4.0, 4.0
    assert squad.best_answer(example, features, start_logits, end_logits) == "beta gamma"
    # At most 3 tokens: bet..##ma and alp..##ta are too long; bet..##a (5 + 1) is best.
    end_logits[0, tokens["##a"]] = 1.0
    assert squad.best_answer(example, features, start_logits, end_logits, max_answer_length=3) == "beta"
    # Starting inside a WordPiece continuation ("##ma") gives the whole word.
    start_logits[0, tokens["##ma"]] = 9.0
    assert squad.best_answer(example, features, start_logits, end_logits) == "gamma"
    assert (
        squad.best_answer(example, features, np.zeros((1, 16)) - np.arange(16), np.zeros((1, 16)), n_best_size=3) == ""
    )


def test_answer_inside_a_word_keeps_the_word_when_no_token_matches():
    """run_squad.py's own example: "Japan" inside "Japanese" maps to the whole word."""
    tokenize_words = ThreeCharPieces()
    context = "The Japanese electronics industry is the largest."
    example = SquadExample("q", "Which country?", context, [("Japan", context.index("Japan"))])
    assert squad.answer_found_in_context(example)
    features = squad.make_features(
        example, tokenize_words, SPECIAL_IDS, max_seq_length=32, doc_stride=8, max_query_length=8
    )
    doc_offset = len(_ids(tokenize_words, example.question)) + 2
    # "japanese" is jap ##ane ##se: tokens 1..3 of the context.
    assert (features.start_positions[0], features.end_positions[0]) == (doc_offset + 1, doc_offset + 3)
    mismatched = SquadExample("q", "Which?", context, [("Korea", 4)])
    assert not squad.answer_found_in_context(mismatched)


def _squad_document():
    context = "Super Bowl 50 was played in Santa Clara, California. The Denver Broncos won."
    return {
        "version": "1.1",
        "data": [
            {
                "title": "Super_Bowl_50",
                "paragraphs": [
                    {
                        "context": context,
                        "qas": [
                            {
                                "id": "a1",
                                "question": "Where?",
                                "answers": [
                                    {"text": "Santa Clara", "answer_start": 28},
                                    {"text": "Santa Clara, California", "answer_start": 28},
                                ],
                            },
                            {
                                "id": "a2",
                                "question": "Who won?",
                                "answers": [{"text": "Denver Broncos", "answer_start": context.index("Denver")}],
                            },
                        ],
                    }
                ],
            }
        ],
    }


def _first_qa(document):
    return document["data"][0]["paragraphs"][0]["qas"][0]


def test_read_squad_json(tmp_path):
    path = tmp_path / "dev-v1.1.json"
    path.write_text(json.dumps(_squad_document()), encoding="utf-8")
    examples = squad.squad_examples("dev", tmp_path, "json")
    assert [example.id for example in examples] == ["a1", "a2"]
    assert examples[0].answers == [("Santa Clara", 28), ("Santa Clara, California", 28)]
    assert examples[1].context[examples[1].answers[0][1] :].startswith("Denver Broncos")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.pop("data"), r"missing key 'data' in the top level"),
        (lambda d: d["data"][0]["paragraphs"][0].pop("qas"), r"missing key 'qas' in data\[0\]\.paragraphs\[0\]"),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][1].pop("question"),
            r"missing key 'question' in data\[0\]\.paragraphs\[0\]\.qas\[1\]",
        ),
        (
            lambda d: _first_qa(d)["answers"][1].pop("answer_start"),
            r"missing key 'answer_start' in .*qas\[0\]\.answers\[1\]",
        ),
        (
            lambda d: _first_qa(d)["answers"][0].update(answer_start=500),
            r"SQuAD example 'a1': answer 'Santa Clara' at character 500 does not lie inside",
        ),
    ],
)
def test_bad_squad_json_names_file_and_key(tmp_path, edit, message):
    document = _squad_document()
    edit(document)
    path = tmp_path / "train-v1.1.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(ValueError, match=r"train-v1\.1\.json: " + message):
        squad.read_squad_json(path)


def test_bad_arguments_are_named(tmp_path):
    example = SquadExample("q", "Who?", "alpha beta", [])
    with pytest.raises(ValueError, match="SQuAD file not found"):
        squad.read_squad_json(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.json: not valid JSON"):
        squad.read_squad_json(tmp_path / "broken.json")
    with pytest.raises(ValueError, match=r"special_ids must give the ids of .* Missing: \['pad'\]"):
        squad.make_features(example, ThreeCharPieces(), {"cls": 1, "sep": 2})
    with pytest.raises(ValueError, match="max_seq_length=10, max_query_length=64"):
        squad.make_features(example, ThreeCharPieces(), SPECIAL_IDS, max_seq_length=10)
    with pytest.raises(ValueError, match="`doc_stride` must be a positive integer. Received: doc_stride=0"):
        squad.make_features(example, ThreeCharPieces(), SPECIAL_IDS, doc_stride=0)
    with pytest.raises(ValueError, match="one token list per word"):
        squad.make_features(example, lambda words: [[5]], SPECIAL_IDS)
    features = squad.make_features(example, ThreeCharPieces(), SPECIAL_IDS, max_seq_length=16, max_query_length=4)
    with pytest.raises(ValueError, match=r"'q': Logits must be shaped like the features \(1, 16\)"):
        squad.best_answer(example, features, np.zeros((1, 8)), np.zeros((1, 8)))
    with pytest.raises(ValueError, match="split must be 'train' or 'dev'"):
        squad.squad_examples("test", tmp_path, "json")


def test_tfds_squad_examples():
    context = "The Denver Broncos won."
    answers = {
        "text": np.array([b"Denver Broncos", b"The Denver Broncos"], object),
        "answer_start": np.array([4, 0], np.int32),
    }
    records = [{"id": b"x1", "title": b"T", "context": context.encode(), "question": b"Who won?", "answers": answers}]
    splits_read = []

    def as_dataset(self, split, **kwargs):
        splits_read.append(str(split))
        return tf.data.Dataset.from_generator(
            lambda: iter(records), output_types=self.info.features.dtype, output_shapes=self.info.features.shape
        )

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        examples = squad.squad_examples("dev", None, "tfds")
    assert splits_read == ["validation"]
    assert examples == [SquadExample("x1", "Who won?", context, [("Denver Broncos", 4), ("The Denver Broncos", 0)])]


# --- The real vocabulary against tf-models-official's port of run_squad.py -------------

PARAGRAPH = (
    "The leader was John Smith (1895-1943). Beyoncé Giselle Knowles-Carter (born September 4, 1981) is an "
    "American singer; her album sold 3.5 million copies in the U.S. during its first week. The Denver Broncos "
    "defeated the Carolina Panthers 24-10 at Levi's Stadium in Santa Clara, California. Unbelievably, "
    "the stadium's capacity was 68,500 people, who paid $1,200 on average."
)
QUESTIONS = [
    ("When was John Smith born?", "1895"),
    ("What is Beyoncé's full name?", "Beyoncé Giselle Knowles-Carter"),
    ("How many copies did the album sell?", "3.5 million"),
    ("What was the final score?", "24-10"),
    ("Where is Levi's Stadium?", "Santa Clara, California"),
    ("How much did people pay on average?", "$1,200"),
    ("How many people did the stadium hold?", "68,500"),
]


@pytest.fixture(scope="module")
def minilm_squad(minilm_dir, tmp_path_factory):
    from tokenizers import BertWordPieceTokenizer

    document = {
        "data": [
            {
                "title": "t",
                "paragraphs": [
                    {
                        "context": PARAGRAPH,
                        "qas": [
                            {
                                "id": f"q{index}",
                                "question": question,
                                "answers": [{"text": answer, "answer_start": PARAGRAPH.index(answer)}],
                            }
                            for index, (question, answer) in enumerate(QUESTIONS)
                        ],
                    }
                ],
            }
        ]
    }
    path = tmp_path_factory.mktemp("squad") / "train-v1.1.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    wordpiece = BertWordPieceTokenizer(str(minilm_dir / "vocab.txt"), lowercase=True)

    def tokenize_words(words):
        return [encoding.ids for encoding in wordpiece.encode_batch(words, add_special_tokens=False)]

    special_ids = {
        name: wordpiece.token_to_id(token) for name, token in (("cls", "[CLS]"), ("sep", "[SEP]"), ("pad", "[PAD]"))
    }
    return path, tokenize_words, special_ids


def _reference_features(path, vocab_file, max_seq_length, doc_stride, max_query_length):
    from official.nlp.data import squad_lib
    from official.nlp.tools import tokenization

    examples = squad_lib.read_squad_examples(str(path), is_training=True, version_2_with_negative=False)
    tokenizer = tokenization.FullTokenizer(str(vocab_file), do_lower_case=True)
    features = []
    squad_lib.convert_examples_to_features(
        examples, tokenizer, max_seq_length, doc_stride, max_query_length, True, features.append
    )
    return examples, features


@pytest.mark.slow
def test_windows_and_decoding_equal_tf_models_run_squad(minilm_squad, minilm_dir):
    from official.nlp.data import squad_lib

    path, tokenize_words, special_ids = minilm_squad
    max_seq_length, doc_stride, max_query_length = 48, 12, 10
    reference_examples, reference_features = _reference_features(
        path, minilm_dir / "vocab.txt", max_seq_length, doc_stride, max_query_length
    )
    examples = squad.read_squad_json(path)
    ours = [
        squad.make_features(e, tokenize_words, special_ids, max_seq_length, doc_stride, max_query_length)
        for e in examples
    ]
    assert sum(len(features) for features in ours) == len(reference_features)
    rows = [(index, window) for index, features in enumerate(ours) for window in range(len(features))]
    for (index, window), reference in zip(rows, reference_features):
        features = ours[index]
        assert reference.example_index == index and reference.doc_span_index == window
        np.testing.assert_array_equal(features.input_word_ids[window], reference.input_ids)
        np.testing.assert_array_equal(features.input_mask[window], reference.input_mask)
        np.testing.assert_array_equal(features.input_type_ids[window], reference.segment_ids)
        assert (features.start_positions[window], features.end_positions[window]) == (
            reference.start_position,
            reference.end_position,
        )
        assert {
            p: int(w) for p, w in enumerate(features.token_to_word[window]) if w >= 0
        } == reference.token_to_orig_map
        in_context = features.token_to_word[window] >= 0
        assert {
            p: bool(features.token_is_max_context[window, p]) for p in np.nonzero(in_context)[0]
        } == reference.token_is_max_context

    rng = np.random.default_rng(0)
    compared_inside_words = 0
    for trial in range(40):
        logits = [rng.normal(size=(2, len(features), max_seq_length)) for features in ours]
        if trial == 0:  # the true spans, one-hot
            for features, pair in zip(ours, logits):
                pair[:] = 0.0
                pair[0][
                    features.start_positions.nonzero()[0], features.start_positions[features.start_positions.nonzero()]
                ] = 10.0
                pair[1][
                    features.end_positions.nonzero()[0], features.end_positions[features.end_positions.nonzero()]
                ] = 10.0
        results = [
            types.SimpleNamespace(
                unique_id=reference.unique_id,
                start_logits=list(logits[index][0][window]),
                end_logits=list(logits[index][1][window]),
            )
            for (index, window), reference in zip(rows, reference_features)
        ]
        expected, _, _ = squad_lib.postprocess_output(reference_examples, reference_features, results, 20, 30, True)
        offset = 0
        for index, (example, features) in enumerate(zip(examples, ours)):
            answer = squad.best_answer(example, features, logits[index][0], logits[index][1])
            window, start, _ = squad.best_span(features, logits[index][0], logits[index][1])
            if reference_features[offset + window].tokens[start].startswith("##"):
                # BERT answers from inside the word ("##ning" of "running" gives "ning");
                # decoding from ids answers the whole word.
                assert answer.endswith(expected[example.id]) and len(answer) > len(expected[example.id])
            else:
                assert answer == expected[example.id], (trial, example.id)
                compared_inside_words += features.token_to_piece[window, start] > 0
            if trial == 0:
                assert answer == example.answers[0][0]
            offset += len(features)
    assert compared_inside_words > 10  # spans starting after punctuation inside a word were compared
