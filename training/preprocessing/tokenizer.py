"""WordPiece vocabularies trained on a corpus with keras-hub, cached beside the run, and
the training side of the one WordPiece tokenizer (`training.preprocessing.text`)."""

import dataclasses
import hashlib
import importlib.metadata
import os
import warnings

import keras_hub
import tensorflow as tf

from concise_attention.training import files
from concise_attention.training.preprocessing.text import WordPieceModule
from concise_attention.training.preprocessing.text import read_vocabulary

RESERVED_TOKENS = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]


def train_wordpiece(lines, vocabulary_size, path, lowercase=True, strip_accents=None):
    """Trains a WordPiece vocabulary on `lines` and writes it to `path` atomically; returns `path`.

    A vocabulary at `path` whose sidecar fingerprint matches the corpus, size, settings and trainer
    versions is reused, and so is one cached on this machine (`files.user_cache("vocabularies")`,
    sha256 checked): the trainer is deterministic.

    Args:
        lines: list of strings.
        vocabulary_size: target size, reserved tokens included.
        lowercase: lowercase before learning (as BERT-uncased).
        strip_accents: drop accent marks before learning; None follows `lowercase`.
    """
    if (
        isinstance(vocabulary_size, bool)
        or not isinstance(vocabulary_size, int)
        or vocabulary_size <= len(RESERVED_TOKENS)
    ):
        raise ValueError(
            f"`vocabulary_size` must be an integer > {len(RESERVED_TOKENS)}. Received: vocabulary_size={vocabulary_size!r}"
        )
    strip_accents = lowercase if strip_accents is None else strip_accents
    trainer = f"keras-hub {keras_hub.__version__}|tensorflow-text {importlib.metadata.version('tensorflow-text')}|{' '.join(RESERVED_TOKENS)}"
    settings = f"{vocabulary_size}|{lowercase}|{strip_accents}|{trainer}|"
    fingerprint = hashlib.sha256(settings.encode() + "\n".join(lines).encode()).hexdigest()
    stamp = f"{path}.sha256"  # path may be gs://: everything goes through tf.io.gfile
    if tf.io.gfile.exists(str(path)) and tf.io.gfile.exists(stamp):
        with tf.io.gfile.GFile(stamp) as file:
            if file.read() == fingerprint:
                return path
    cached = os.path.join(files.user_cache("vocabularies"), fingerprint)
    text = _cached_vocabulary(cached)
    if text is None:
        # A Python list would be read as file names: hand the lines over as a dataset.
        vocabulary = keras_hub.tokenizers.compute_word_piece_vocabulary(
            tf.data.Dataset.from_tensor_slices(list(lines)).batch(1024),
            vocabulary_size,
            lowercase=lowercase,
            strip_accents=strip_accents,
            reserved_tokens=RESERVED_TOKENS,
        )
        text = "\n".join(vocabulary) + "\n"
        _cache_vocabulary(cached, text)
    files.write_bytes_atomically(path, text)
    files.write_bytes_atomically(stamp, fingerprint)
    return path


def _cached_vocabulary(base):
    """The vocabulary text trained before on this machine (`base`.txt, its fingerprint's name), or None (absent,
    unreadable, or not the text whose sha256 was recorded with it: trained again)."""
    try:
        data = files.read_verified(base, ".txt")
    except (ValueError, OSError, tf.errors.OpError):
        return None
    return None if data is None else data.decode("utf-8")


def _cache_vocabulary(base, text):
    """Keeps `text` as `base`.txt for the next run of its fingerprint; a cache that cannot be written is only a miss."""
    try:
        files.write_verified(base, ".txt", text)
    except (OSError, tf.errors.OpError) as error:
        warnings.warn(f"The vocabulary cache {base}.txt could not be written ({error}): the next run trains it again.")


class WordPieceTokenizer:
    """The training side of `training.preprocessing.text.WordPieceModule`: the same graph, called on a
    batch of lines, with keras-hub's tokenizer interface (what the pipelines use).

    Example:
    >>> tokenizer = wordpiece_tokenizer("vocab.txt")
    >>> tokenizer(tf.constant(["Hello world!"]))   # int32 ragged [batch, (pieces)]
    """

    def __init__(self, module):
        self.module = module
        self._tokens = read_vocabulary(module.vocab_file.asset_path.numpy().decode("utf-8"))
        self._ids = {token: token_id for token_id, token in enumerate(self._tokens)}

    def __call__(self, text, max_length=None):
        """string [B] (or a scalar) -> int32 ragged [B, (pieces)] ([(pieces)] for a scalar). max_length: read at
        most this many words of each text (and BYTES_PER_WORD bytes a word: time and memory bounded whatever its
        size, `training.preprocessing.text`); None: all of it."""
        text = tf.convert_to_tensor(text, tf.string)
        # the module's tokenisation is a traced tf.function
        ids = self.module.token_ids(tf.reshape(text, [-1]), max_length)
        return ids[0] if text.shape.rank == 0 else ids

    def pack(self, texts, sequence_length):
        """BERT inputs of 1 or 2 segments (string [B] each): [CLS] A [SEP] (B [SEP]), truncated round-robin
        and padded to `sequence_length`: the module's `pack`, as the exported preprocessor packs them."""
        return self.module.pack([self(segment) for segment in texts], sequence_length)

    def pack_batch(self, texts, sequence_length):
        """`pack` of a batch cut with drop_remainder, its inputs given their static shape (B, sequence_length)."""
        shape = (texts[0].shape[0], sequence_length)
        return {name: tf.ensure_shape(value, shape) for name, value in self.pack(texts, sequence_length).items()}

    def token_to_id(self, token):
        if token not in self._ids:
            raise ValueError(f"Token not in the vocabulary. Received: token={token!r}")
        return self._ids[token]

    def id_to_token(self, token_id):
        return self._tokens[token_id]

    def vocabulary_size(self):
        return len(self._tokens)

    def get_vocabulary(self):
        return list(self._tokens)


def wordpiece_tokenizer(path, lowercase=True, strip_accents=None):
    """BERT's WordPiece tokenisation of `path` (vocab.txt) for training: the implementation
    the exported preprocessor and serving model run (`training.preprocessing.text.WordPieceModule`),
    without a length bound.

    Args:
        path: vocab.txt, one token per line.
        lowercase: lower-case the text (do_lower_case).
        strip_accents: remove accent marks; None follows `lowercase`.
    """
    return WordPieceTokenizer(
        WordPieceModule(str(path), lowercase=lowercase, strip_accents=strip_accents, max_length=None)
    )


def bert_settings(settings):
    """BERT's reading of the settings: strip_accents None follows lowercase."""
    lowercase = True if settings.get("lowercase") is None else settings["lowercase"]
    strip = lowercase if settings.get("strip_accents") is None else settings["strip_accents"]
    return {"lowercase": lowercase, "strip_accents": strip}


def tokenizer_settings(config):
    """lowercase and strip_accents as they will be saved with the run (BERT-uncased by default)."""
    return bert_settings(dataclasses.asdict(config.tokenizer))
