"""Prepared data: tokenised, packed rows in `.npy` shards, and the order training reads them in.

This module owns the format; it imports numpy only, so that a machine without TensorFlow
(the JAX shard trainer, `training.trainers.shard_trainer`) reads what `training.trainers.prepare_data` wrote.

    DIR/manifest.json        written last: format, task, fields, sequence_length, the
                             vocabulary's SHA-256 and size, tokenizer settings, source, and
                             per split its shards, rows, lines, tokens (and the eval text's
                             subwords per word, for per-word perplexity)
    DIR/vocab.txt            the vocabulary the rows were tokenised with
    DIR/train-00000.npy ...  int32 (rows, fields, sequence_length); every shard but the last
    DIR/eval-00000.npy  ...  of a split holds `rows_per_shard` rows; training rows are stored
                             in a seeded random order, held-out rows in the corpus order

Fields: causal_lm rows are tensor2tensor-packed `token_ids`, `segment_ids`, `positions`
(next-token targets are derived when read, `training.data.packing.next_token_targets`); masked_lm
rows are the unmasked `[CLS] A [SEP] B [SEP]` `token_ids` and their `segment_ids` (the masks
are drawn at training time from (seed, batch index)).

The training order is a pure function of (seed, global row index): epoch e = index // rows
visits the shards in the order of a permutation seeded by (seed, e), and the rows of each
shard in the order of a permutation seeded by (seed, e, shard). So the batch at step N is
computed directly, reading one shard (two where a batch straddles shards), whatever N is.
"""

import hashlib
import io
import json

import numpy as np

from concise_attention.training.data.packing import next_token_targets

FORMAT = "concise-prepared-data/1"
MANIFEST = "manifest.json"
VOCABULARY = "vocab.txt"
FIELDS = {"causal_lm": ("token_ids", "segment_ids", "positions"), "masked_lm": ("token_ids", "segment_ids")}
SPLITS = ("train", "eval")


def vocabulary_sha256(tokens):
    """SHA-256 of a vocabulary as its tokens, one per line (independent of the file's line ends)."""
    return hashlib.sha256(("\n".join(tokens) + "\n").encode("utf-8")).hexdigest()


def shard_name(split, index):
    return f"{split}-{index:05d}.npy"


def shard_bytes(rows_RxFxT):
    """The .npy file of one shard (numpy's format: readable with numpy alone)."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(rows_RxFxT, dtype=np.int32), allow_pickle=False)
    return buffer.getvalue()


def manifest_bytes(manifest):
    return json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")


def _join(directory, name):
    return f"{str(directory).rstrip('/')}/{name}"


def read_manifest(data_dir, open_file=open):
    """The manifest of a prepared data folder; a missing or foreign one is an error naming it."""
    path = _join(data_dir, MANIFEST)
    try:
        with open_file(path, "rb") as file:
            data = file.read()
    except Exception:  # FileNotFoundError from open, tf.errors.NotFoundError from tf.io.gfile
        raise ValueError(
            f"No prepared data at task.data_dir={str(data_dir)!r}: {path} cannot be read "
            "(make it with concise-prepare-data)."
        ) from None
    try:
        manifest = json.loads(data)
    except ValueError as error:
        raise ValueError(f"{path} is not a prepared-data manifest ({error}).") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not a prepared-data manifest of format {FORMAT!r}.")
    return manifest


def check_manifest(manifest, data_dir, task, sequence_length, vocabulary=None, tokenizer=None):
    """Fails with one line naming the field when the shards do not fit the run.

    Args:
        vocabulary: the run's tokens (checked when given).
        tokenizer: the run's dict(lowercase, strip_accents) (checked when given).
    """
    path = _join(data_dir, MANIFEST)
    for field, value in (tokenizer or {}).items():
        if manifest["tokenizer"][field] != value:
            raise ValueError(
                f"{path} was tokenised with {field}={manifest['tokenizer'][field]!r}; the run has "
                f"tokenizer.{field}={value!r}."
            )
    if manifest["task"] != task:
        raise ValueError(f"{path} holds {manifest['task']} rows; this run's task is {task}.")
    if manifest["sequence_length"] != sequence_length:
        raise ValueError(
            f"{path} has sequence_length={manifest['sequence_length']}; the run has "
            f"training.sequence_length={sequence_length}."
        )
    if vocabulary is not None and vocabulary_sha256(vocabulary) != manifest["vocabulary_sha256"]:
        raise ValueError(
            f"{path}: the shards were tokenised with another vocabulary (vocabulary_sha256="
            f"{manifest['vocabulary_sha256'][:12]}...) than the run's; use tokenizer.vocabulary="
            f"{_join(data_dir, VOCABULARY)}."
        )


def epoch_shard_order(seed, epoch, num_shards):
    return np.random.default_rng([seed, epoch]).permutation(num_shards)


def shard_row_order(seed, epoch, shard, num_rows):
    return np.random.default_rng([seed, epoch, shard]).permutation(num_rows)


def training_rows(seed, start, count, shard_rows):
    """(shard, row) of global training rows start .. start + count - 1, in training order.

    Args:
        seed: the run's seed.
        start, count: the global row indices (batch b of size B: start = b * B, count = B).
        shard_rows: rows of each shard, in shard order.

    Returns:
        (shards, rows): int arrays of length `count`.
    """
    shard_rows = np.asarray(shard_rows, np.int64)
    total = int(shard_rows.sum())
    shards, rows = np.empty(count, np.int64), np.empty(count, np.int64)
    position = 0
    while position < count:
        epoch, offset = divmod(start + position, total)
        order = epoch_shard_order(seed, epoch, len(shard_rows))
        ends = np.cumsum(shard_rows[order])
        slot = int(np.searchsorted(ends, offset, side="right"))
        shard = int(order[slot])
        within = offset - (ends[slot] - shard_rows[shard])
        take = min(count - position, int(shard_rows[shard] - within))
        shards[position : position + take] = shard
        rows[position : position + take] = shard_row_order(seed, epoch, shard, int(shard_rows[shard]))[
            within : within + take
        ]
        position += take
    return shards, rows


def load_shard(data_dir, split, index, open_file=open):
    with open_file(_join(data_dir, shard_name(split, index)), "rb") as file:
        return np.load(io.BytesIO(file.read()), allow_pickle=False)


class ShardReader:
    """Batches of a prepared split by batch index: a pure function of (seed, index).

    Args:
        data_dir: the prepared folder (a local path, or any path `open_file` opens).
        split: "train" (seeded order, repeated over epochs) or "eval" (stored order, once).
        open_file: `open` (numpy only) or `tf.io.gfile.GFile` (gs://...).
        seed: the run's seed (the training order).
    """

    def __init__(self, data_dir, split, open_file=open, seed=0, manifest=None):
        self.data_dir, self.split, self.open_file, self.seed = str(data_dir), split, open_file, seed
        self.manifest = manifest or read_manifest(data_dir, open_file)
        self.fields = self.manifest["fields"]
        self.shard_rows = [shard["rows"] for shard in self.manifest["splits"][split]["shards"]]
        self.num_rows = sum(self.shard_rows)
        self._cache = {}

    def num_batches(self, batch_size):
        """Whole batches in one pass (the eval split is read once)."""
        return self.num_rows // batch_size

    def _shard(self, index):
        if index not in self._cache:
            self._cache = {
                **dict(list(self._cache.items())[-1:]),
                index: load_shard(self.data_dir, self.split, index, self.open_file),
            }
        return self._cache[index]

    def batch(self, batch_index, batch_size):
        """dict field -> int32 (batch_size, sequence_length) of batch `batch_index`."""
        start = batch_index * batch_size
        if self.split == "train":
            shards, rows = training_rows(self.seed, start, batch_size, self.shard_rows)
        else:
            if start + batch_size > self.num_rows:
                raise IndexError(f"Batch {batch_index} is past the end of the {self.split} split.")
            ends = np.cumsum(self.shard_rows)
            positions = np.arange(start, start + batch_size)
            shards = np.searchsorted(ends, positions, side="right")
            rows = positions - (ends[shards] - np.asarray(self.shard_rows)[shards])
        stacked = np.empty((batch_size, len(self.fields), self.manifest["sequence_length"]), np.int32)
        for shard in np.unique(shards):
            where = shards == shard
            stacked[where] = self._shard(int(shard))[rows[where]]
        return {name: stacked[:, position] for position, name in enumerate(self.fields)}

    def batches(self, batch_size, start=0):
        """(batch index, batch) from batch `start` on: the train split forever, eval once."""
        index = start
        while self.split == "train" or index < self.num_batches(batch_size):
            yield index, self.batch(index, batch_size)
            index += 1


def causal_lm_batches(reader, batch_size, start=0):
    """(inputs, labels, weights) of causal_lm rows from batch `start` on: both trainers read these."""
    for _, packed in reader.batches(batch_size, start):
        labels, weights = next_token_targets(packed)
        yield packed, labels, weights
