"""BERT text preprocessing in core TensorFlow ops only, for exported models.

Stock TF Serving builds lack (or mismatch the version of) tensorflow-text's custom ops
(tensorflow/serving#2267, #4057), so the graph of an exported model must not contain
them. `WordPieceModule` reproduces keras-hub's `WordPieceTokenizer` (which is built on
tensorflow-text) with core ops:

1. CJK ideographs are spaced out; with `strip_accents`, every character is replaced by
   its NFD decomposition without nonspacing marks (\\p{Mn});
2. the text is split on keras-hub's whitespace/control pattern and its punctuation and
   CJK characters are kept as words (the same RE2 patterns, run by
   `tf.strings.regex_replace`);
3. with `lowercase`, every character of a word is case-folded (ICU NFKC_Casefold, as
   tensorflow-text's `case_fold_utf8`);
4. each word is cut greedily into the longest vocabulary pieces ("##" marks a
   continuation); a word that cannot be cut, or is longer than `max_bytes_per_word`,
   becomes [UNK].

Steps 1 and 3 are character tables computed at export time by running
tensorflow-text's own normalisers over every Unicode code point (the exporting machine
has tensorflow-text; the served graph does not). They are exact per character; the one
known difference is that NFKC composes across characters (a base letter followed by a
combining mark) where the tables act on one character at a time. The tokenisation is
checked against keras-hub's tokenizer on real text in the tests.

The vocabulary is a `tf.saved_model.Asset`, so a SavedModel carries it in assets/ and
no path of the exporting machine is written into the graph.
"""

import functools

import numpy as np
import tensorflow as tf

# keras-hub's pre-tokenisation patterns (keras_hub/src/tokenizers/word_piece_tokenizer.py).
WHITESPACE_REGEX = r"\s|\p{Cc}|\p{Cf}"
PUNCTUATION_REGEX = r"[!-/]|[:-@]|[\[-`]|[{-~]|[\p{P}]"
CJK_REGEX = (
    r"[\x{4E00}-\x{9FFF}]|[\x{3400}-\x{4DBF}]|[\x{20000}-\x{2A6DF}]|[\x{2A700}-\x{2B73F}]"
    r"|[\x{2B740}-\x{2B81F}]|[\x{2B820}-\x{2CEAF}]|[\x{F900}-\x{FAFF}]|[\x{2F800}-\x{2FA1F}]"
)
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# A table value no real mapping can take: "keep the character".
_KEEP = "\uffff\uffff"


@functools.lru_cache(maxsize=None)
def character_table(kind, recompose=False):
    """(code points, replacements) of every character that `kind` changes.

    kind: "casefold" (tensorflow-text `case_fold_utf8`: NFKC_Casefold) or
    "strip_accents" (NFD, then \\p{Mn} removed, as keras-hub).
    recompose: for "strip_accents" followed by a case fold, whose NFKC composes again
        what NFD split without removing anything (Hangul syllables): such characters
        are left as they are.
    """
    import tensorflow_text as tf_text  # export time only: never in the exported graph

    codes = np.array([c for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF], np.int32)
    characters = tf.strings.unicode_encode(tf.RaggedTensor.from_tensor(codes[:, None]), "UTF-8")
    if kind == "casefold":
        mapped = tf_text.case_fold_utf8(characters)
    elif kind == "strip_accents":
        mapped = tf.strings.regex_replace(tf_text.normalize_utf8(characters, "NFD"), r"\p{Mn}", "")
        if recompose:
            unchanged = tf_text.normalize_utf8(mapped, "NFKC") == tf_text.normalize_utf8(characters, "NFKC")
            mapped = tf.where(unchanged, characters, mapped)
    else:
        raise ValueError(f"`kind` must be 'casefold' or 'strip_accents'. Received: kind={kind!r}")
    changed = np.nonzero(mapped.numpy() != characters.numpy())[0]
    return codes[changed], mapped.numpy()[changed]


def read_vocabulary(path):
    """The tokens of a vocab.txt (one per line), checked for the special tokens BERT needs."""
    with open(path, encoding="utf-8") as file:
        tokens = [line.rstrip("\n") for line in file]
    missing = [token for token in SPECIAL_TOKENS if token not in tokens]
    if missing:
        raise ValueError(f"The vocabulary {path} lacks the special token(s) {', '.join(missing)}.")
    return tokens


class WordPieceModule(tf.Module):
    """keras-hub-compatible WordPiece tokenisation and BERT packing in core TF ops.

    Args:
        vocabulary_path: vocab.txt (one token per line, id = line number).
        lowercase: case-fold (uncased BERT).
        strip_accents: remove accent marks.
        max_bytes_per_word: longer words become [UNK] (keras-hub/tensorflow-text: 100).

    Example:
    >>> module = WordPieceModule("vocab.txt")
    >>> module.tokenize(tf.constant(["Hello world!"]))        # ragged [batch, words, pieces]
    >>> module.pack([module.tokenize(texts)], seq_length=128)  # BERT encoder inputs
    """

    def __init__(self, vocabulary_path, lowercase=True, strip_accents=False, max_bytes_per_word=100):
        super().__init__()
        tokens = read_vocabulary(vocabulary_path)
        self.vocab_file = tf.saved_model.Asset(str(vocabulary_path))
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        self.max_bytes_per_word = max_bytes_per_word
        self.special_ids = {token: tokens.index(token) for token in SPECIAL_TOKENS}
        # Longest piece in characters: candidate lengths tried at each position.
        self.max_piece_chars = max(len(token[2:] if token.startswith("##") else token) for token in tokens)
        self.vocab_table = tf.lookup.StaticHashTable(
            tf.lookup.TextFileInitializer(
                self.vocab_file, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER
            ),
            default_value=-1,
        )
        self.casefold_table = self._table("casefold") if lowercase else None
        self.strip_table = self._table("strip_accents", recompose=lowercase) if strip_accents else None

    @staticmethod
    def _table(kind, recompose=False):
        codes, replacements = character_table(kind, recompose)
        return tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(tf.constant(codes, tf.int32), tf.constant(replacements, tf.string)), default_value=_KEEP
        )

    @staticmethod
    def _map_characters(strings, table):
        """Replaces every character of `strings` (any shape) by its table entry, if any."""
        characters = tf.strings.unicode_split(strings, "UTF-8", errors="replace")
        codes = tf.strings.unicode_decode(strings, "UTF-8", errors="replace")
        mapped = table.lookup(codes.flat_values)
        flat = tf.where(tf.equal(mapped, _KEEP), characters.flat_values, mapped)
        return tf.strings.reduce_join(characters.with_flat_values(flat), axis=-1)

    def split_words(self, text_B):
        """Pre-tokenisation: string [B] -> ragged words [B, (words)]."""
        text_B = tf.strings.regex_replace(text_B, CJK_REGEX, r" \0 ")
        if self.strip_table is not None:
            text_B = self._map_characters(text_B, self.strip_table)
        text_B = tf.strings.regex_replace(text_B, f"{PUNCTUATION_REGEX}|{CJK_REGEX}", r" \0 ")
        text_B = tf.strings.regex_replace(text_B, WHITESPACE_REGEX, " ")
        words = tf.strings.split(text_B, sep=" ")
        words = tf.ragged.boolean_mask(words, tf.strings.length(words) > 0)
        if self.casefold_table is not None:
            words = words.with_flat_values(self._map_characters(words.flat_values, self.casefold_table))
        return words

    def _word_pieces(self, words_W):
        """Greedy longest-match-first WordPiece of each word: [W] -> ragged [W, (pieces)].

        All words advance together, one piece per iteration; at each step every
        candidate length up to the longest vocabulary piece is looked up at once.
        """
        unknown = tf.constant(self.special_ids["[UNK]"], tf.int64)
        characters = tf.strings.unicode_split(words_W, "UTF-8", errors="replace")
        # Words longer than max_bytes_per_word are [UNK]; their characters beyond it are not needed.
        characters_WxL = characters[:, : self.max_bytes_per_word + 1].to_tensor(default_value="")
        length_W = tf.cast(characters.row_lengths(), tf.int32)
        too_long_W = tf.strings.length(words_W) > self.max_bytes_per_word
        width = tf.shape(characters_WxL)[1]
        candidates = self.max_piece_chars

        def step(start_W, done_W, failed_W, pieces_WxI):
            piece_W = tf.fill(tf.shape(start_W), "")
            ids, hits = [], []
            for size in range(1, candidates + 1):
                index_W = tf.minimum(start_W + size - 1, tf.maximum(width - 1, 0))
                piece_W = tf.strings.join([piece_W, tf.gather(characters_WxL, index_W, batch_dims=1)])
                key_W = tf.where(start_W > 0, tf.strings.join(["##", piece_W]), piece_W)
                id_W = self.vocab_table.lookup(key_W)
                ids.append(id_W)
                hits.append((id_W >= 0) & (start_W + size <= length_W))
            ids_WxK, hits_WxK = tf.stack(ids, axis=1), tf.stack(hits, axis=1)
            sizes_K = tf.range(1, candidates + 1, dtype=tf.int32)
            best_W = tf.reduce_max(tf.where(hits_WxK, sizes_K[None, :], 0), axis=1)
            matched_W = best_W > 0
            chosen_W = tf.gather(ids_WxK, tf.maximum(best_W - 1, 0), batch_dims=1)
            active_W = ~done_W
            failed_W = failed_W | (active_W & ~matched_W)
            piece_id_W = tf.where(active_W & matched_W, chosen_W, -1)
            start_W = tf.where(active_W, start_W + best_W, start_W)
            done_W = done_W | failed_W | (start_W >= length_W)
            return start_W, done_W, failed_W, tf.concat([pieces_WxI, piece_id_W[:, None]], axis=1)

        count = tf.shape(words_W)[0]
        initial = (
            tf.zeros([count], tf.int32),
            too_long_W | (length_W == 0),
            too_long_W,
            tf.zeros([count, 0], tf.int64),
        )
        _, _, failed_W, pieces_WxI = tf.while_loop(
            lambda start, done, failed, pieces: tf.reduce_any(~done),
            step,
            initial,
            shape_invariants=(tf.TensorShape([None]), tf.TensorShape([None]), tf.TensorShape([None]), tf.TensorShape([None, None])),
        )
        # A word that cannot be cut completely is one [UNK] (as WordPiece in BERT). One
        # padding column makes room for it when no iteration ran.
        pieces_WxI = tf.pad(pieces_WxI, [[0, 0], [0, 1]], constant_values=-1)
        unknown_row_I = tf.where(tf.range(tf.shape(pieces_WxI)[1]) == 0, unknown, tf.constant(-1, tf.int64))
        pieces_WxI = tf.where(failed_W[:, None], unknown_row_I[None, :], pieces_WxI)
        return tf.RaggedTensor.from_tensor(pieces_WxI, padding=tf.constant(-1, tf.int64))

    def tokenize(self, text_B):
        """string [B] -> int32 ragged [B, (words), (pieces)] (the TF-Hub `.tokenize`)."""
        words = self.split_words(tf.reshape(text_B, [-1]))
        pieces = self._word_pieces(words.flat_values)
        return tf.cast(words.with_flat_values(pieces), tf.int32)

    def pack(self, segments, seq_length):
        """BERT inputs from 1 or 2 tokenised segments (ragged [B, (words), (pieces)] or
        [B, (pieces)]): [CLS] A [SEP] (B [SEP]), truncated round-robin, padded to seq_length.

        Returns the dict of int32 [B, seq_length] `input_word_ids`, `input_mask`,
        `input_type_ids` (the TF-Hub `.bert_pack_inputs`).
        """
        if not 1 <= len(segments) <= 2:
            raise ValueError(f"BERT packs 1 or 2 segments. Received: {len(segments)} segments")
        segments = [segment.merge_dims(1, -1) if segment.ragged_rank > 1 else segment for segment in segments]
        seq_length = tf.cast(seq_length, tf.int32)
        budget = seq_length - 1 - len(segments)
        lengths = [tf.cast(segment.row_lengths(), tf.int32) for segment in segments]
        if len(segments) == 1:
            kept = [tf.minimum(lengths[0], budget)]
        else:
            # Round robin: one token to each segment in turn until the budget is spent.
            first = tf.minimum(lengths[0], tf.maximum((budget + 1) // 2, budget - lengths[1]))
            kept = [first, tf.minimum(lengths[1], budget - first)]
        rows = tf.shape(lengths[0])[0]
        cls = tf.fill([rows, 1], self.special_ids["[CLS]"])
        sep = tf.fill([rows, 1], self.special_ids["[SEP]"])
        parts, types = [tf.RaggedTensor.from_tensor(cls)], [tf.RaggedTensor.from_tensor(tf.zeros([rows, 1], tf.int32))]
        for index, (segment, keep) in enumerate(zip(segments, kept)):
            trimmed = tf.RaggedTensor.from_row_lengths(
                tf.gather(segment.flat_values, _kept_indices(segment.row_splits, keep)), tf.cast(keep, segment.row_splits.dtype)
            )
            trimmed = tf.concat([tf.cast(trimmed, tf.int32), tf.RaggedTensor.from_tensor(sep)], axis=1)
            parts.append(trimmed)
            types.append(tf.ones_like(trimmed) * index)
        word_ids = tf.concat(parts, axis=1)
        type_ids = tf.concat(types, axis=1)
        shape = tf.stack([rows, seq_length])
        return {
            "input_word_ids": tf.reshape(word_ids.to_tensor(self.special_ids["[PAD]"], shape=shape), shape),
            "input_mask": tf.sequence_mask(word_ids.row_lengths(), seq_length, dtype=tf.int32),
            "input_type_ids": tf.reshape(type_ids.to_tensor(0, shape=shape), shape),
        }


def _kept_indices(row_splits, keep):
    """Flat indices of the first `keep[i]` values of each row of a ragged tensor."""
    keep = tf.cast(keep, row_splits.dtype)
    offsets = tf.ragged.range(tf.zeros_like(keep), keep)
    return (offsets + row_splits[:-1][:, None]).flat_values
