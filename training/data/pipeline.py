"""tf.data input pipelines: text -> WordPiece ids -> packed LM rows or masked-LM examples.

Sources: the shipped sample corpus, any folder of .txt files, LM1B through
tensorflow-datasets (`lm1b`, any data_dir including gs://), or the shards that
`concise-prepare-data` made of one of them once (`prepared_dataset`: batch N read directly). Rows are packed
tensor2tensor-style (`training.data.packing.pack_sentences`): fixed length, int32, segment ids and
positions per sentence, batched with drop_remainder so that a TPU sees static shapes.
"""

import codecs
import itertools

import numpy as np
import tensorflow as tf

from concise_attention.training.data.packing import SAMPLE_CORPUS
from concise_attention.training.data.packing import next_token_targets
from concise_attention.training.data.packing import pack_sentences
from concise_attention.training.data.packing import read_lines
from concise_attention.training.data.shards import causal_lm_batches

# Every EVAL_EVERY-th line of a text corpus is held out for evaluation...
EVAL_EVERY = 20
# ...unless the corpus folder has these sub-folders (scripts/make_corpus.py's layout): its two splits.
SPLIT_FOLDERS = ("train", "heldout")
# Sentences tokenised and packed together; rows never mix sentences across chunks.
CHUNK_LINES = 4096
# Held-out lines over which the subwords per word (per-word perplexity) are counted.
EVAL_WORD_LINES = 20_000
# Bytes decoded at a time when a corpus file is checked for UTF-8.
CHECK_CHUNK_BYTES = 1 << 24


def _text_files(data_dir, field="task.data_dir"):
    """Every .txt file under `data_dir`, sorted, or `data_dir` itself if it is a .txt file; local or any
    tf.io.gfile path (gs://...). `field` is the setting or flag that named it, for the error messages."""
    if not data_dir:
        raise ValueError(f"{field} must name a folder of .txt files for dataset='text_files'.")
    data_dir = str(data_dir)
    if not tf.io.gfile.isdir(data_dir):  # one call for a folder, the usual case (a request each on gs://)
        if not tf.io.gfile.exists(data_dir):
            raise ValueError(f"Corpus folder or .txt file not found. Received: {field}={data_dir!r}")
        if not data_dir.endswith(".txt"):
            raise ValueError(f"Not a folder of .txt files nor a .txt file. Received: {field}={data_dir!r}")
        return [data_dir]
    files = sorted(
        tf.io.gfile.join(root, name)
        for root, _, names in tf.io.gfile.walk(data_dir)
        for name in names
        if name.endswith(".txt")
    )
    if not files:
        raise ValueError(f"No .txt files under {field}={data_dir!r}")
    return files


def _stream_lines(files):
    """Non-empty stripped lines of text files, read lazily (corpora larger than memory)."""
    for path in files:
        with tf.io.gfile.GFile(path, "r") as file:
            for line in file:
                line = line.strip()
                if line:
                    yield line


def check_utf8(path):
    """Raises a ValueError naming `path` and the line of its first bytes that are not UTF-8.

    One pass over the file, decoded in C in chunks of CHECK_CHUNK_BYTES (hundreds of MB/s).
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    lines = 0
    with tf.io.gfile.GFile(path, "rb") as file:
        while True:
            chunk = file.read(CHECK_CHUNK_BYTES)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as error:
                # error.object is the chunk, after at most 3 bytes (no newline) held from the last one.
                line = lines + error.object[: error.start].count(b"\n") + 1
                raise ValueError(
                    f"{path}, line {line}: not valid UTF-8 (byte 0x{error.object[error.start]:02x}). The corpus must be "
                    "UTF-8 text: re-encode the file (e.g. iconv -f latin1 -t utf-8) or remove the line."
                ) from None
            if not chunk:
                return
            lines += chunk.count(b"\n")


def _checked_text_files(data_dir, split_name=None, field="task.data_dir"):
    """The .txt files of a corpus folder, checked before anything is trained: UTF-8
    throughout, not empty, and (a folder split by line, `split_name` None) a non-empty
    training split."""
    files = _text_files(data_dir, field)
    for path in files:
        check_utf8(path)
    first_lines = list(itertools.islice(_stream_lines(files), 2))
    if not first_lines:
        raise ValueError(
            f"The corpus under {field}={str(data_dir)!r} is empty."
            if split_name is None
            else f"The {split_name} split of {field} is empty: no non-empty line in the .txt files under {str(data_dir)!r}."
        )
    if len(first_lines) == 1 and split_name is None:
        raise ValueError(
            f"The training split of {field}={str(data_dir)!r} is empty: the corpus has 1 non-empty line, held out for "
            f"evaluation (every {EVAL_EVERY}th line is, from the first). Add text: training needs at least 2 lines."
        )
    return files


def split_folders(data_dir):
    """(train, heldout) sub-folders of `data_dir` when it has the layout `scripts/make_corpus.py`
    writes (`train/` and `heldout/`, held out by document), else None."""
    folders = tuple(tf.io.gfile.join(str(data_dir), name) for name in SPLIT_FOLDERS)
    return folders if data_dir and all(tf.io.gfile.isdir(folder) for folder in folders) else None


def corpus_splits(dataset, data_dir=None, field="task.data_dir"):
    """(train, eval): functions returning a fresh iterator over the lines of each split.

    Checks the source at once (missing folder, no files, text that is not UTF-8, an empty
    corpus or training split) so that bad data fails before any training starts. A text
    corpus holds out every EVAL_EVERY-th non-empty line for evaluation, unless its folder has
    `train/` and `heldout/` sub-folders (`scripts/make_corpus.py`'s layout: held out by
    document), which are then the two splits; LM1B has its own. `data_dir` may also be one .txt
    file. `field` is the setting or flag that gave `data_dir`: its errors name it.
    """
    if dataset == "lm1b":
        return _lm1b_lines(data_dir, "train"), _lm1b_lines(data_dir, "test")
    folders = split_folders(data_dir) if dataset == "text_files" else None
    if dataset == "sample":
        lines = read_lines(SAMPLE_CORPUS)
        all_lines = lambda: iter(lines)  # noqa: E731
    elif folders:
        train_files, eval_files = (
            _checked_text_files(folder, name, field) for folder, name in zip(folders, ("training", "held-out"))
        )
        return lambda: _stream_lines(train_files), lambda: _stream_lines(eval_files)
    elif dataset == "text_files":
        files = _checked_text_files(data_dir, field=field)
        all_lines = lambda: _stream_lines(files)  # noqa: E731
    else:
        raise ValueError(f"`dataset` must be one of sample, lm1b, text_files. Received: dataset={dataset!r}")
    return (
        lambda: (line for index, line in enumerate(all_lines()) if index % EVAL_EVERY != 0),
        lambda: (line for index, line in enumerate(all_lines()) if index % EVAL_EVERY == 0),
    )


def corpus_lines(dataset, data_dir=None, split="train"):
    """A function returning a fresh iterator over the lines of a split ("train" or "eval")
    (see `corpus_splits`)."""
    if split not in ("train", "eval"):
        raise ValueError(f"`split` must be 'train' or 'eval'. Received: split={split!r}")
    return corpus_splits(dataset, data_dir)[split == "eval"]


def _lm1b_lines(data_dir, split):
    import tensorflow_datasets as tfds  # heavy; only the TFDS readers need it

    builder = tfds.builder("lm1b", data_dir=data_dir)

    def lm1b_lines():
        for example in builder.as_dataset(split=split, shuffle_files=False):
            yield example["text"].numpy().decode("utf-8")

    return lm1b_lines


def _chunks(lines):
    """Lists of CHUNK_LINES consecutive lines (the last one shorter)."""
    chunk = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == CHUNK_LINES:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def packed_chunks(lines, tokenizer, sequence_length):
    """Yields dicts of packed int32 rows (`pack_sentences`), one per CHUNK_LINES lines of text."""
    for chunk in _chunks(lines):
        yield pack_sentences([ids for ids in token_lists(tokenizer, chunk) if ids], sequence_length)


def packed_rows(lines, tokenizer, sequence_length):
    """Yields (inputs, labels, weights) rows packed from an iterator of text lines."""
    for packed in packed_chunks(lines, tokenizer, sequence_length):
        labels, weights = next_token_targets(packed)
        for row in range(len(labels)):
            yield {name: value[row] for name, value in packed.items()}, labels[row], weights[row]


def token_lists(tokenizer, lines):
    """Token ids of `lines` as Python lists (keras-hub returns ragged tensors or lists)."""
    token_ids = tokenizer(tf.constant(list(lines)))
    if hasattr(token_ids, "to_list"):
        return token_ids.to_list()
    return [np.asarray(ids).tolist() for ids in token_ids]


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
    signature = (
        {"token_ids": row, "segment_ids": row, "positions": row},
        row,
        tf.TensorSpec((sequence_length,), tf.float32),
    )
    dataset = tf.data.Dataset.from_generator(
        lambda: packed_rows(lines_fn(), tokenizer, sequence_length), output_signature=signature
    )
    return _batched(dataset, batch_size, training, seed, skip_batches).prefetch(tf.data.AUTOTUNE)


def _batched(dataset, batch_size, training, seed, skip_batches, indexed=False):
    """Repeats and shuffles (seeded) when training, batches with drop_remainder (static
    shapes), skips the batches a resumed run already consumed, shards by data.

    indexed: yield (batch index, batch), the index counted from the first batch of the
    run, so that randomness keyed on it is the same whether or not batches were skipped.
    """
    if training:
        dataset = dataset.repeat().shuffle(2048, seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    if indexed:
        dataset = dataset.enumerate()
    if skip_batches:
        dataset = dataset.skip(skip_batches)
    return _deterministic(dataset)


def _deterministic(dataset):
    """Deterministic element order; sharded by data across workers."""
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


def bert_masking(token_ids_BxT, key, vocabulary_size, mask_rate, max_predictions, mask_id, unselectable_ids):
    """BERT's masked-LM corruption of a batch, a pure function of `key` (int64 [2]).

    In each row, round(`mask_rate` * real tokens) positions (at least 1, at most
    `max_predictions`) are drawn uniformly among the tokens not in `unselectable_ids`;
    80% of them become `mask_id`, 10% a random id, 10% stay.

    Returns (masked_BxT, positions_BxP, labels_BxP, weights_BxP): the corrupted rows, the
    chosen positions (ascending, 0-padded), the original ids there (0 where padded) and
    1.0 for real predictions; P = `max_predictions`.
    """
    token_ids_BxT = tf.cast(token_ids_BxT, tf.int32)
    length = tf.shape(token_ids_BxT)[1]
    choice_key, replace_key, random_key = tf.unstack(tf.random.experimental.stateless_split(key, 3))
    selectable_BxT = tf.reduce_all(token_ids_BxT[..., None] != tf.constant(unselectable_ids, tf.int32), axis=-1)
    real_B = tf.reduce_sum(tf.cast(selectable_BxT, tf.float32), axis=1)
    count_B = tf.minimum(tf.cast(tf.maximum(1.0, tf.round(real_B * mask_rate)), tf.int32), max_predictions)
    count_B = tf.where(real_B > 0, count_B, 0)
    # A uniform random subset of `count` selectable positions: the highest random scores.
    scores_BxT = tf.where(selectable_BxT, tf.random.stateless_uniform(tf.shape(token_ids_BxT), choice_key), -1.0)
    candidates_BxP = tf.math.top_k(scores_BxT, k=max_predictions).indices
    chosen_BxP = tf.range(max_predictions)[None, :] < count_B[:, None]
    selected_BxT = tf.reduce_any(
        tf.logical_and(tf.one_hot(candidates_BxP, length, on_value=True, off_value=False), chosen_BxP[..., None]),
        axis=1,
    )
    # Ascending positions: the largest (length - position) of the selected ones first.
    order_BxP = tf.math.top_k(tf.where(selected_BxT, length - tf.range(length)[None, :], 0), k=max_predictions).values
    weights_BxP = tf.cast(order_BxP > 0, tf.float32)
    positions_BxP = tf.where(order_BxP > 0, length - order_BxP, 0)
    labels_BxP = tf.where(order_BxP > 0, tf.gather(token_ids_BxT, positions_BxP, batch_dims=1), 0)
    draw_BxT = tf.random.stateless_uniform(tf.shape(token_ids_BxT), replace_key)
    random_ids_BxT = tf.random.stateless_uniform(
        tf.shape(token_ids_BxT), random_key, minval=0, maxval=vocabulary_size, dtype=tf.int32
    )
    masked_BxT = tf.where(
        tf.logical_and(selected_BxT, draw_BxT < 0.8),
        mask_id,
        tf.where(tf.logical_and(selected_BxT, draw_BxT < 0.9), random_ids_BxT, token_ids_BxT),
    )
    return masked_BxT, positions_BxP, labels_BxP, weights_BxP


def segment_pair_packer(tokenizer, sequence_length):
    """A function string pairs [B, 2] -> (token_ids, segment_ids) int32 [B, sequence_length]:
    [CLS] A [SEP] B [SEP], truncated round-robin (`WordPieceTokenizer.pack`, the exported preprocessor's)."""

    def pack(pairs_Bx2):
        inputs = tokenizer.pack([pairs_Bx2[:, 0], pairs_Bx2[:, 1]], sequence_length)
        return inputs["input_word_ids"], inputs["input_type_ids"]

    return pack


def segment_pair_chunks(lines, tokenizer, sequence_length):
    """Yields dicts of unmasked int32 segment-pair rows (token_ids, segment_ids), one per
    CHUNK_LINES lines; consecutive lines form a pair (an odd last line is dropped)."""
    pack = segment_pair_packer(tokenizer, sequence_length)
    for chunk in _chunks(lines):
        if len(chunk) >= 2:  # CHUNK_LINES is even: only the last chunk can end on an unpaired line
            token_ids, segment_ids = pack(tf.reshape(tf.constant(chunk[: len(chunk) // 2 * 2]), (-1, 2)))
            yield {"token_ids": np.asarray(token_ids, "int32"), "segment_ids": np.asarray(segment_ids, "int32")}


def masked_examples(tokenizer, sequence_length, batch_size, max_predictions, mask_rate, seed):
    """A function (batch index, token_ids, segment_ids) -> (inputs, labels, weights) of one
    batch of unmasked segment-pair rows: the masks of batch i are keyed on (seed, i)."""
    special = {token: tokenizer.token_to_id(token) for token in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")}
    vocabulary_size = tokenizer.vocabulary_size()
    unselectable = [special["[PAD]"], special["[CLS]"], special["[SEP]"]]

    def to_example(batch_index, token_ids, segment_ids):
        key = tf.random.experimental.stateless_fold_in(tf.constant([seed, 0], tf.int64), batch_index)
        masked, positions, labels, weights = bert_masking(
            token_ids, key, vocabulary_size, mask_rate, max_predictions, special["[MASK]"], unselectable
        )
        shape = (batch_size, sequence_length)
        inputs = {
            "input_word_ids": tf.ensure_shape(masked, shape),
            "input_mask": tf.ensure_shape(tf.cast(token_ids != special["[PAD]"], tf.int32), shape),
            "input_type_ids": tf.ensure_shape(tf.cast(segment_ids, tf.int32), shape),
            "masked_lm_positions": tf.ensure_shape(positions, (batch_size, max_predictions)),
        }
        # Static shapes everywhere (a TPU compiles one program for one shape).
        return (
            inputs,
            tf.ensure_shape(labels, (batch_size, max_predictions)),
            tf.ensure_shape(weights, (batch_size, max_predictions)),
        )

    return to_example


def masked_lm_dataset(
    lines_fn, tokenizer, sequence_length, batch_size, max_predictions, mask_rate, training, seed=0, skip_batches=0
):
    """The batched tf.data pipeline of BERT masked-LM examples.

    Consecutive lines form a segment pair ([CLS] A [SEP] B [SEP], truncated round-robin to
    `sequence_length` as the exported preprocessor packs them), corrupted by `bert_masking`
    with masks keyed on (seed, batch index): a resumed run draws those it would have drawn.
    No next-sentence objective (RoBERTa found it does not help).

    Yields (inputs, labels, weights): the encoder's inputs plus `masked_lm_positions` (B, P),
    the original ids at those positions, and 1.0 for real predictions.
    """
    pack = segment_pair_packer(tokenizer, sequence_length)
    mask = masked_examples(tokenizer, sequence_length, batch_size, max_predictions, mask_rate, seed)
    dataset = tf.data.Dataset.from_generator(lines_fn, output_signature=tf.TensorSpec((), tf.string))
    dataset = dataset.filter(lambda line: tf.strings.length(tf.strings.strip(line)) > 0).batch(2, drop_remainder=True)
    dataset = _batched(dataset, batch_size, training, seed, skip_batches, indexed=True)
    return dataset.map(
        lambda index, pairs: mask(index, *pack(pairs)), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    ).prefetch(tf.data.AUTOTUNE)


def prepared_dataset(reader, batch_size, skip_batches=0, mask=None):
    """The batched tf.data pipeline of a prepared split (`training.data.shards.ShardReader`).

    Batch i is read directly (`ShardReader.batch`): resuming at batch N reads one shard,
    whatever N is. The train split repeats over epochs in its seeded order; the eval split is
    read once in its stored order.

    Args:
        reader: a ShardReader of the split.
        batch_size: rows per batch (drop_remainder).
        skip_batches: batches already consumed (the data position of a resumed run).
        mask: None for causal_lm rows (next-token targets), else `masked_examples(...)`.
    """
    length = reader.manifest["sequence_length"]
    row = tf.TensorSpec((batch_size, length), tf.int32)
    if mask is None:
        signature = ({name: row for name in reader.fields}, row, tf.TensorSpec((batch_size, length), tf.float32))
        dataset = tf.data.Dataset.from_generator(
            lambda: causal_lm_batches(reader, batch_size, skip_batches), output_signature=signature
        )
    else:
        rows = lambda: (
            (index, packed["token_ids"], packed["segment_ids"])
            for index, packed in reader.batches(batch_size, skip_batches)
        )  # noqa: E731
        signature = (tf.TensorSpec((), tf.int64), row, row)
        dataset = tf.data.Dataset.from_generator(rows, output_signature=signature).map(
            mask, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
        )
    return _deterministic(dataset).prefetch(tf.data.AUTOTUNE)
