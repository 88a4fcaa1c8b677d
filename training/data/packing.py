"""Text sources and tensor2tensor-style packing of token ids into fixed-length LM rows."""

import pathlib

import numpy as np

SAMPLE_CORPUS = pathlib.Path(__file__).parent / "python_reference.txt"


def read_lines(path=SAMPLE_CORPUS):
    """Non-empty lines of a UTF-8 text file (the shipped sample corpus by default)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ValueError(f"Corpus file not found. Received: path={str(path)!r}")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"Corpus file is empty. Received: path={str(path)!r}")
    return lines


def pack_sentences(sentences, sequence_length):
    """Greedily packs token-id sentences into rows of exactly `sequence_length`.

    Every sentence keeps its own segment id (1, 2, ... within a row; 0 is padding) and
    positions restarting at 0, so a model masking on segments never attends across
    sentences. Sentences longer than a row are cut into row-sized pieces.

    Args:
        sentences: iterable of lists of int token ids.
        sequence_length: row length.

    Returns:
        dict of int32 arrays (rows, sequence_length): token_ids, segment_ids, positions.
    """
    if isinstance(sequence_length, bool) or not isinstance(sequence_length, int) or sequence_length < 2:
        raise ValueError(f"`sequence_length` must be an integer >= 2. Received: sequence_length={sequence_length!r}")
    rows, current = [], []
    for sentence in sentences:
        for start in range(0, len(sentence), sequence_length):
            piece = list(sentence[start : start + sequence_length])
            if sum(len(p) for p in current) + len(piece) > sequence_length:
                rows.append(current)
                current = []
            current.append(piece)
    if current:
        rows.append(current)
    packed = {
        name: np.zeros((len(rows), sequence_length), "int32") for name in ("token_ids", "segment_ids", "positions")
    }
    for row_index, pieces in enumerate(rows):
        offset = 0
        for segment, piece in enumerate(pieces, start=1):
            end = offset + len(piece)
            packed["token_ids"][row_index, offset:end] = piece
            packed["segment_ids"][row_index, offset:end] = segment
            packed["positions"][row_index, offset:end] = np.arange(len(piece))
            offset = end
    return packed


def next_token_targets(packed):
    """Labels and weights for next-token prediction on packed rows.

    Position t predicts token t+1 of the same sentence; the last token of each sentence,
    padding, and the row's last position get weight 0.

    Returns:
        (labels, weights): int32 and float32 arrays shaped like `packed["token_ids"]`.
    """
    tokens, segments = packed["token_ids"], packed["segment_ids"]
    labels = np.zeros_like(tokens)
    labels[:, :-1] = tokens[:, 1:]
    weights = np.zeros(tokens.shape, "float32")
    weights[:, :-1] = (segments[:, :-1] == segments[:, 1:]) & (segments[:, :-1] != 0)
    return labels, weights
