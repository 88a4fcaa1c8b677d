"""Sentence embeddings of a list of strings: `SentenceEncoder` (a preset or run by name, `encode`).

    >>> from concise_attention.training.inference.embeddings import SentenceEncoder
    >>> encoder = SentenceEncoder.from_preset("concise-minilm-d192")   # or a folder: run, export, preset, Hugging Face
    >>> vectors = encoder.encode(["A man is playing a guitar.", "Stocks fell."])   # (2, width) float32, unit rows

Texts are tokenised as the encoder's vocabulary says (`training.preprocessing.tokenizer`, BERT's WordPiece), cut to
`sequence_length` tokens, sorted by length and run in batches, each padded to its own longest text, so
that short texts cost little; the embedding is the mean of the token vectors over the real tokens
(sentence-transformers' mean pooling), scaled to unit length unless `normalize=False`.
"""

import collections.abc
import numbers

import numpy as np
import tensorflow as tf
from tqdm import tqdm

from concise_attention.models.heads import mean_pooled
from concise_attention.models.heads import unit
from concise_attention.training import artifacts


SORT_WINDOW = 32_768  # texts tokenised and length-sorted together (a multiple of the usual batch sizes)
# Rows sorted by length are cut into batches (served: chunks) of at most batch_size rows, none longer than this
# ratio times the batch's first (`batch_end`), so a batch padded to its longest row pads little even when a
# request's texts differ widely in length; rows of like lengths still go batch_size at a time.
LENGTH_RATIO = 1.5
# Tokens one forward pass of `encode` holds at most: a larger batch_size is cut to MAX_BATCH_TOKENS // sequence_length
# rows (128 at 256 tokens), so peak memory is bounded whatever the caller asks; the embeddings are the same.
MAX_BATCH_TOKENS = 32_768


class SentenceEncoder:
    """A backbone (`BertEncoder`), its tokenizer and the pooling: `encode(texts)` -> numpy (N, width)."""

    def __init__(self, backbone, tokenizer, sequence_length=128):
        limit = getattr(backbone, "max_sequence_length", sequence_length)
        if (
            isinstance(sequence_length, bool)
            or not isinstance(sequence_length, numbers.Integral)
            or not 3 <= sequence_length <= limit
        ):
            raise ValueError(
                f"`sequence_length` must be an integer in [3, the encoder's max_sequence_length={limit}]. "
                f"Received: sequence_length={sequence_length!r}"
            )
        self.backbone, self.tokenizer, self.sequence_length = backbone, tokenizer, int(sequence_length)

        def forward(word_ids, mask):  # pooled in the graph: (B, D) comes back, not (B, T, D)
            inputs = {"input_word_ids": word_ids, "input_mask": mask, "input_type_ids": tf.zeros_like(word_ids)}
            return mean_pooled(backbone(inputs, training=False)["sequence_output"], mask)

        # One trace for every batch shape: a text's vector then depends on its batch alone, not on the shapes
        # traced before it (what lets sharded teacher outputs equal unsharded ones bit for bit).
        ids = tf.TensorSpec([None, None], tf.int32)
        self._forward = tf.function(forward, input_signature=[ids, ids])

    @classmethod
    def from_preset(cls, preset, sequence_length=None):
        """Any model on disk `training.artifacts.read` reads: a shipped preset's name (`models.presets.shipped_presets()`),
        a Keras preset folder, a `concise-export` folder (or one OUT/hub/<version>), a run directory (local or gs://)
        or a Hugging Face folder (a sentence-transformers one with mean pooling too); `sequence_length` defaults to the length the source
        records for serving (a shipped preset: its teacher's, 256; a sentence-transformers folder: its
        `max_seq_length`), else the length it was trained at (a run), else 128 (`artifacts.Source.serving_length`)."""
        source = artifacts.read(preset)
        artifacts.check_mean_pooling(source)
        loaded = artifacts.LoadedModel(source, artifacts.load_backbone(source))  # the encoder alone: no head is built
        return cls(
            loaded.backbone, loaded.tokenizer, source.serving_length if sequence_length is None else sequence_length
        )

    @property
    def width(self):
        return self.backbone.embedding_size

    def encode(self, texts, batch_size=32, normalize=True, progress=None):
        """float32 (len(texts), width): one embedding per text, in the order given. texts: a list (or any
        iterable, a numpy or 1-D string tensor) of str, or of bytes in UTF-8; one text alone (a str, bytes, a
        0-d array or tensor) gives its float32 (width,) vector, as sentence-transformers' `encode` does;
        `progress`: a progress bar's caption (True: "encoding"), None or False for none."""
        if hasattr(texts, "numpy") and callable(texts.numpy):  # a TensorFlow string tensor
            texts = texts.numpy()
        if isinstance(texts, (str, bytes, np.str_, np.bytes_)) or (isinstance(texts, np.ndarray) and texts.ndim == 0):
            return self.encode(
                [texts.item() if isinstance(texts, np.ndarray) else texts], batch_size, normalize, progress
            )[0]
        texts = _as_texts(texts)
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"`batch_size` must be a positive integer. Received: batch_size={batch_size!r}")
        if not isinstance(normalize, (bool, np.bool_)):
            raise ValueError(f"`normalize` must be True or False. Received: normalize={normalize!r}")
        if progress is True:
            progress = "encoding"
        if not (progress is None or progress is False or isinstance(progress, str)):
            raise ValueError(f"`progress` must be a caption (a string), True or None. Received: progress={progress!r}")
        if not texts:
            return np.zeros((0, self.width), np.float32)
        batch_size = min(int(batch_size), max(1, MAX_BATCH_TOKENS // self.sequence_length))
        pooled = self.pooled(texts, batch_size, progress or None)
        return unit_rows(pooled) if normalize else pooled

    def pooled(self, texts, batch_size=32, progress=None, window=None, ratio=LENGTH_RATIO):
        """The mean of the token vectors over each text's real tokens, float32 (N, width), computed in
        length-sorted batches (`batch_end`: at most `batch_size` texts, none longer than `ratio` times the
        batch's shortest; None: `batch_size` at a time), each padded to its longest text (cut to
        sequence_length). Texts are tokenised and sorted `window` at a time (default SORT_WINDOW; 0: all
        at once), so memory grows with the number of texts only through the result.
        """
        window = SORT_WINDOW if window is None else (window or max(1, len(texts)))
        pad = self.tokenizer.token_to_id("[PAD]")
        pooled = np.zeros((len(texts), self.width), np.float32)
        bar = tqdm(total=len(texts), desc=progress, unit="text", mininterval=2.0, disable=progress is None)
        for start in range(0, len(texts), window):
            ids = token_ids(self.tokenizer, texts[start : start + window], self.sequence_length)
            lengths = np.array([len(row) for row in ids])
            order = np.argsort(lengths, kind="stable")
            ordered, first = tf.constant(lengths[order], tf.int32), 0
            while first < len(ids):
                last = int(batch_end(ordered, first, batch_size, ratio))
                rows, first = order[first:last], last
                word_ids, mask = padded([ids[row] for row in rows], pad)
                pooled[start + rows] = self._forward(tf.constant(word_ids), tf.constant(mask)).numpy()
                bar.update(len(rows))
        bar.close()
        return pooled


def unit_rows(vectors):
    """float32 numpy rows at unit length (`models.heads.unit`)."""
    return np.asarray(unit(tf.constant(vectors, tf.float32)))


def _as_texts(texts):
    """`encode`'s texts as a list of str; anything else is one ValueError naming the first bad element."""
    if isinstance(texts, collections.abc.Mapping) or not isinstance(texts, collections.abc.Iterable):
        raise ValueError(f"`texts` must be a list of strings. Received: texts of type {type(texts).__name__}")
    texts = list(texts)  # a generator too
    for index, text in enumerate(texts):
        if isinstance(text, (bytes, np.bytes_)):
            try:
                texts[index] = bytes(text).decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"`texts[{index}]` is bytes but not UTF-8 ({error.reason} at byte {error.start})."
                ) from None
        elif isinstance(text, str):
            texts[index] = str(text)  # numpy's str_ too
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as error:  # a lone surrogate: no UTF-8 for the tokenizer to read
                raise ValueError(
                    f"`texts[{index}]` is not valid Unicode ({error.reason} at character {error.start}): {text!r:.80}"
                ) from None
        else:
            raise ValueError(
                f"`texts` must be a list of strings. Received: texts[{index}] of type {type(text).__name__}: {text!r:.80}"
            )
    return texts


def padded(rows, pad):
    """Id rows -> (word ids, mask), int32 (N, longest row), padded with `pad`."""
    width = max(len(row) for row in rows)
    word_ids = np.full((len(rows), width), pad, np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for line, row in enumerate(rows):
        word_ids[line, : len(row)], mask[line, : len(row)] = row, 1
    return word_ids, mask


def batch_end(sorted_lengths, start, batch_size, ratio=LENGTH_RATIO):
    """Where the batch that starts at row `start` of rows sorted by length (ascending, int32 [N]) ends: after at
    most `batch_size` rows, none longer than `ratio` times its first (ratio None: `batch_size` rows). TensorFlow
    ops, one rule for `encode`'s batches and the served chunks; a request of like lengths (all within `ratio` of
    its shortest) is cut `batch_size` at a time, as without the rule."""
    end = tf.minimum(start + batch_size, tf.size(sorted_lengths))
    if ratio is None:
        return end
    first = tf.cast(tf.maximum(sorted_lengths[start], 1), tf.float32)
    limit = tf.cast(tf.floor(first * ratio), sorted_lengths.dtype)
    within = tf.searchsorted(sorted_lengths[None], limit[None, None], side="right")[0, 0]
    return tf.minimum(end, tf.maximum(within, start + 1))


def bucket_lengths(seq_length, bucket, shortest=2):
    """The lengths a batch is padded to when padded to a multiple of `bucket`: the multiples below
    `seq_length` that hold `shortest` tokens ([CLS] [SEP] of an empty text), then `seq_length` (served
    chunks, `export.chunking`; distillation batches, `task.length_bucket`)."""
    return [*range(-(-shortest // bucket) * bucket, seq_length, bucket), seq_length]


def token_ids(tokenizer, texts, sequence_length, chunk=1024):
    """[CLS] text [SEP] ids of each text, as the student's packer makes them: pieces cut to sequence_length - 2,
    read from the first `sequence_length` words of each text only (as the export's preprocessor reads them), so
    a text's cost is bounded whatever its size."""
    first, last = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    rows = []
    for start in range(0, len(texts), chunk):
        pieces = tokenizer(tf.constant(texts[start : start + chunk]), max_length=sequence_length)
        rows += [[first, *row[: sequence_length - 2], last] for row in pieces.to_list()]
    return rows
