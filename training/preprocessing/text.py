"""BERT's WordPiece tokenisation in core TensorFlow ops: the one tokenizer of training,
the TF-Hub preprocessor and the TF Serving model.

The semantics are those of the original BERT tokenizer (google-research/bert
tokenization.py: `BasicTokenizer` then `WordpieceTokenizer`) as Hugging Face's
`BertWordPieceTokenizer` runs it, so that an imported checkpoint (all-MiniLM-L6-v2) is
served the ids it was trained on:

1. clean: U+0000, U+FFFD and control/format/private-use characters (Cc, Cf, Co; not
   tab, newline, carriage return) are dropped, every other whitespace character
   (tab, newline, CR and the Unicode space separators Zs, Zl, Zp: no-break, em,
   ideographic spaces...) becomes " ";
2. CJK ideographs become words of their own;
3. with `strip_accents` (None: follow `lowercase`, as Hugging Face) each character is
   replaced by its NFD decomposition without nonspacing marks (Mn); with `lowercase`
   each character is lower-cased as Python's `str.lower` does it for one character
   (not NFKC case folding: "ﬁ", "²", "ß", "½" stay what they are);
4. the text is split on spaces and around punctuation (ASCII 33-47, 58-64, 91-96,
   123-126 and Unicode P*);
5. a word longer than 100 characters is [UNK]; any other is cut greedily into the
   longest vocabulary pieces ("##" marks a continuation), or is [UNK] as a whole if it
   cannot be cut.

Steps 1-4 act on each character alone, so they are one table computed at export time
in Python (unicodedata) over every code point: ranges of code points that are kept,
dropped, turned into a space or isolated as a word, and the replacement of each
character the settings change. In the graph a character's range is found with
`tf.searchsorted` and the text is rebuilt from the replacements, in int32 code points.
WordPiece walks a trie of the vocabulary (a `tf.lookup.StaticHashTable` from
(node, code point) to node) from every character of every word at once, which gives the
longest piece starting at each character; the greedy chain of pieces from a word's
start is then found by pointer doubling (7 gathers for 100 characters), not by a loop
over pieces. No tensorflow-text op and no `py_function`: stock TF Serving runs it.

Known differences from Hugging Face's tokenizers (Rust), all on rare characters: its
character categories are those of an older Unicode than Python's, so a few format
characters, marks and punctuation assigned since (e.g. U+0890, U+13430) are treated by
category here and not there; it maps a special token typed in the text ("[SEP]") to
its id where BERT and this tokenizer cut it like any text; NFD's reordering of
combining marks is not done (only the order of marks kept after stripping could
differ). Python's `str.lower` of a whole word would write a final sigma "ς"; BERT as
Hugging Face runs it lower-cases each character, and so does this tokenizer ("σ").

Bounded cost. Tokenising with `max_length` (the `tokenize` default is
`DEFAULT_MAX_LENGTH`; `encode` uses the sequence length) processes at most:
- the first `max_length * BYTES_PER_WORD` bytes of each input (a cut character and any
  invalid UTF-8 becomes U+FFFD, which cleaning drops);
- the first `max_length` words of the normalised text (each word gives at least one
  token, so later words can never reach the output);
- WordPiece over words of at most 100 characters (longer ones are [UNK] unseen).
So time and memory per input are at most a constant times `max_length`, whatever its
size. The ids are exact whenever the first `max_length` words lie in the first
`max_length * BYTES_PER_WORD` bytes (64 bytes a word on average: ordinary text uses 5
to 20). `max_length=None` (training) tokenises everything.

The vocabulary is a `tf.saved_model.Asset`, so a SavedModel carries it in assets/ and no
path of the exporting machine is written into the graph.
"""

import functools
import unicodedata

import numpy as np
import tensorflow as tf

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MAX_CHARS_PER_WORD = 100
DEFAULT_MAX_LENGTH = 512
BYTES_PER_WORD = 64
CONTINUATION = "##"
# BERT's CJK ideograph blocks (tokenization.py `_is_chinese_char`).
CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)
_SPACE = ord(" ")
# In a replacement: "the character itself" (lets a whole range share one replacement).
_SELF = -1
# Trie keys: node * 2**21 + code point (code points are < 2**21).
_CODE_BITS = 21
_INITIAL_ROOT, _CONTINUATION_ROOT = 0, 1


def is_cjk(code):
    if code < 0x3400 or 0x9FFF < code < 0xF900 or 0xFAFF < code < 0x20000 or code > 0x2FA1F:
        return False  # fast path: most code points
    return any(low <= code <= high for low, high in CJK_RANGES)


def is_punctuation(character):
    """BERT's `_is_punctuation`: all non-letter/number ASCII symbols, and Unicode P*."""
    code = ord(character)
    return (
        33 <= code <= 47
        or 58 <= code <= 64
        or 91 <= code <= 96
        or 123 <= code <= 126
        or unicodedata.category(character).startswith("P")
    )


def is_whitespace(character):
    return character in "\t\n\r" or unicodedata.category(character) in ("Zs", "Zl", "Zp")


def is_removed(character):
    """Dropped by cleaning: NUL, U+FFFD and control, format and private-use characters."""
    if character in "\t\n\r":
        return False
    return character in "\x00\ufffd" or unicodedata.category(character) in ("Cc", "Cf", "Co")


def normalise_character(character, lowercase, strip_accents):
    """What BERT's basic tokenisation puts in place of one character: "" (dropped), " ",
    the character or its lower-cased/unaccented form, with spaces around CJK ideographs
    and punctuation (so that splitting the result on spaces gives the words)."""
    if is_removed(character):
        return ""
    if is_whitespace(character):
        return " "
    text = f" {character} " if is_cjk(ord(character)) else character
    if strip_accents:
        text = "".join(part for part in unicodedata.normalize("NFD", text) if unicodedata.category(part) != "Mn")
    if lowercase:
        text = "".join(part.lower() for part in text)
    return "".join(f" {part} " if is_punctuation(part) else " " if is_whitespace(part) else part for part in text)


def _resolve_strip_accents(lowercase, strip_accents):
    """Hugging Face's convention: strip_accents=None follows lowercase."""
    if strip_accents not in (None, True, False) or lowercase not in (True, False):
        raise ValueError(
            "`lowercase` must be a bool and `strip_accents` None or a bool. "
            f"Received: lowercase={lowercase!r}, strip_accents={strip_accents!r}"
        )
    return lowercase if strip_accents is None else strip_accents


@functools.lru_cache(maxsize=None)
def character_table(lowercase, strip_accents):
    """The normalisation of every code point as ranges sharing one replacement.

    Returns int32 arrays: `starts` [R] (first code point of each range, ascending, from
    0), `offsets` [R + 1] (range r's replacement is `values[offsets[r]:offsets[r + 1]]`)
    and `values` (code points; -1 = the character itself).
    """
    strip_accents = _resolve_strip_accents(lowercase, strip_accents)
    starts, replacements = [], []
    for code, replacement in _replacements(lowercase, strip_accents):
        if not replacements or replacement != replacements[-1]:
            starts.append(code)
            replacements.append(replacement)
    offsets = np.cumsum([0] + [len(replacement) for replacement in replacements])
    values = [value for replacement in replacements for value in replacement]
    return np.array(starts, np.int32), offsets.astype(np.int32), np.array(values, np.int32)


def _replacements(lowercase, strip_accents):
    """(code point, replacement) in ascending order, where a code point without an entry
    has the replacement of the one before it. Unassigned (Cn; Cs: surrogates, never
    decoded from UTF-8) and private-use (Co) code points are ~90% of Unicode and need no
    computing: only the first of each run is listed."""
    bulk = {"Cn": (_SELF,), "Cs": (_SELF,), "Co": ()}
    kinds = list(map(unicodedata.category, map(chr, range(0x110000))))
    bulk_kind = np.fromiter(
        (list(bulk).index(kind) + 1 if kind in bulk else 0 for kind in kinds), np.int8, count=len(kinds)
    )
    cjk = np.zeros(0x110000, bool)
    for low, high in CJK_RANGES:
        cjk[low : high + 1] = True
    in_bulk = (bulk_kind > 0) & ~cjk
    run_start = in_bulk & np.concatenate([[True], ~in_bulk[:-1] | (bulk_kind[1:] != bulk_kind[:-1])])
    for code in np.nonzero(~in_bulk | run_start)[0].tolist():
        character = chr(code)
        if in_bulk[code]:
            yield code, bulk[kinds[code]]
        elif cjk[code] and not unicodedata.decomposition(character):  # ideographs: no case, no accents
            yield code, (_SPACE, _SELF, _SPACE)
        else:
            text = normalise_character(character, lowercase, strip_accents)
            yield code, tuple(_SELF if part == character else ord(part) for part in text)


def vocabulary_trie(tokens):
    """A trie of the vocabulary: pieces that start a word from node 0, continuation
    pieces ("##" removed) from node 1.

    Returns `keys` int64 (parent node * 2**21 + code point), `children` int32 (the node
    each key leads to) and `token_ids` int32 [nodes] (the id of the piece ending at each
    node, -1 if none).
    """
    children, token_ids = {}, [-1, -1]
    for token_id, token in enumerate(tokens):
        continuation = token.startswith(CONTINUATION)
        piece = token[len(CONTINUATION) :] if continuation else token
        if not piece:
            continue
        node = _CONTINUATION_ROOT if continuation else _INITIAL_ROOT
        for character in piece:
            key = (node << _CODE_BITS) + ord(character)
            if key not in children:
                children[key] = len(token_ids)
                token_ids.append(-1)
            node = children[key]
        token_ids[node] = token_id
    return (
        np.array(list(children), np.int64),
        np.array(list(children.values()), np.int32),
        np.array(token_ids, np.int32),
    )


def _starts(sorted_ids, segments):
    """[segments + 1]: where each id of 0..segments-1 starts in `sorted_ids` (ascending), then its size: the row
    splits of those row ids, by one binary search: a served request of one text runs a few hundred ops, each costing
    dispatch time, where RaggedTensor's row-id conversions and `tf.repeat` take 10-25 ops each."""
    wanted = tf.range(tf.cast(segments, sorted_ids.dtype) + 1)
    return tf.raw_ops.LowerBound(sorted_inputs=sorted_ids[None], values=wanted[None], out_type=sorted_ids.dtype)[0]


def _owners(counts, out_type=tf.int32):
    """[sum(counts)]: the index of the count each position falls in, i.e. `tf.repeat(tf.range(len(counts)), counts)`
    for counts >= 0, in a few ops (`_starts`)."""
    ends = tf.cumsum(counts)
    positions = tf.range(tf.reduce_sum(counts))
    return tf.raw_ops.UpperBound(sorted_inputs=ends[None], values=positions[None], out_type=out_type)[0]


def read_vocabulary(path):
    """The tokens of a vocab.txt (one per line, any tf.io.gfile path), checked for the special
    tokens BERT needs and for repeated tokens."""
    if not tf.io.gfile.exists(str(path)):
        raise ValueError(f"Vocabulary file not found: {path}")
    with tf.io.gfile.GFile(str(path), "r") as file:
        tokens = [line.rstrip("\n") for line in file]
    missing = [token for token in SPECIAL_TOKENS if token not in tokens]
    if missing:
        raise ValueError(f"The vocabulary {path} lacks the special token(s) {', '.join(missing)}.")
    seen = set()
    for token in tokens:
        if token in seen:
            raise ValueError(
                f"The vocabulary {path} lists a token twice (its id would be ambiguous). Received: token={token!r}"
            )
        seen.add(token)
    return tokens


class WordPieceModule(tf.Module):
    """BERT's tokenisation (WordPiece) and packing in core TF ops.

    Args:
        vocabulary_path: vocab.txt (one token per line, id = line number).
        lowercase: lower-case the text (uncased BERT: do_lower_case).
        strip_accents: remove accent marks; None follows `lowercase` (Hugging Face).
        max_length: the default bound of `tokenize` (words, and BYTES_PER_WORD bytes a
            word, processed per input); None tokenises everything.

    Example:
    >>> module = WordPieceModule("vocab.txt")
    >>> module.tokenize(tf.constant(["Hello world!"]))        # ragged [batch, words, pieces]
    >>> module.encode(tf.constant(["Hello world!"]), 128)     # BERT encoder inputs, bounded cost
    """

    def __init__(self, vocabulary_path, lowercase=True, strip_accents=None, max_length=DEFAULT_MAX_LENGTH):
        super().__init__()
        _check_max_length(max_length)
        tokens = read_vocabulary(vocabulary_path)
        self.vocab_file = tf.saved_model.Asset(str(vocabulary_path))
        self.lowercase = lowercase
        self.strip_accents = _resolve_strip_accents(lowercase, strip_accents)
        self.max_length = max_length
        self.vocabulary_size = len(tokens)
        self.special_ids = {token: tokens.index(token) for token in SPECIAL_TOKENS}
        self.vocab_table = tf.lookup.StaticHashTable(
            tf.lookup.TextFileInitializer(
                self.vocab_file,
                tf.string,
                tf.lookup.TextFileIndex.WHOLE_LINE,
                tf.int64,
                tf.lookup.TextFileIndex.LINE_NUMBER,
            ),
            default_value=-1,
        )
        starts, offsets, values = character_table(lowercase, self.strip_accents)
        self.range_starts = tf.constant(starts)
        self.replacement_offsets = tf.constant(offsets)
        self.replacement_values = tf.constant(values)
        keys, children, node_token_ids = vocabulary_trie(tokens)
        self.trie = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(tf.constant(keys), tf.constant(children)), default_value=-1
        )
        self.trie_token_ids = tf.constant(node_token_ids)
        self.trie_depth = max(len(token) for token in tokens)
        # `tokenize`'s traced functions, by length bound: untracked (a SavedModel keeps the graphs that call them).
        self._setattr_tracking = False
        self._tokenizers = {}
        self._setattr_tracking = True

    def normalise(self, text_B, max_length):
        """Steps 1-4 on string [B]: (codes [N] int32, word [N] int64, words per row [B] int64),
        the code points of the first `max_length` words of each row, word after word."""
        if max_length is not None:
            text_B = tf.strings.substr(text_B, 0, max_length * BYTES_PER_WORD)
        decoded = tf.strings.unicode_decode(text_B, "UTF-8", errors="replace", replacement_char=0xFFFD)
        code_C, row_C = decoded.flat_values, _owners(decoded.row_lengths(), tf.int64)
        range_C = tf.searchsorted(self.range_starts, code_C, side="right") - 1
        start_C = tf.gather(self.replacement_offsets, range_C)
        length_C = tf.gather(self.replacement_offsets, range_C + 1) - start_C
        # Each character becomes its replacement: N codes, each knowing its source character.
        source_N = _owners(length_C)
        index_N = tf.gather(start_C - tf.cumsum(length_C, exclusive=True), source_N) + tf.range(tf.size(source_N))
        value_N = tf.gather(self.replacement_values, index_N)
        code_N = tf.where(value_N == _SELF, tf.gather(code_C, source_N), value_N)
        row_N = tf.gather(row_C, source_N)
        # Words: runs of non-space codes within a row.
        letter_N = code_N != _SPACE
        follows_N = tf.concat([[False], letter_N], 0)[:-1] & (tf.concat([[-1], row_N], 0)[:-1] == row_N)
        word_N = tf.cumsum(tf.cast(letter_N & ~follows_N, tf.int64)) - 1
        code_N, word_N, row_N = (tf.boolean_mask(tensor, letter_N) for tensor in (code_N, word_N, row_N))
        rows = tf.shape(text_B, out_type=tf.int64)[0]
        row_W = tf.math.segment_max(row_N, word_N)  # segment ids are sorted: words in order
        if max_length is not None:
            word_splits = _starts(row_W, rows)
            kept_W = tf.range(tf.size(row_W, out_type=tf.int64)) - tf.gather(word_splits, row_W) < max_length
            kept_N = tf.gather(kept_W, word_N)
            code_N, word_N = tf.boolean_mask(code_N, kept_N), tf.boolean_mask(word_N, kept_N)
            row_W = tf.boolean_mask(row_W, kept_W)
            word_N = tf.gather(tf.cumsum(tf.cast(kept_W, tf.int64)) - 1, word_N)  # renumbered
        word_splits = _starts(row_W, rows)
        return code_N, word_N, word_splits[1:] - word_splits[:-1]

    def _longest_pieces(self, code_P, first_P, end_P):
        """For each character p (of words of at most 100 characters, word after word):
        (length in characters, id) of the longest vocabulary piece starting at p and
        ending before `end_P[p]`; a continuation piece unless `first_P[p]`. (0, -1): none.

        All starting points walk the trie together, one character per iteration; a
        walk ends when it leaves the trie or its word, so the loop runs at most
        `trie_depth` times and mostly a few.
        """
        count = tf.size(code_P)
        best_length_P, best_id_P = tf.zeros([count], tf.int32), tf.fill([count], -1)
        index_A = tf.range(count)
        node_A = tf.where(first_P, _INITIAL_ROOT, _CONTINUATION_ROOT)

        def step(depth, index_A, node_A, best_length_P, best_id_P):
            position_A = index_A + depth
            inside_A = position_A < tf.gather(end_P, index_A)
            index_A, node_A, position_A = (
                tf.boolean_mask(tensor, inside_A) for tensor in (index_A, node_A, position_A)
            )
            key_A = tf.bitwise.left_shift(tf.cast(node_A, tf.int64), _CODE_BITS) + tf.cast(
                tf.gather(code_P, position_A), tf.int64
            )
            node_A = self.trie.lookup(key_A)
            alive_A = node_A >= 0
            index_A, node_A = tf.boolean_mask(index_A, alive_A), tf.boolean_mask(node_A, alive_A)
            token_A = tf.gather(self.trie_token_ids, node_A)
            piece_A = token_A >= 0
            hit_A = tf.boolean_mask(index_A, piece_A)[:, None]
            best_length_P = tf.tensor_scatter_nd_update(best_length_P, hit_A, tf.fill([tf.shape(hit_A)[0]], depth + 1))
            best_id_P = tf.tensor_scatter_nd_update(best_id_P, hit_A, tf.boolean_mask(token_A, piece_A))
            return depth + 1, index_A, node_A, best_length_P, best_id_P

        _, _, _, best_length_P, best_id_P = tf.while_loop(
            lambda depth, index_A, *_: (tf.size(index_A) > 0) & (depth < self.trie_depth),
            step,
            (tf.constant(0), index_A, node_A, best_length_P, best_id_P),
            shape_invariants=(tf.TensorShape([]),) + (tf.TensorShape([None]),) * 4,
        )
        return best_length_P, best_id_P

    def word_pieces(self, code_N, word_N, words):
        """Step 5: the codes of `words` words (word [N], sorted) -> int32 ragged [words, (pieces)]."""
        word_splits = _starts(tf.cast(word_N, tf.int32), words)
        length_W = word_splits[1:] - word_splits[:-1]
        too_long_W = length_W > MAX_CHARS_PER_WORD
        processed_N = ~tf.gather(too_long_W, word_N)
        code_P, word_P = tf.boolean_mask(code_N, processed_N), tf.cast(tf.boolean_mask(word_N, processed_N), tf.int32)
        count_W = tf.where(too_long_W, 0, length_W)
        end_W = tf.cumsum(count_W)
        first_P = tf.range(tf.size(code_P)) == tf.gather(end_W - count_W, word_P)
        best_length_P, best_id_P = self._longest_pieces(code_P, first_P, tf.gather(end_W, word_P))
        # Slots: each word's characters then one end slot, so character p of word w is
        # slot p + w and a piece of length n at slot s leads to slot s + n.
        slot_P = tf.range(tf.size(code_P)) + word_P
        end_slot_W = end_W + tf.range(words)
        first_slot_W = end_slot_W - count_W
        slots = tf.size(code_P) + words
        # no piece: stays
        jump_S = tf.tensor_scatter_nd_update(tf.range(slots), slot_P[:, None], slot_P + best_length_P)
        reached_S = tf.scatter_nd(first_slot_W[:, None], tf.ones([words], tf.int32), [slots])
        for _ in range(MAX_CHARS_PER_WORD.bit_length()):  # pointer doubling: chains of up to 2**7 pieces
            reached_S = tf.tensor_scatter_nd_max(reached_S, jump_S[:, None], reached_S)
            jump_S = tf.gather(jump_S, jump_S)
        # A word whose chain stops before its end slot cannot be cut: it is one [UNK].
        unknown_W = too_long_W | (tf.gather(reached_S, end_slot_W) == 0)
        piece_P = (tf.gather(reached_S, slot_P) > 0) & ~tf.gather(unknown_W, word_P)
        id_S = tf.fill([slots], -1)
        id_S = tf.tensor_scatter_nd_update(
            id_S, tf.boolean_mask(slot_P, piece_P)[:, None], tf.boolean_mask(best_id_P, piece_P)
        )
        unknown_slot_U = tf.boolean_mask(first_slot_W, unknown_W)[:, None]
        id_S = tf.tensor_scatter_nd_update(
            id_S, unknown_slot_U, tf.fill([tf.shape(unknown_slot_U)[0]], self.special_ids["[UNK]"])
        )
        word_S = _owners(count_W + 1, tf.int64)
        emitted_S = id_S >= 0
        return tf.RaggedTensor.from_row_splits(
            tf.boolean_mask(id_S, emitted_S), _starts(tf.boolean_mask(word_S, emitted_S), words), validate=False
        )

    def tokenize(self, text_B, max_length=None):
        """string [B] -> int32 ragged [B, (words), (pieces)] (the TF-Hub `.tokenize`).

        max_length: at most this many words of each input (and BYTES_PER_WORD bytes a
            word) are tokenised; None: the module's `max_length` (a module made with
            max_length=None tokenises everything).
        """
        _check_max_length(max_length)
        max_length = self.max_length if max_length is None else max_length
        if max_length not in self._tokenizers:  # one tf.function per bound, traced once, called by every graph
            self._tokenizers[max_length] = tf.function(
                lambda text: self._tokenize(text, max_length),
                input_signature=[tf.TensorSpec([None], tf.string)],
                autograph=False,
            )
        return self._tokenizers[max_length](tf.reshape(text_B, [-1]))

    def _tokenize(self, text_B, max_length):
        code_N, word_N, words_B = self.normalise(text_B, max_length)
        pieces = self.word_pieces(code_N, word_N, tf.cast(tf.reduce_sum(words_B), tf.int32))
        return tf.RaggedTensor.from_row_lengths(pieces, words_B, validate=False)

    def token_ids(self, text_B, max_length=None):
        """string [B] -> int32 ragged [B, (pieces)]."""
        return self.tokenize(text_B, max_length).merge_dims(1, 2)

    def encode(self, text_B, seq_length):
        """string [B] -> the encoder inputs at `seq_length` (see `pack`), tokenising at most
        `seq_length` words of each input: the bounded-cost path for serving."""
        _check_max_length(seq_length, "seq_length")
        return self.pack([self.tokenize(text_B, max_length=seq_length)], seq_length)

    def pack(self, segments, seq_length):
        """BERT inputs from 1 or 2 tokenised segments (ragged [B, (words), (pieces)] or
        [B, (pieces)]): [CLS] A [SEP] (B [SEP]), truncated round-robin, padded to seq_length.

        Returns the dict of int32 [B, seq_length] `input_word_ids`, `input_mask`,
        `input_type_ids` (the TF-Hub `.bert_pack_inputs`).
        """
        if not 1 <= len(segments) <= 2:
            raise ValueError(f"BERT packs 1 or 2 segments. Received: {len(segments)} segments")
        segments = [segment.merge_dims(1, -1) if segment.ragged_rank > 1 else segment for segment in segments]
        seq_length = self._checked_seq_length(seq_length, segments)
        budget = seq_length - 1 - len(segments)
        lengths = [tf.cast(segment.row_lengths(), tf.int32) for segment in segments]
        if len(segments) == 1:
            kept = [tf.minimum(lengths[0], budget)]
        else:
            # Round robin: one token to each segment in turn until the budget is spent.
            first = tf.minimum(lengths[0], tf.maximum((budget + 1) // 2, budget - lengths[1]))
            kept = [first, tf.minimum(lengths[1], budget - first)]
        # Dense: position t of row b is [CLS], a kept piece of a segment, its [SEP] or [PAD] (no ragged ops:
        # quick to trace, and a served request pays for B x seq_length positions only).
        position_BxT = tf.range(seq_length)[None, :]
        word_BxT = tf.where(
            position_BxT + 0 * kept[0][:, None] == 0, self.special_ids["[CLS]"], self.special_ids["[PAD]"]
        )
        type_BxT = tf.zeros_like(word_BxT)
        start_B = tf.ones_like(kept[0])  # segment 0 starts after [CLS]
        for index, (segment, keep_B) in enumerate(zip(segments, kept)):
            offset_BxT = position_BxT - start_B[:, None]
            inside_BxT = (offset_BxT >= 0) & (offset_BxT < keep_B[:, None])
            # + one value for the positions outside
            values = tf.concat([tf.cast(segment.flat_values, tf.int32), [0]], 0)
            first_B = tf.cast(segment.row_splits[:-1], tf.int32)
            pieces_BxT = tf.gather(values, tf.where(inside_BxT, first_B[:, None] + offset_BxT, tf.size(values) - 1))
            end_BxT = position_BxT == (start_B + keep_B)[:, None]
            word_BxT = tf.where(end_BxT, self.special_ids["[SEP]"], tf.where(inside_BxT, pieces_BxT, word_BxT))
            type_BxT = tf.where(inside_BxT | end_BxT, index, type_BxT)
            start_B = start_B + keep_B + 1
        return {
            "input_word_ids": word_BxT,
            "input_mask": tf.cast(position_BxT < start_B[:, None], tf.int32),
            "input_type_ids": type_BxT,
        }

    @staticmethod
    def _checked_seq_length(seq_length, segments):
        """seq_length as int32, once it leaves room for [CLS] and a [SEP] per segment and the segments have as many
        rows (checked now when known, else when the graph runs): never rows cut short of their [SEP]."""
        least, static = len(segments) + 1, tf.get_static_value(seq_length)
        message = f"seq_length must be at least {least} for {len(segments)} segment(s) ([CLS] and a [SEP] each)"
        if static is not None and int(static) < least:
            raise ValueError(f"{message}. Received: seq_length={int(static)}")
        checks = (
            []
            if static is not None
            else [tf.debugging.assert_greater_equal(tf.cast(seq_length, tf.int32), least, message=message)]
        )
        if len(segments) == 2:
            checks.append(
                tf.debugging.assert_equal(
                    segments[0].nrows(), segments[1].nrows(), message="the segments must have as many rows"
                )
            )
        with tf.control_dependencies(checks):
            return tf.cast(seq_length, tf.int32) if static is not None else tf.identity(tf.cast(seq_length, tf.int32))


def _check_max_length(value, name="max_length"):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"`{name}` must be a positive integer or None. Received: {name}={value!r}")
