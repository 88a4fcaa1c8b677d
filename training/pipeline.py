"""tf.data input pipelines: text -> WordPiece ids -> packed LM rows or masked-LM examples.

Sources: the shipped sample corpus, any folder of .txt files, or LM1B through
tensorflow-datasets (`lm1b`, any data_dir including gs://). Rows are packed
tensor2tensor-style (`training.data.pack_sentences`): fixed length, int32, segment ids and
positions per sentence, batched with drop_remainder so that a TPU sees static shapes.
"""

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
    """Every .txt file under `data_dir`, sorted; local or any tf.io.gfile path (gs://...)."""
    if not data_dir:
        raise ValueError("training.data_dir must name a folder of .txt files for dataset='text_files'.")
    data_dir = str(data_dir)
    if not tf.io.gfile.isdir(data_dir):
        raise ValueError(f"Corpus folder not found. Received: task.data_dir={data_dir!r}")
    files = sorted(
        tf.io.gfile.join(root, name) for root, _, names in tf.io.gfile.walk(data_dir) for name in names if name.endswith(".txt")
    )
    if not files:
        raise ValueError(f"No .txt files under task.data_dir={data_dir!r}")
    return files


def _stream_lines(files):
    """Non-empty stripped lines of text files, read lazily (corpora larger than memory)."""
    for path in files:
        with tf.io.gfile.GFile(path, "r") as file:
            for line in file:
                line = line.strip()
                if line:
                    yield line


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
        all_lines = lambda: iter(lines)  # noqa: E731
    elif dataset == "text_files":
        files = _text_files(data_dir)
        if next(_stream_lines(files), None) is None:
            raise ValueError(f"The corpus under task.data_dir={str(data_dir)!r} is empty.")
        all_lines = lambda: _stream_lines(files)  # noqa: E731
    else:
        raise ValueError(f"`dataset` must be one of sample, lm1b, text_files. Received: dataset={dataset!r}")
    held_out = (lambda index: index % EVAL_EVERY == 0) if split == "eval" else (lambda index: index % EVAL_EVERY != 0)
    return lambda: (line for index, line in enumerate(all_lines()) if held_out(index))


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
    return _batched(dataset, batch_size, training, seed, skip_batches).prefetch(tf.data.AUTOTUNE)


def _batched(dataset, batch_size, training, seed, skip_batches):
    """Repeats and shuffles (seeded) when training, batches with drop_remainder (static
    shapes), skips the batches a resumed run already consumed, shards by data."""
    if training:
        dataset = dataset.repeat().shuffle(2048, seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    if skip_batches:
        dataset = dataset.skip(skip_batches)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    options.deterministic = True
    return dataset.with_options(options)


def tokens_per_word(lines, tokenizer):
    """Subword tokens per whitespace word over `lines` (tensor2tensor's per-word perplexity ratio)."""
    lines = list(lines)
    words = sum(len(line.split()) for line in lines)
    if not words:
        raise ValueError("The evaluation text has no words.")
    tokens = sum(len(ids) for ids in token_lists(tokenizer, lines))
    return tokens / words


def masked_lm_dataset(
    lines_fn, tokenizer, sequence_length, batch_size, max_predictions, mask_rate, training, seed=0, skip_batches=0
):
    """The batched tf.data pipeline of BERT masked-LM examples.

    Consecutive lines form a segment pair ([CLS] A [SEP] B [SEP], truncated round-robin
    to `sequence_length` by keras-hub's MultiSegmentPacker); keras-hub's
    MaskedLMMaskGenerator picks `mask_rate` of the real tokens (at most
    `max_predictions`) and replaces 80% of them by [MASK], 10% by a random token and
    keeps 10%. There is no next-sentence objective (RoBERTa found it does not help).

    Yields (inputs, labels, weights): inputs are the encoder's `input_word_ids`,
    `input_mask`, `input_type_ids` plus `masked_lm_positions`, int32 (B, T) and (B, P);
    labels the original ids at those positions, weights 1.0 for real predictions.
    """
    import keras_hub

    special = {token: tokenizer.token_to_id(token) for token in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")}
    packer = keras_hub.layers.MultiSegmentPacker(
        sequence_length, start_value=special["[CLS]"], end_value=special["[SEP]"], pad_value=special["[PAD]"],
        truncate="round_robin",
    )
    masker = keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=tokenizer.vocabulary_size(),
        mask_selection_rate=mask_rate,
        mask_token_id=special["[MASK]"],
        mask_selection_length=max_predictions,
        unselectable_token_ids=[special["[PAD]"], special["[CLS]"], special["[SEP]"]],
    )

    def to_example(pairs_Bx2):
        token_ids, segment_ids = packer((tokenizer(pairs_Bx2[:, 0]), tokenizer(pairs_Bx2[:, 1])))
        masked = masker(token_ids)
        shape = (batch_size, sequence_length)
        inputs = {
            "input_word_ids": tf.ensure_shape(tf.cast(masked["token_ids"], tf.int32), shape),
            "input_mask": tf.ensure_shape(tf.cast(token_ids != special["[PAD]"], tf.int32), shape),
            "input_type_ids": tf.ensure_shape(tf.cast(segment_ids, tf.int32), shape),
            "masked_lm_positions": tf.ensure_shape(tf.cast(masked["mask_positions"], tf.int32), (batch_size, max_predictions)),
        }
        return inputs, tf.cast(masked["mask_ids"], tf.int32), tf.cast(masked["mask_weights"], tf.float32)

    dataset = tf.data.Dataset.from_generator(lines_fn, output_signature=tf.TensorSpec((), tf.string))
    dataset = dataset.filter(lambda line: tf.strings.length(tf.strings.strip(line)) > 0).batch(2, drop_remainder=True)
    dataset = _batched(dataset, batch_size, training, seed, skip_batches)
    return dataset.map(to_example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(tf.data.AUTOTUNE)
