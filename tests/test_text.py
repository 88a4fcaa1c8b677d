"""BERT's tokenisation (training/preprocessing/text.py) against Hugging Face's `tokenizers` (Rust
`BertWordPieceTokenizer`, an independent implementation of google-research/bert's
tokenizer) on >= 3,000 lines of real, multilingual and adversarial text, for the uncased
all-MiniLM-L6-v2 vocabulary and a cased one; and its bounded cost, measured in a fresh
process that never imports tensorflow-text."""

import collections
import json
import random
import re
import subprocess
import sys
import unicodedata

import numpy as np
import pytest
import tensorflow as tf

from concise_attention.training.data.packing import SAMPLE_CORPUS
from concise_attention.training.data.packing import read_lines
from concise_attention.training.preprocessing.text import MAX_CHARS_PER_WORD
from concise_attention.training.preprocessing.text import SPECIAL_TOKENS
from concise_attention.training.preprocessing.text import WordPieceModule
from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer

# The characters keras-hub's normalisation (NFKC case folding) changed and BERT's does not.
COMPATIBILITY = "… ﬁ ﬂ ﬀ ² ³ ™ ½ ¼ ß ẞ Ｆｕｌｌ－ｗｉｄｔｈ ＡＢＣ１２３ ① ② ⑩ Ⅻ ℃ № µ Å K ſ ǅ ﹏ ︵"
FORMAT_AND_CONTROL = (
    "\u200b\u200c\u200d\ufeff\u00ad\u2060\u2062\u202e\u200e\u061c"  # zero width, soft hyphen, bidi marks (Cf)
    "\x00\x01\x07\x0b\x0c\x1b\x7f\x85\ufffd\ue000\U000f0000"  # NUL, controls (Cc), replacement, private use (Co)
)
SPACES = "\u00a0\u2003\u3000\u2002\u2009\u202f\u205f\u1680\u2028\u2029\t\n\r"
EMOJI = "🙂 🙃 👍🏽 👨‍👩‍👧 ✨ 🇫🇷 ❤️ 🥰 🫠 😀😃😄 🤖"
MULTILINGUAL = [
    "我们今天去北京天安门广场参观。",
    "機器學習是人工智慧的一個分支。",
    "東京タワーは日本の電波塔です。",
    "ひらがなとカタカナ、そして漢字。",
    "안녕하세요 세계",
    "한국어 형태소 분석은 어렵습니다.",
    "مرحبا بالعالم، هذا اختبار.",
    "اللُّغَةُ العَرَبِيَّةُ جميلة",
    "שָׁלוֹם עוֹלָם",
    "नमस्ते दुनिया, यह एक परीक्षण है।",
    "क़िला ज़रूर फ़िल्म",
    "আমি বাংলায় গান গাই।",
    "தமிழ் ஒரு மொழி.",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "Ελληνικά: Καλημέρα κόσμε!",
    "ΟΔΟΣ ΣΟΦΙΑΣ",
    "Ἀθῆναι ᾅδης ὦ",
    "Привет, мир! Это проверка токенизации.",
    "Ёжик в тумане",
    "Україна, Київ, їжак",
    "Բարեւ աշխարհ",
    "გამარჯობა მსოფლიო",
    "Tiếng Việt có nhiều dấu thanh.",
    "Café au lait, naïve façade, Straße, Ærøskøbing, Łódź, İstanbul, Dvořák, Nguyễn Văn Ánh, São Paulo, Ça va? Œuvre, Ångström",
    "IĞDIR ılık ŞİŞLİ",
    "Price: €12.50 (≈ $13) — 50% off!!! #sale @shop",
    "https://example.com/path?q=1&x=2#frag user@example.org",
    "def f(x): return x**2 // 3  # comment",
    "∑ᵢ xᵢ² ≤ ∞ ∀ε>0 ∃δ H₂O",
    "“smart quotes” ‘single’ «guillemets» „German“ –—― ¡¿ §¶†‡•",
    "½ ⅓ ¾ Ⅻ ﬁre ﬂow ™ ® © °C",
    "Ｈｅｌｌｏ，\u3000ｗｏｒｌｄ！",
    "A\u0301e\u0300i\u0302o\u0303u\u0308 c\u0327 n\u0303",  # decomposed: marks after their letters
]
# Blocks of code points whose characters the test writes out one by one.
BLOCKS = [
    (0x20, 0x250),
    (0x250, 0x370),
    (0x370, 0x530),
    (0x530, 0x590),
    (0x590, 0x700),
    (0x900, 0x980),
    (0x1E00, 0x2000),
    (0x2000, 0x2070),
    (0x2070, 0x20D0),
    (0x2100, 0x2190),
    (0x2190, 0x2300),
    (0x2460, 0x2500),
    (0x3000, 0x3100),
    (0xAC00, 0xAC80),
    (0xF900, 0xFA00),
    (0xFB00, 0xFB50),
    (0xFE30, 0xFE50),
    (0xFF00, 0xFFF0),
    (0x1D400, 0x1D500),
]


def _stable_character(code):
    """A character every Unicode version since 3.2 puts in the same category (Hugging
    Face's Rust tables are older than Python's: characters added or re-categorised since
    differ, as training/preprocessing/text.py documents)."""
    character = chr(code)
    category = unicodedata.category(character)
    return category != "Cn" and unicodedata.ucd_3_2_0.category(character) == category and not 0xD800 <= code <= 0xDFFF


def _perturbed(sentence, rng):
    """A sentence with the character classes BERT's normalisation handles put into it."""
    specials = [c for c in COMPATIBILITY + FORMAT_AND_CONTROL + EMOJI if c != " "]
    words = []
    for word in sentence.split(" "):
        draw = rng.random()
        if draw < 0.1:
            word = word.upper()
        elif draw < 0.15:
            word = "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in word)  # full width
        elif draw < 0.2:
            word = unicodedata.normalize("NFD", word.replace("e", "é").replace("a", "à"))
        if rng.random() < 0.2:
            position = rng.randrange(len(word) + 1)
            word = word[:position] + rng.choice(specials) + word[position:]
        words.append(word)
    separators = [rng.choice(SPACES) if rng.random() < 0.2 else " " for _ in words]
    return "".join(separator + word for separator, word in zip(separators, words)).strip(" ")


def _long_words():
    lines = []
    for length in (MAX_CHARS_PER_WORD - 1, MAX_CHARS_PER_WORD, MAX_CHARS_PER_WORD + 1):
        for unit in ("x", "X", "ab", "é", "e\u0301", "İ", "ß", "ﬁ", "한", "Ж"):
            word = unit * length  # "ab", "e\u0301": twice as many code points
            lines += [word, f"before {word} after", f"{word}!{word[:5]}"]
    return lines


def build_corpus():
    """>= 3,000 lines: the shipped corpus, its sentences, those sentences with every
    character class put in, multilingual text, Unicode blocks written out, long words."""
    lines = read_lines(SAMPLE_CORPUS)
    sentences = [sentence for line in lines for sentence in re.split(r"(?<=[.!?])\s+", line) if sentence.strip()]
    rng = random.Random(0)
    perturbed = [_perturbed(rng.choice(sentences), rng) for _ in range(1200)]
    blocks = []
    for low, high in BLOCKS:
        characters = [chr(code) for code in range(low, high) if _stable_character(code)]
        for start in range(0, len(characters), 16):
            chunk = characters[start : start + 16]
            blocks += ["".join(chunk), " ".join(chunk), "a" + "a".join(chunk) + "a"]
    classes = [
        COMPATIBILITY,
        EMOJI,
        "a" + "a".join(FORMAT_AND_CONTROL) + "a",
        "a" + "a".join(SPACES) + "a",
        "a\u00a0b\u2003c\u3000d",
    ]
    corpus = lines + sentences + perturbed + MULTILINGUAL + blocks + classes + _long_words() + [""]
    assert not any(token in line for line in corpus for token in SPECIAL_TOKENS)  # Hugging Face would match those
    return corpus


@pytest.fixture(scope="module")
def corpus():
    lines = build_corpus()
    assert len(lines) >= 3000
    return lines


@pytest.fixture(scope="module")
def minilm_tokenizer(minilm_dir):
    """The training tokenizer of the uncased all-MiniLM-L6-v2 vocabulary (built once: the
    other settings are built by the tests that use them)."""
    return wordpiece_tokenizer(minilm_dir / "vocab.txt")


def _hugging_face_ids(vocabulary, lowercase, strip_accents, lines):
    from tokenizers import BertWordPieceTokenizer

    reference = BertWordPieceTokenizer(
        str(vocabulary), lowercase=lowercase, strip_accents=strip_accents, clean_text=True, handle_chinese_chars=True
    )
    return reference.encode_batch(lines, add_special_tokens=False)


@pytest.mark.parametrize(
    "vocabulary_name, lowercase, strip_accents",
    [("minilm", True, None), ("minilm", True, False), ("cased", False, None), ("cased", False, True)],
)
def test_ids_equal_hugging_face_on_every_line(
    corpus, minilm_dir, minilm_tokenizer, cased_vocabulary, vocabulary_name, lowercase, strip_accents
):
    vocabulary = minilm_dir / "vocab.txt" if vocabulary_name == "minilm" else cased_vocabulary
    expected = [encoding.ids for encoding in _hugging_face_ids(vocabulary, lowercase, strip_accents, corpus)]
    if (vocabulary_name, lowercase, strip_accents) == ("minilm", True, None):
        tokenizer = minilm_tokenizer
    else:
        tokenizer = wordpiece_tokenizer(vocabulary, lowercase=lowercase, strip_accents=strip_accents)
    ours = tokenizer(tf.constant(corpus)).to_list()
    identical = sum(mine == theirs for mine, theirs in zip(ours, expected))
    ids = sum(len(theirs) for theirs in expected)
    unknown = sum(theirs.count(tokenizer.token_to_id("[UNK]")) for theirs in expected)
    setting = f"{vocabulary_name} lowercase={lowercase} strip_accents={strip_accents}"
    print(f"{setting}: {identical}/{len(corpus)} lines identical ({ids} ids, {unknown} [UNK])")
    assert [line for line, mine, theirs in zip(corpus, ours, expected) if mine != theirs][:5] == []
    assert identical == len(corpus)


def test_graph_words_and_pieces_equal_the_training_tokenizer_and_hugging_face(corpus, minilm_dir, minilm_tokenizer):
    """The module's `tokenize` graph (what the SavedModels run) gives the training
    tokenizer's ids, grouped into Hugging Face's words."""
    vocabulary = minilm_dir / "vocab.txt"
    module = minilm_tokenizer.module
    tokenize = tf.function(module.tokenize, input_signature=[tf.TensorSpec([None], tf.string)])
    words = tokenize(tf.constant(corpus))
    assert words.ragged_rank == 2
    assert words.merge_dims(1, 2).to_list() == minilm_tokenizer(tf.constant(corpus)).to_list()
    pieces_per_word = words.row_lengths(axis=2)
    expected = [
        list(collections.Counter(encoding.word_ids).values())
        for encoding in _hugging_face_ids(vocabulary, True, None, corpus)
    ]
    assert pieces_per_word.to_list() == expected


def test_invalid_utf8_is_replaced_as_python_decodes_it(minilm_dir, minilm_tokenizer):
    texts = [b"\xff\xfe\xc3(invalid \xe2\x82 bytes", b"caf\xc3\xa9\xed\xa0\x80 ok", b"\xf0\x9f\x99", b"trunc\xe2"]
    decoded = [text.decode("utf-8", "replace") for text in texts]
    expected = [encoding.ids for encoding in _hugging_face_ids(minilm_dir / "vocab.txt", True, None, decoded)]
    assert minilm_tokenizer(tf.constant(texts)).to_list() == expected


def test_training_interface_and_keras_hub_packer(minilm_dir, minilm_tokenizer):
    """What training/data/pipeline.py uses: ids of a batch or of one line, token_to_id,
    vocabulary_size, and the segment-pair packer inside tf.data, equal to keras-hub's MultiSegmentPacker."""
    import keras_hub

    from concise_attention.training.data.pipeline import segment_pair_packer

    tokenizer = minilm_tokenizer
    assert tokenizer.vocabulary_size() == 30522
    assert [tokenizer.token_to_id(token) for token in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [
        0,
        100,
        101,
        102,
        103,
    ]
    assert tokenizer.id_to_token(7592) == "hello"
    assert tokenizer(tf.constant("Hello world!")).numpy().tolist() == [7592, 2088, 999]
    with pytest.raises(ValueError, match=r"token='\[NOPE\]'"):
        tokenizer.token_to_id("[NOPE]")
    texts = [["Hello world!", "Fixed head size."], ["Ｆｕｌｌ ① ﬁne", "東京 Straße"]]
    encodings = _hugging_face_ids(minilm_dir / "vocab.txt", True, None, sum(texts, []))
    ids = {text: encoding.ids for text, encoding in zip(sum(texts, []), encodings)}
    packer = keras_hub.layers.MultiSegmentPacker(
        16, start_value=101, end_value=102, pad_value=0, truncate="round_robin"
    )
    pairs = tf.data.Dataset.from_tensor_slices(texts).batch(2)
    ours = next(iter(pairs.map(segment_pair_packer(tokenizer, 16))))
    keras_hubs = next(iter(pairs.map(lambda pair: packer((tokenizer(pair[:, 0]), tokenizer(pair[:, 1]))))))
    for token_ids, segment_ids in (ours, keras_hubs):
        for row, (first, second) in enumerate(texts):
            packed = [101] + ids[first] + [102] + ids[second] + [102]
            assert token_ids.numpy()[row].tolist() == packed + [0] * (16 - len(packed))
            assert segment_ids.numpy()[row].tolist() == [0] * (len(ids[first]) + 2) + [1] * (len(ids[second]) + 1) + [
                0
            ] * (16 - len(packed))


def test_pack_equals_keras_hubs_packer_on_random_segments(minilm_tokenizer):
    """`WordPieceModule.pack` (dense positions, what training, the preprocessor and serving pack with) against
    keras-hub's MultiSegmentPacker with round-robin truncation: 1 or 2 segments of words or of pieces, empty rows
    and batches, int32 and int64 ids, lengths from the least that holds [CLS] and the [SEP]s to beyond every row,
    in eager and in a traced function; a shorter length, or segments of unequal row counts, are refused."""
    import keras_hub

    module, rng = minilm_tokenizer.module, np.random.default_rng(0)

    def segment(rows, words):
        lengths = rng.integers(0, 20, rows)
        pieces = rng.integers(1000, 30000, lengths.sum()).astype(rng.choice(["int32", "int64"]))
        flat = tf.RaggedTensor.from_row_lengths(pieces, lengths)
        if not words:
            return flat, flat
        splits = [sorted(set(rng.integers(0, length + 1, 3).tolist()) | {0, int(length)}) for length in lengths]
        word_lengths = [np.diff(split).tolist() for split in splits]
        return tf.RaggedTensor.from_nested_row_lengths(
            pieces, [[len(w) for w in word_lengths], sum(word_lengths, [])]
        ), flat

    for trial in range(24):
        rows = int(rng.integers(0, 5))
        segments, flats = zip(*(segment(rows, trial % 3 == 0) for _ in range(1 + trial % 2)))
        seq_length = int(rng.integers(len(segments) + 1, 48))
        packer = keras_hub.layers.MultiSegmentPacker(
            seq_length, start_value=101, end_value=102, pad_value=0, truncate="round_robin"
        )
        token_ids, segment_ids = packer(tuple(tf.cast(flat, tf.int32) for flat in flats))
        packs = [module.pack(list(segments), seq_length)]
        if trial % 4 == 0:
            packs.append(tf.function(lambda *segments: module.pack(list(segments), seq_length))(*segments))
        for packed in packs:
            if rows == 0:  # keras-hub gives shape (0,) here
                assert {tuple(packed[name].shape) for name in packed} == {(0, seq_length)}
                continue
            np.testing.assert_array_equal(packed["input_word_ids"].numpy(), np.asarray(token_ids), err_msg=str(trial))
            np.testing.assert_array_equal(packed["input_type_ids"].numpy(), np.asarray(segment_ids), err_msg=str(trial))
            np.testing.assert_array_equal(packed["input_mask"].numpy(), (np.asarray(token_ids) != 0).astype("int32"))
            assert {packed[name].dtype for name in packed} == {tf.int32}
    pieces = [tf.ragged.constant([[5, 6], [7]]), tf.ragged.constant([[8], [9, 10]])]
    with pytest.raises(ValueError, match="seq_length must be at least 3 for 2 segment"):
        module.pack(pieces, 2)
    traced = tf.function(lambda length: module.pack(pieces, length)["input_word_ids"])
    with pytest.raises(tf.errors.InvalidArgumentError, match="seq_length must be at least 3"):
        traced(tf.constant(2))
    with pytest.raises(tf.errors.InvalidArgumentError, match="as many rows"):
        module.pack([pieces[0], tf.ragged.constant([[8]])], 8)


def test_bad_settings_and_vocabulary_are_named(minilm_dir, tmp_path):
    with pytest.raises(ValueError, match="strip_accents='yes'"):
        wordpiece_tokenizer(minilm_dir / "vocab.txt", strip_accents="yes")
    with pytest.raises(ValueError, match="max_length=0"):
        WordPieceModule(minilm_dir / "vocab.txt", max_length=0)
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    with pytest.raises(ValueError, match=r"lacks the special token\(s\) \[PAD\]"):
        wordpiece_tokenizer(tmp_path / "vocab.txt")
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIAL_TOKENS + ("hello", "##s", "hello")) + "\n")
    with pytest.raises(ValueError, match="lists a token twice .* token='hello'"):
        wordpiece_tokenizer(tmp_path / "vocab.txt")


BOUNDED_COST_SCRIPT = r"""
import json, sys, time
sys.modules["tensorflow_text"] = None  # stock TF Serving has no tensorflow-text: it must not be needed
import numpy as np
import tensorflow as tf
from concise_attention.training.preprocessing.text import WordPieceModule

vocabulary, saved, inputs_path, out_path = sys.argv[1:5]
module = WordPieceModule(vocabulary)
root = tf.Module()
root.tokenizer = module
text_spec = tf.TensorSpec([None], tf.string)
root.encode = tf.function(lambda text: module.encode(text, 128), input_signature=[text_spec])
root.tokenize = tf.function(module.tokenize, input_signature=[text_spec])  # the preprocessor's `.tokenize`: default bound
tf.saved_model.save(root, saved)
loaded = tf.saved_model.load(saved)

inputs = json.loads(open(inputs_path, encoding="utf-8").read())
cases = {name: tf.constant([bytes.fromhex(text) for text in texts]) for name, texts in inputs["cases"].items()}
results = {"ids": {name: loaded.encode(texts)["input_word_ids"].numpy().tolist() for name, texts in cases.items()}}
for name, function in (("encode", loaded.encode), ("tokenize", loaded.tokenize)):
    timings = {name: [] for name in cases}
    for _ in range(15):  # interleaved, so that the load of a shared machine spreads over all cases
        for case, texts in cases.items():
            start = time.perf_counter()
            function(texts)
            timings[case].append(time.perf_counter() - start)
    results[name] = {case: float(np.median(times)) for case, times in timings.items()}

def status_mb(field):
    return next(int(line.split()[1]) / 1024 for line in open("/proc/self/status") if line.startswith(field + ":"))

big = tf.constant([np.random.default_rng(index).bytes(1 << 20) for index in range(64)])
results["rss_before_mb"] = status_mb("VmRSS")
try:  # resets the peak (VmHWM), so that it is the batch's and not the export's
    open("/proc/self/clear_refs", "w").write("5")
except OSError:
    pass
start = time.perf_counter()
loaded.encode(big)
results["batch_64_seconds"] = time.perf_counter() - start
results["rss_peak_mb"] = max(status_mb("VmHWM"), status_mb("VmRSS"))
results["tensorflow_text_imported"] = sys.modules.get("tensorflow_text") is not None
open(out_path, "w").write(json.dumps(results))
"""


@pytest.mark.slow
def test_cost_is_bounded_by_the_sequence_length(minilm_dir, tmp_path):
    """A SavedModel of the tokenizer + packing at seq_length 128, in a fresh process: each
    adversarial input costs at most 3x 32 ordinary sentences, the ids stay Hugging Face's
    (truncated), and a batch of 64 x 1 MB stays under 2 GB resident."""
    lines = read_lines(SAMPLE_CORPUS)
    ordinary = [line[:200] for line in lines[:32]]
    megabyte = 1 << 20
    cases = {
        "ordinary": [text.encode() for text in ordinary],
        "one_letter_words": [("a " * (megabyte // 2 - 50) + "b" * 99).encode()],
        "one_letter_words_after_a_long_one": [("b" * 99 + " a" * (megabyte // 2 - 50)).encode()],
        "one_word": [b"a" * megabyte],
        "random_bytes": [np.random.default_rng(0).bytes(megabyte)],
        "ordinary_and_40kB": [text.encode() for text in ordinary] + [" ".join(lines)[:40_000].encode()],
    }
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps({"cases": {name: [text.hex() for text in texts] for name, texts in cases.items()}}))
    out = tmp_path / "out.json"
    script = subprocess.run(
        [
            sys.executable,
            "-c",
            BOUNDED_COST_SCRIPT,
            str(minilm_dir / "vocab.txt"),
            str(tmp_path / "saved"),
            str(inputs),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(SAMPLE_CORPUS.parents[2]),
    )
    assert script.returncode == 0, script.stderr[-4000:]
    results = json.loads(out.read_text())
    assert not results["tensorflow_text_imported"]
    for name, texts in cases.items():  # [CLS] + the first 126 ids + [SEP], as Hugging Face gives them
        encodings = _hugging_face_ids(
            minilm_dir / "vocab.txt", True, None, [text.decode("utf-8", "replace") for text in texts]
        )
        expected = [[101] + encoding.ids[:126] + [102] for encoding in encodings]
        assert [[i for i in row if i] for row in results["ids"][name]] == expected, name
    # `tokenize` is bounded by its default max_length (512 words, 4x 128), so a long input
    # may cost it up to about 512/128 times what `encode` pays.
    for function, limit in (("encode", 3), ("tokenize", 4)):
        ratios = {case: seconds / results[function]["ordinary"] for case, seconds in results[function].items()}
        rounded = json.dumps({case: round(ratio, 2) for case, ratio in ratios.items()})
        print(f"{function}: 32 ordinary sentences {1000 * results[function]['ordinary']:.2f} ms; ratios {rounded}")
        assert max(ratios.values()) <= limit, ratios
    print(
        f"64 x 1 MB random: {results['batch_64_seconds']:.3f} s, peak RSS {results['rss_peak_mb']:.0f} MB "
        f"(resident before, 64 MB input included: {results['rss_before_mb']:.0f} MB)"
    )
    assert results["rss_peak_mb"] < 2048
