"""WordPiece vocabularies trained on a corpus with keras-hub, cached beside the run."""

import hashlib
import os
import pathlib

import keras_hub
import tensorflow as tf

RESERVED_TOKENS = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]


def train_wordpiece(lines, vocabulary_size, path, lowercase=True, strip_accents=False):
    """Trains a WordPiece vocabulary on `lines` and writes it to `path` atomically.

    A vocabulary already at `path` whose sidecar fingerprint matches the corpus and
    size is reused instead of trained again.

    Args:
        lines: list of strings.
        vocabulary_size: target size (reserved tokens included).
        path: the vocab.txt to write.
        lowercase: lowercase before learning (uncased, as BERT-uncased).
        strip_accents: remove accent marks (NFD, then drop \p{Mn}) before learning.

    Returns:
        The path of the vocabulary file.
    """
    if isinstance(vocabulary_size, bool) or not isinstance(vocabulary_size, int) or vocabulary_size <= len(RESERVED_TOKENS):
        raise ValueError(f"`vocabulary_size` must be an integer > {len(RESERVED_TOKENS)}. Received: vocabulary_size={vocabulary_size!r}")
    path = pathlib.Path(path)
    fingerprint = hashlib.sha256(f"{vocabulary_size}|{lowercase}|{strip_accents}|".encode() + "\n".join(lines).encode()).hexdigest()
    stamp = path.with_name(path.name + ".sha256")
    if path.is_file() and stamp.is_file() and stamp.read_text() == fingerprint:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    # A Python list would be read as file names: hand the lines over as a dataset.
    vocabulary = keras_hub.tokenizers.compute_word_piece_vocabulary(
        tf.data.Dataset.from_tensor_slices(list(lines)).batch(1024), vocabulary_size, lowercase=lowercase, strip_accents=strip_accents, reserved_tokens=RESERVED_TOKENS
    )
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text("\n".join(vocabulary) + "\n", encoding="utf-8")
    temporary.replace(path)
    stamp.write_text(fingerprint)
    return path


def wordpiece_tokenizer(path, lowercase=True, strip_accents=False):
    """keras-hub's WordPiece tokenizer on a vocab.txt file (the reference the exported
    serving tokenizer is tested against)."""
    return keras_hub.tokenizers.WordPieceTokenizer(
        vocabulary=str(path), lowercase=lowercase, strip_accents=strip_accents, oov_token="[UNK]"
    )
