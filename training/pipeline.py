"""tf.data input pipelines for language modelling: text -> WordPiece ids -> packed rows.

Sources: the shipped sample corpus, any folder of .txt files, or LM1B through
tensorflow-datasets (`lm1b`, any data_dir including gs://). Rows are packed
tensor2tensor-style (`training.data.pack_sentences`): fixed length, int32, segment ids and
positions per sentence, batched with drop_remainder so that a TPU sees static shapes.
"""

import pathlib

import numpy as np
import tensorflow as tf

from training.data import SAMPLE_CORPUS
from training.data import next_token_targets
from training.data import pack_sentences
from training.data import read_lines

# Every EVAL_EVERY-th line of a text corpus is held out for evaluation.
EVAL_EVERY = 20
# Sentences tokenised and packed together; rows never mix sentences across chunks.
CHUNK_LINES = 4096


def _text_files(data_dir):
    if not data_dir:
        raise ValueError("training.data_dir must name a folder of .txt files for dataset='text_files'.")
    directory = pathlib.Path(data_dir)
    if not directory.is_dir():
        raise ValueError(f"Corpus folder not found. Received: training.data_dir={str(data_dir)!r}")
    files = sorted(directory.rglob("*.txt"))
    if not files:
        raise ValueError(f"No .txt files under training.data_dir={str(data_dir)!r}")
    return files


def corpus_lines(dataset, data_dir=None, split="train"):
    """A function returning a fresh iterator over the lines of a split ("train" or "eval").

    Checks the source at once (missing folder, no files, empty corpus) so that a bad
    path fails before any training starts.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"`split` must be 'train' or 'eval'. Received: split={split!r}")
    if dataset == "lm1b":
        import tensorflow_datasets as tfds

        builder = tfds.builder("lm1b", data_dir=data_dir)
        tfds_split = "train" if split == "train" else "test"

        def lm1b_lines():
            for example in builder.as_dataset(split=tfds_split, shuffle_files=False):
                yield example["text"].numpy().decode("utf-8")

        return lm1b_lines
    if dataset == "sample":
        lines = read_lines(SAMPLE_CORPUS)
    elif dataset == "text_files":
        lines = [line for path in _text_files(data_dir) for line in read_lines(path)]
    else:
        raise ValueError(f"`dataset` must be one of sample, lm1b, text_files. Received: dataset={dataset!r}")
    held_out = (lambda index: index % EVAL_EVERY == 0) if split == "eval" else (lambda index: index % EVAL_EVERY != 0)
    selected = [line for index, line in enumerate(lines) if held_out(index)]
    return lambda: iter(selected)


def packed_rows(lines, tokenizer, sequence_length):
    """Yields (inputs, labels, weights) rows packed from an iterator of text lines."""
    chunk = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == CHUNK_LINES:
            yield from _pack_chunk(chunk, tokenizer, sequence_length)
            chunk = []
    if chunk:
        yield from _pack_chunk(chunk, tokenizer, sequence_length)


def token_lists(tokenizer, lines):
    """Token ids of `lines` as Python lists (keras-hub returns ragged tensors or lists)."""
    token_ids = tokenizer(tf.constant(list(lines)))
    if hasattr(token_ids, "to_list"):
        return token_ids.to_list()
    return [np.asarray(ids).tolist() for ids in token_ids]


def _pack_chunk(chunk, tokenizer, sequence_length):
    token_ids = token_lists(tokenizer, chunk)
    packed = pack_sentences([ids for ids in token_ids if ids], sequence_length)
    labels, weights = next_token_targets(packed)
    for row in range(len(labels)):
        yield {name: value[row] for name, value in packed.items()}, labels[row], weights[row]


def language_model_dataset(lines_fn, tokenizer, sequence_length, batch_size, training, seed=0, skip_batches=0):
    """The batched tf.data pipeline of packed rows.

    Args:
        lines_fn: function returning an iterator of text lines (`corpus_lines`).
        tokenizer: a keras-hub tokenizer.
        sequence_length, batch_size: static shapes (drop_remainder).
        training: repeat and shuffle (seeded, so the order is reproducible).
        seed: shuffle seed.
        skip_batches: batches already consumed (the data position of a resumed run).
    """
    row = tf.TensorSpec((sequence_length,), tf.int32)
    signature = ({"token_ids": row, "segment_ids": row, "positions": row}, row, tf.TensorSpec((sequence_length,), tf.float32))
    dataset = tf.data.Dataset.from_generator(lambda: packed_rows(lines_fn(), tokenizer, sequence_length), output_signature=signature)
    if training:
        dataset = dataset.repeat().shuffle(2048, seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    if skip_batches:
        dataset = dataset.skip(skip_batches)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    options.deterministic = True
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


def tokens_per_word(lines, tokenizer):
    """Subword tokens per whitespace word over `lines` (tensor2tensor's per-word perplexity ratio)."""
    lines = list(lines)
    words = sum(len(line.split()) for line in lines)
    if not words:
        raise ValueError("The evaluation text has no words.")
    tokens = sum(len(ids) for ids in token_lists(tokenizer, lines))
    return tokens / words
