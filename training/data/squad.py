"""SQuAD v1.1: examples, BERT's sliding windows over long contexts, and answer decoding.

Windows are made as google-research/bert's run_squad.py makes them: the context is split
on whitespace into words (keeping each character's word), every word is WordPiece
tokenised on its own, and `[CLS] question [SEP] window [SEP]` rows slide over the
context's tokens by `doc_stride`. A token seen by several windows belongs, for decoding,
to the window where it has the most context on its nearer side ("max context").

Tokenisation is the caller's: `tokenize_words(list_of_words) -> list of token-id lists`,
one list per word (an empty list for a word that yields no token). Decoding works on
ids only: a predicted span is mapped back to the exact characters of the context, and a
span starting or ending inside a word is trimmed to the characters whose tokenisation
is the span's tokens (so "1895" is answered from "(1895-1943)."), which is what BERT's
`get_final_text` achieves with token strings.
"""

import dataclasses
import json
import os
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from concise_attention.models.checks import check_integer

SPECIAL_TOKENS = ("cls", "sep", "pad")


@dataclasses.dataclass(frozen=True)
class SquadExample:
    """A question on a context, with its answers as (text, character offset) pairs."""

    id: str
    question: str
    context: str
    answers: list

    def __post_init__(self):
        for text, char_start in self.answers:
            if (
                not isinstance(char_start, int)
                or not text
                or char_start < 0
                or char_start + len(text) > len(self.context)
            ):
                raise ValueError(
                    f"SQuAD example {self.id!r}: answer {text!r} at character {char_start!r} does not lie "
                    f"inside the context ({len(self.context)} characters)"
                )


def _is_whitespace(character):
    # run_squad.py's word separators; other Unicode spaces stay inside words.
    return character in " \t\r\n" or ord(character) == 0x202F


def split_context(context):
    """Whitespace words of `context` as run_squad.py splits them.

    Returns:
        (words, word_starts, char_to_word): the words, each word's first character
        offset, and for every character the index of its word (a space maps to the word
        before it, -1 before the first word).
    """
    words, word_starts, char_to_word = [], [], []
    previous_is_whitespace = True
    for offset, character in enumerate(context):
        if _is_whitespace(character):
            previous_is_whitespace = True
        else:
            if previous_is_whitespace:
                words.append(character)
                word_starts.append(offset)
            else:
                words[-1] += character
            previous_is_whitespace = False
        char_to_word.append(len(words) - 1)
    return words, word_starts, char_to_word


def answer_found_in_context(example):
    """Whether the first answer's text is found in the context words its offset covers.

    run_squad.py drops training examples failing this check (a handful of SQuAD answers
    whose offsets and texts disagree); examples without answers pass.
    """
    if not example.answers:
        return True
    text, char_start = example.answers[0]
    words, _, char_to_word = split_context(example.context)
    first, last = max(char_to_word[char_start], 0), char_to_word[char_start + len(text) - 1]
    return " ".join(text.split()) in " ".join(words[first : last + 1])


def _field(mapping, key, path, where):
    if not isinstance(mapping, dict) or key not in mapping:
        raise ValueError(f"{path}: missing key {key!r} in {where}")
    return mapping[key]


def _qa_example(qa, context, path, where):
    answers = []
    for index, answer in enumerate(_field(qa, "answers", path, where)):
        answer_where = f"{where}.answers[{index}]"
        answers.append((_field(answer, "text", path, answer_where), _field(answer, "answer_start", path, answer_where)))
    try:
        return SquadExample(_field(qa, "id", path, where), _field(qa, "question", path, where), context, answers)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def read_squad_json(path):
    """Examples of a SQuAD v1.1 JSON file (data -> paragraphs -> qas), on any tf.io.gfile path."""
    path = str(path)
    if not tf.io.gfile.exists(path):
        raise ValueError(f"SQuAD file not found. Received: path={path!r}")
    with tf.io.gfile.GFile(path, "r") as file:
        try:
            document = json.load(file)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from None
    examples = []
    for article_index, article in enumerate(_field(document, "data", path, "the top level")):
        for paragraph_index, paragraph in enumerate(_field(article, "paragraphs", path, f"data[{article_index}]")):
            where = f"data[{article_index}].paragraphs[{paragraph_index}]"
            context = _field(paragraph, "context", path, where)
            for qa_index, qa in enumerate(_field(paragraph, "qas", path, where)):
                examples.append(_qa_example(qa, context, path, f"{where}.qas[{qa_index}]"))
    return examples


def tfds_squad_examples(split, data_dir=None):
    """Examples of tensorflow-datasets' `squad/v1.1` split ("train" or "validation").

    Data not in `data_dir` yet is downloaded and prepared, as `tfds.load` does.
    """
    import tensorflow_datasets as tfds  # heavy; only the TFDS readers need it

    builder = tfds.builder("squad/v1.1", data_dir=data_dir)
    builder.download_and_prepare()
    examples = []
    for record in tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)):
        identifier = record["id"].decode("utf-8")
        texts, starts = record["answers"]["text"], record["answers"]["answer_start"]
        if len(texts) != len(starts):
            raise ValueError(
                f"tfds squad/v1.1 {split} example {identifier!r}: {len(texts)} answer texts but {len(starts)} answer starts"
            )
        answers = [(text.decode("utf-8"), int(start)) for text, start in zip(texts, starts)]
        examples.append(
            SquadExample(identifier, record["question"].decode("utf-8"), record["context"].decode("utf-8"), answers)
        )
    return examples


def squad_examples(split, data_dir, source):
    """SQuAD v1.1 examples: split "train" or "dev"; source "json" (data_dir holds
    train-v1.1.json and dev-v1.1.json, any tf.io.gfile path) or "tfds" (data_dir is the
    tensorflow-datasets data directory, None for its default)."""
    if split not in ("train", "dev"):
        raise ValueError(f"SQuAD split must be 'train' or 'dev'. Received: split={split!r}")
    if source == "tfds":
        return tfds_squad_examples("train" if split == "train" else "validation", data_dir)
    if source != "json":
        raise ValueError(f"SQuAD source must be 'json' or 'tfds'. Received: source={source!r}")
    if data_dir is None:
        raise ValueError(
            "SQuAD JSON files need a data_dir holding train-v1.1.json and dev-v1.1.json. Received: data_dir=None"
        )
    return read_squad_json(os.path.join(str(data_dir), f"{split}-v1.1.json"))


@dataclasses.dataclass(frozen=True, eq=False)  # arrays have no single truth value to compare by
class SquadFeatures:
    """The windows of one example: model inputs, training targets and decoding metadata.

    Attributes (arrays have one row per window; seq is max_seq_length):
        input_word_ids, input_mask, input_type_ids: int32 [windows, seq].
        start_positions, end_positions: int32 [windows]: the first answer's first and last
            token, 0 ([CLS]) when it is not wholly inside the window.
        token_to_word: int32 [windows, seq]: each token's context word, else -1.
        token_to_piece: int32 [windows, seq]: each token's index within its word.
        token_is_max_context: bool [windows, seq]: this window gives the token its most context.
        context, words, word_starts, word_token_ids: the context, its words, their first
            character offsets and their token ids.
        tokenize_words: the tokeniser the windows were made with.
    """

    input_word_ids: np.ndarray
    input_mask: np.ndarray
    input_type_ids: np.ndarray
    start_positions: np.ndarray
    end_positions: np.ndarray
    token_to_word: np.ndarray
    token_to_piece: np.ndarray
    token_is_max_context: np.ndarray
    context: str
    words: tuple
    word_starts: tuple
    word_token_ids: tuple
    tokenize_words: Callable = dataclasses.field(repr=False, compare=False)

    def __len__(self):
        return len(self.input_word_ids)

    def model_inputs(self):
        """The encoder inputs: dict of input_word_ids, input_mask, input_type_ids."""
        return {
            "input_word_ids": self.input_word_ids,
            "input_mask": self.input_mask,
            "input_type_ids": self.input_type_ids,
        }


def _tokenize(tokenize_words, words):
    token_ids = [list(ids) for ids in tokenize_words(list(words))]
    if len(token_ids) != len(words):
        raise ValueError(
            f"tokenize_words must return one token list per word. Received: {len(token_ids)} lists for {len(words)} words"
        )
    return token_ids


def _answer_token_span(example, char_to_word, word_first_token, doc_token_ids, tokenize_words):
    """First and last context token of the first answer, narrowed as run_squad.py's
    `_improve_answer_span` does to the tokens that are exactly the answer's tokens."""
    text, char_start = example.answers[0]
    first_word = max(char_to_word[char_start], 0)
    last_word = char_to_word[char_start + len(text) - 1]
    start = word_first_token[first_word]
    end = word_first_token[last_word + 1] - 1 if last_word + 1 < len(word_first_token) else len(doc_token_ids) - 1
    answer_ids = [token for ids in _tokenize(tokenize_words, text.split()) for token in ids]
    for new_start in range(start, end + 1):
        for new_end in range(end, new_start - 1, -1):
            if doc_token_ids[new_start : new_end + 1] == answer_ids:
                return new_start, new_end
    return start, end


def _windows(num_tokens, max_tokens_per_window, doc_stride):
    """(start, length) of each window over `num_tokens` context tokens."""
    windows, start = [], 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens_per_window)
        windows.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return windows


def _max_context_window(windows, position):
    """The window where token `position` has the largest min(left, right) context; the
    0.01 * length term prefers the longer window on ties, as run_squad.py does."""
    best_score, best_window = None, None
    for index, (start, length) in enumerate(windows):
        if start <= position < start + length:
            score = min(position - start, start + length - 1 - position) + 0.01 * length
            if best_score is None or score > best_score:
                best_score, best_window = score, index
    return best_window


def _check_window_arguments(special_ids, max_seq_length, doc_stride, max_query_length):
    missing = [name for name in SPECIAL_TOKENS if name not in special_ids]
    if missing:
        raise ValueError(f"special_ids must give the ids of {list(SPECIAL_TOKENS)}. Missing: {missing}")
    for name, value in (
        ("max_seq_length", max_seq_length),
        ("doc_stride", doc_stride),
        ("max_query_length", max_query_length),
    ):
        check_integer(name, value)
    if max_seq_length < max_query_length + 4:
        raise ValueError(
            "max_seq_length must leave room for [CLS], the question, two [SEP] and one context token. "
            f"Received: max_seq_length={max_seq_length}, max_query_length={max_query_length}"
        )


def _flatten(word_token_ids):
    """(first token of each word, word of each token, piece of its word of each token, the tokens) of a context."""
    word_first_token, token_word, token_piece, doc_token_ids = [], [], [], []
    for word_index, ids in enumerate(word_token_ids):
        word_first_token.append(len(doc_token_ids))
        token_word.extend([word_index] * len(ids))
        token_piece.extend(range(len(ids)))
        doc_token_ids.extend(ids)
    return word_first_token, token_word, token_piece, doc_token_ids


def make_features(example, tokenize_words, special_ids, max_seq_length=384, doc_stride=128, max_query_length=64):
    """The `[CLS] question [SEP] window [SEP]` rows of `example`, as run_squad.py makes them.

    Args:
        example: a SquadExample; the first answer (if any) gives the target positions.
        tokenize_words: callable, list of words -> list of token-id lists (one per word).
        special_ids: dict with the ids of "cls", "sep" and "pad".
        max_seq_length: length of every row.
        doc_stride: tokens between the starts of consecutive windows.
        max_query_length: the question is cut to this many tokens.

    Returns SquadFeatures (no window for a context without tokens).
    """
    _check_window_arguments(special_ids, max_seq_length, doc_stride, max_query_length)
    query_ids = [token for ids in _tokenize(tokenize_words, example.question.split()) for token in ids][
        :max_query_length
    ]
    words, word_starts, char_to_word = split_context(example.context)
    word_token_ids = _tokenize(tokenize_words, words)
    word_first_token, token_word, token_piece, doc_token_ids = _flatten(word_token_ids)
    answer_span = None
    if example.answers and doc_token_ids:
        answer_span = _answer_token_span(example, char_to_word, word_first_token, doc_token_ids, tokenize_words)
    windows = _windows(len(doc_token_ids), max_seq_length - len(query_ids) - 3, doc_stride)
    shape = (len(windows), max_seq_length)
    arrays = {name: np.zeros(shape, np.int32) for name in ("input_word_ids", "input_mask", "input_type_ids")}
    arrays["input_word_ids"][:] = special_ids["pad"]
    token_to_word, token_to_piece = np.full(shape, -1, np.int32), np.full(shape, -1, np.int32)
    token_is_max_context = np.zeros(shape, bool)
    start_positions, end_positions = np.zeros(len(windows), np.int32), np.zeros(len(windows), np.int32)
    doc_offset = len(query_ids) + 2  # [CLS] question [SEP]
    for index, (start, length) in enumerate(windows):
        window = doc_token_ids[start : start + length]
        row = [special_ids["cls"], *query_ids, special_ids["sep"], *window, special_ids["sep"]]
        arrays["input_word_ids"][index, : len(row)] = row
        arrays["input_mask"][index, : len(row)] = 1
        arrays["input_type_ids"][index, doc_offset : len(row)] = 1
        context_slice = slice(doc_offset, doc_offset + length)
        token_to_word[index, context_slice] = token_word[start : start + length]
        token_to_piece[index, context_slice] = token_piece[start : start + length]
        token_is_max_context[index, context_slice] = [
            _max_context_window(windows, p) == index for p in range(start, start + length)
        ]
        if answer_span and start <= answer_span[0] and answer_span[1] < start + length:
            start_positions[index], end_positions[index] = (position - start + doc_offset for position in answer_span)
    return SquadFeatures(
        **arrays,
        start_positions=start_positions,
        end_positions=end_positions,
        token_to_word=token_to_word,
        token_to_piece=token_to_piece,
        token_is_max_context=token_is_max_context,
        context=example.context,
        words=tuple(words),
        word_starts=tuple(word_starts),
        word_token_ids=tuple(tuple(ids) for ids in word_token_ids),
        tokenize_words=tokenize_words,
    )


def _first_piece_offset(word, ids, piece, tokenize_words):
    """Where token `piece` of `word` begins: the first suffix of the word whose
    tokenisation is exactly the word's tokens from `piece` on. 0 (the whole word) when no
    suffix is, as inside a WordPiece continuation ("##ning" of "running")."""
    if piece == 0:
        return 0
    wanted = list(ids[piece:])
    for offset in range(1, len(word)):
        if _tokenize(tokenize_words, [word[offset:]])[0] == wanted:
            return offset
    return 0


def _prefix_length(text, ids, count, tokenize_words):
    """Length of the longest prefix of `text` (tokenised as `ids`) whose tokenisation is
    exactly its first `count` tokens; all of `text` when none is."""
    if count >= len(ids):
        return len(text)
    wanted = list(ids[:count])
    for length in range(len(text) - 1, 0, -1):
        if _tokenize(tokenize_words, [text[:length]])[0] == wanted:
            return length
    return len(text)


def span_text(features, window, start, end):
    """The context characters of tokens start..end of a window, trimmed inside the first
    and last words to the characters of those tokens."""
    first_word, last_word = int(features.token_to_word[window, start]), int(features.token_to_word[window, end])
    first_piece, last_piece = int(features.token_to_piece[window, start]), int(features.token_to_piece[window, end])
    words, word_ids, tokenize_words = features.words, features.word_token_ids, features.tokenize_words
    cut = _first_piece_offset(words[first_word], word_ids[first_word], first_piece, tokenize_words)
    char_start = features.word_starts[first_word] + cut
    if first_word == last_word and (cut or first_piece == 0):
        text, ids, count, text_start = (
            words[last_word][cut:],
            word_ids[last_word][first_piece:],
            last_piece - first_piece + 1,
            char_start,
        )
    else:
        text, ids, count, text_start = (
            words[last_word],
            word_ids[last_word],
            last_piece + 1,
            features.word_starts[last_word],
        )
    return features.context[char_start : text_start + _prefix_length(text, ids, count, tokenize_words)]


def best_span(features, start_logits, end_logits, n_best_size=20, max_answer_length=30):
    """The best (window, start, end) token span of an example, as run_squad.py chooses it.

    Candidates pair each window's `n_best_size` highest start and end logits; a candidate
    must lie in the context, start on a token whose max-context window this is, end at
    or after its start and span at most `max_answer_length` tokens. The highest
    start + end logit wins (the first on ties); None when no candidate is valid.
    `start_logits`, `end_logits`: float [windows, max_seq_length], like `features`.
    """
    start_logits, end_logits = np.asarray(start_logits, np.float64), np.asarray(end_logits, np.float64)
    expected = features.input_word_ids.shape
    if start_logits.shape != expected or end_logits.shape != expected:
        raise ValueError(
            f"Logits must be shaped like the features {expected}. "
            f"Received: start_logits {start_logits.shape}, end_logits {end_logits.shape}"
        )
    best_score, best = None, None
    for window in range(len(features)):
        starts = np.argsort(-start_logits[window], kind="stable")[:n_best_size]
        ends = np.argsort(-end_logits[window], kind="stable")[:n_best_size]
        for start in starts:
            if features.token_to_word[window, start] < 0 or not features.token_is_max_context[window, start]:
                continue
            for end in ends:
                if features.token_to_word[window, end] < 0 or end < start or end - start + 1 > max_answer_length:
                    continue
                score = start_logits[window, start] + end_logits[window, end]
                if best_score is None or score > best_score:
                    best_score, best = score, (window, int(start), int(end))
    return best


def best_answer(example, features, start_logits, end_logits, n_best_size=20, max_answer_length=30):
    """The answer text of `example`: `best_span`'s span of its windows, as context characters.

    Args:
        example: the SquadExample (its id names it in errors).
        features: the SquadFeatures `make_features` gave for it.
        start_logits, end_logits: float arrays [windows, max_seq_length].
        n_best_size, max_answer_length: see `best_span`.

    Returns:
        The answer's text from the context ("" when no candidate is valid).
    """
    try:
        span = best_span(features, start_logits, end_logits, n_best_size, max_answer_length)
    except ValueError as error:
        raise ValueError(f"SQuAD example {example.id!r}: {error}") from None
    return "" if span is None else span_text(features, *span)
