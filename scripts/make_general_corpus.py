"""Builds a general-domain English distillation corpus from public GitHub repositories.

    python scripts/make_general_corpus.py --out DIR [--mirrors /work/.mirror] [--heldout-hashes FILE] [--overwrite]

Each source in SOURCES is read at its pinned commit from the git directory MIRRORS/owner+name/repo (the layout
the `fetch` tool writes; repo/.git is accepted too) and every file is checked against its pinned SHA-256 (a
source of many files pins the SHA-256 of its listing: one "<sha256>  <path>" line per file, sorted by path).
Training splits only: no dev or test split of any source is read. Each raw text has its whitespace collapsed;
one longer than MAX_WORDS is cut into sentences (SENTENCE_END, the distill task's rule). A text is kept when it
has MIN_WORDS to MAX_WORDS words, is mostly alphabetic, neither it nor any of its sentences (nor the source's own
wording, where a reader rewords) hashes to a held-out text (--heldout-hashes) or to an evaluation text of this
repository (EVALUATION_FILES), and no earlier text (in source order) has its hash. Written into OUT, the layout
`training.data.pipeline.corpus_splits` reads (its train/ and heldout/ splits):

    train/part-NNNNN.txt     one text a line, shards of about SHARD_BYTES
    heldout/part-NNNNN.txt   the texts whose hash is 0 modulo HELDOUT_EVERY (1 in 50, stable)
    manifest.json            per source: repository, commit, files and their SHA-256, licence, kind, texts kept
                             and removed by each filter; per shard its SHA-256 and lines; the inputs' SHA-256

A text's hash: sha256 of the UTF-8 of the text lower-cased, whitespace runs collapsed to one space, ends
stripped. Nothing is written unless every input checks (a bad one is one line naming it, exit status 2); OUT is
written as OUT.tmp-* and renamed into place (an existing OUT is refused unless --overwrite); the same inputs give
byte-identical output. Sources rejected, and why, are listed in REJECTED.
"""

import argparse
import csv
import gzip
import hashlib
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
HELDOUT_HASHES = ROOT.parent / "shared" / "heldout-text-sha256.txt"
EVALUATION_FILES = {  # repository-relative path: the fields holding texts (scripts/make_mteb_data.py writes them)
    "training/data/mteb/STSBenchmark/test.jsonl": ("sentence1", "sentence2"),
    "training/data/mteb/Banking77Classification/test.jsonl": ("text",),
}
MIN_WORDS, MAX_WORDS = 3, 80
MIN_ALPHABETIC = 0.5  # share of letters among the non-space characters
HELDOUT_EVERY = 50
SHARD_BYTES = 10_000_000
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")  # training/tasks/distill.py's
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
FORMAT = "concise-general-corpus/1"
FILTERS = (
    "too_short",
    "too_long",
    "non_alphabetic",
    "evaluation_text",
    "evaluation_sentence",
    "heldout_text",
    "heldout_sentence",
    "duplicate",
)

HWU_FOLD = "CrossValidation/autoGeneFromRealAnno/autoGene_2018_03_22-13_01_25_169/CrossValidation/KFold_1/trainset"
# the train/dialogues_NNN.json files under 4 MiB (the mirror lacks the larger ones)
SGD_TRAIN = (
    (1, 36),
    (38, 51),
    (57, 57),
    (59, 59),
    (61, 65),
    (67, 67),
    (69, 69),
    (86, 92),
    (95, 103),
    (105, 116),
    (119, 127),
)
SONOS = (
    "AddToPlaylist",
    "BookRestaurant",
    "GetWeather",
    "PlayMusic",
    "RateBook",
    "SearchCreativeWork",
    "SearchScreeningEvent",
)

# In source order: a text found in two sources is kept in the first. files: {path: sha256}; or paths (a list)
# or pattern (a regular expression every path of the commit's tree is matched against) with count and listing.
SOURCES = [
    {
        "name": "clinc150",
        "repo": "clinc/oos-eval",
        "commit": "828f8093932c8fe6ca7936c3d2e52903b1c523de",
        "licence": "CC BY 3.0",
        "kind": "query",
        "reader": "clinc",
        "note": "data_full.json, its train and oos_train splits only",
        "files": {"data/data_full.json": "36923c3705a59e08fe9c3883d8bc2dd966ef93e22cb78ac41171782a698d56e0"},
    },
    {
        "name": "restaurant8k-train",
        "repo": "PolyAI-LDN/task-specific-datasets",
        "commit": "57ec275d8078af65b7731c2a98be812d844a6d6b",
        "licence": "CC BY 4.0",
        "kind": "query",
        "reader": "restaurant8k",
        "note": "train_0.json, the whole training split (train_1.. are its subsets)",
        "files": {
            "span_extraction/restaurant8k/train_0.json": "90cb03e1cdd3ee141829605955a54d946308e1558250ca1e7413f260443bc6a4"
        },
    },
    {
        "name": "hwu64-train",
        "repo": "xliuhw/NLU-Evaluation-Data",
        "commit": "f6071b496b17d71e6eb43f543af0707f4ff30557",
        "licence": "CC BY 4.0",
        "kind": "query",
        "reader": "hwu",
        "note": "the training set of cross-validation fold 1",
        "pattern": re.escape(HWU_FOLD) + r"/[^/]+\.csv",
        "count": 64,
        "listing": "c10ac122a57ed51127825f9fb759b4c5e0bdc3b0ad24e41f7b3d4c94ca4e05eb",
    },
    {
        "name": "snips-train",
        "repo": "sonos/nlu-benchmark",
        "commit": "b86ac7f1577868c42158d0dec77db50956046696",
        "licence": "CC0 1.0",
        "kind": "query",
        "reader": "sonos",
        "note": "2017-06-custom-intent-engines, train_*_full.json (not validate_*)",
        "files": {
            f"2017-06-custom-intent-engines/{intent}/train_{intent}_full.json": digest
            for intent, digest in zip(
                SONOS,
                (
                    "fee1b4645352e70ed8a40f1f87c3b53fc3bf75f8ebc82252a22b82c107e75b01",
                    "7677e82cd6e9a8191f0a4502568c786278c984900b4796d3628e46f1abf73ef4",
                    "86f414b2ad8a993134d85d16e25e5d337beae47cef993c0af2a5f440405c60f6",
                    "901ddbe9781d1fdb8196e789c543f80df3d29ca6e237da64947905adcc0312e4",
                    "bb43e4b74134300d5766f6b420d0357a63402987a225f6dc92c806c9c040ce04",
                    "87b3432de48c71c205aa5238b41d9e3f2d70bdfcd0bea2427544fb9e4bd5e5bb",
                    "5447e9440c02e2fb08c3ae16b9f58a4d1332b4bc77fd34691402b02aa4399765",
                ),
            )
        },
    },
    {
        "name": "query-wellformedness-train",
        "repo": "google-research-datasets/query-wellformedness",
        "commit": "fb69c21416195cddc797277ea9e4d393226571d2",
        "licence": "CC BY-SA 4.0",
        "kind": "question",
        "reader": "wellformedness",
        "note": "questions from the Paralex corpus (WikiAnswers); the final ' ?' joined",
        "files": {"train.tsv": "d857d11fed665bd6daeaf68bc5bbcf81c0cccfa21d485f4f8be9a169db526b6b"},
    },
    {
        "name": "clickbait-headlines",
        "repo": "bhargaviparanjape/clickbait",
        "commit": "203d979a81545ae6160ff45ffdac83e74469c97a",
        "licence": "MIT (repository LICENSE, covering dataset/)",
        "kind": "news",
        "reader": "gzip_lines",
        "note": "news headlines: WikiNews, New York Times, The Guardian, The Hindu; and clickbait sites",
        "files": {
            "dataset/non_clickbait_data.gz": "4baa2a3cf6b28a48b765e4f763b5d5f03535caae1c70a26f680d39b0ca782a05",
            "dataset/clickbait_data.gz": "a174ae2a377908ae58a514416c01a19c882de27fa6b1500da3774114e332a546",
        },
    },
    {
        "name": "goemotions-train",
        "repo": "isabelhdias/sentiment-aware-conversational-agent",
        "commit": "a4b20ba2a74d87128e647437b47773211fedd503",
        "licence": "Apache-2.0 (GoEmotions, github.com/google-research/google-research)",
        "kind": "forum",
        "reader": "goemotions",
        "note": "Reddit comments; a copy of google-research/google-research goemotions/data/train.tsv with a header "
        "row added (the same 3,497,811 characters after it)",
        "files": {"data/goemotions/train.tsv": "9abfe94b5dd8d9bf98f5fe408a530f7932e4f836119079c5ce81cb7b70be9222"},
    },
    {
        "name": "sgd-train",
        "repo": "google-research-datasets/dstc8-schema-guided-dialogue",
        "commit": "e852981ae34990f4358979625854259302feaa78",
        "licence": "CC BY-SA 4.0",
        "kind": "dialogue",
        "reader": "sgd",
        "note": "Schema-Guided Dialogue, the train/ files under 4 MiB (96 of 127)",
        "paths": [f"train/dialogues_{n:03d}.json" for first, last in SGD_TRAIN for n in range(first, last + 1)],
        "count": 96,
        "listing": "73720e18258227ed58444f73cea20c1a878b7301fbad4a660a329c560cde85fb",
    },
    {
        "name": "star",
        "repo": "RasaHQ/STAR",
        "commit": "3058975092cdd09798e4a3a9e4ae135755824545",
        "licence": "MIT",
        "kind": "dialogue",
        "reader": "star",
        "note": "user and wizard turns (not the instructions shown to users)",
        "pattern": r"dialogues/\d+\.json",
        "count": 6652,
        "listing": "336701b8c1f275ac0843af797c102a3de0f5172b67b812de2c2f35fabdfe6289",
    },
    {
        "name": "tatoeba-eng",
        "repo": "modelexlab/data",
        "commit": "adddaf33ac35572bcfeb421efec29435e7ea9332",
        "licence": "CC BY 2.0 FR (Tatoeba; attribution: tatoeba.org and www.manythings.org/anki)",
        "kind": "sentence",
        "reader": "tatoeba",
        "note": "the English side of manythings.org's fra-eng.zip (2019-04-07; see its _about.txt)",
        "files": {"fra-eng.zip": "161c93f18da3a7e6df611ed961426613260de8af06ccf8c79c977afe5135ac44"},
    },
    {
        "name": "wikipedia-homographs-train",
        "repo": "google-research-datasets/WikipediaHomographData",
        "commit": "8f008f021e88f8b71118a27ae655f1f3121162bc",
        "licence": "Apache-2.0 (repository LICENSE); sentences from English Wikipedia",
        "kind": "wikipedia",
        "reader": "homograph",
        "note": "data/train only",
        "pattern": r"data/train/[^/]+\.tsv",
        "count": 162,
        "listing": "0ee9da3b6d1289b9419528b97641043e6d97beebbbef9161baf801466ec7a6b6",
    },
    {
        "name": "open-english-wordnet",
        "repo": "globalwordnet/english-wordnet",
        "commit": "d94538ad0df3d7a4c77837bde6af69d7a6592c32",
        "licence": "CC BY 4.0 (Open English WordNet; derived from Princeton WordNet under the WordNet License)",
        "kind": "definition",
        "reader": "wordnet",
        "note": "each synset's definitions as 'first lemma: definition', and its usage examples",
        "pattern": r"src/yaml/(noun|verb|adj|adv)\.[A-Za-z]+\.yaml",
        "count": 45,
        "listing": "bb69736a1ec6dcb098a0efd99aa7b92502f8e312aaf4136fc5a572720dd1f22d",
    },
]

REJECTED = {  # looked at and not used
    "rajpurkar/SQuAD-explorer": "train-v1.1.json is 4 MiB or more: snapshots lack it",
    "budzianowski/multiwoz": "every MultiWOZ 2.2 train file is 4 MiB or more",
    "google-research-datasets/Taskmaster": "its dialogue files are 4 MiB or more",
    "google-research-datasets/natural-questions": "NQ-open.train.jsonl is 4 MiB or more",
    "google-research-datasets/sentence-compression": "its news sentence files are 4 MiB or more",
    "rishabhmisra/News-Headlines-Dataset-For-Sarcasm-Detection": "its one data file is 4 MiB or more",
    "amazon-science/mintaka": "mintaka_train.json is 4 MiB or more",
    "google-research-datasets/Synthetic-Persona-Chat": "the train file is 4 MiB or more (the rest: evaluation splits)",
    "google-research-datasets/QED": "qed-train.jsonlines is 4 MiB or more",
    "cdjkim/audiocaps": "its README: 'free to use for academic purposes only' (the LICENSE file says MIT)",
    "google-research-datasets/NewsQuizQA": "no licence stated",
    "multi30k/dataset": "no licence stated (its English side is Flickr30k captions, research-only terms)",
    "PolyAI-LDN/task-specific-datasets banking_data/train.csv": "9,997 of its 10,003 texts are in the held-out hashes",
    "isabelhdias/sentiment-aware-conversational-agent data/dailydialog": "DailyDialog is CC BY-NC-SA 4.0",
    "clinc/oos-eval data/all_wiki_sents.txt": "lower-cased with its punctuation removed",
}


class InputError(Exception):
    """A missing or altered input: one line naming it."""


def text_hash(text):
    return hashlib.sha256(" ".join(text.lower().split()).encode("utf-8")).hexdigest()


def sha256(data):
    return hashlib.sha256(data).hexdigest()


class Mirror:
    """Reads blobs and trees of one repository's git directory at pinned commits (one `git cat-file` process)."""

    def __init__(self, mirrors, repo):
        base = pathlib.Path(mirrors, repo.replace("/", "+"), "repo")
        self.git_dir = base / ".git" if (base / ".git").is_dir() else base
        if not (self.git_dir / "objects").is_dir():
            raise InputError(f"mirror of github.com/{repo} not found: {self.git_dir} (fetch it first)")
        self.process = subprocess.Popen(
            ["git", "--git-dir", str(self.git_dir), "cat-file", "--batch"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    def blob(self, commit, path):
        self.process.stdin.write(f"{commit}:{path}\n".encode("utf-8"))
        self.process.stdin.flush()
        header = self.process.stdout.readline().decode("utf-8", "replace").split()
        if len(header) != 3 or header[1] != "blob":
            raise InputError(
                f"{self.git_dir}: {path} at commit {commit} is not in the mirror (a wrong commit, or a "
                "file of 4 MiB or more, which snapshots lack)"
            )
        data = self.process.stdout.read(int(header[2]))
        self.process.stdout.read(1)
        return data

    def paths(self, commit, pattern):
        result = subprocess.run(
            ["git", "--git-dir", str(self.git_dir), "ls-tree", "-r", "--name-only", "-z", commit], capture_output=True
        )
        if result.returncode:
            raise InputError(f"{self.git_dir}: commit {commit} is missing: {result.stderr.decode().strip()}")
        names = result.stdout.decode("utf-8").split("\0")
        return sorted(name for name in names if re.fullmatch(pattern, name))

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def listing_digest(digests):
    return sha256("".join(f"{digest}  {path}\n" for path, digest in sorted(digests.items())).encode("utf-8"))


def read_files(mirror, source):
    """[(path, bytes)] of a source at its commit, sorted by path, after checking every pinned SHA-256."""
    commit = source["commit"]
    if "files" in source:
        paths = sorted(source["files"])
    else:
        paths = sorted(source["paths"]) if "paths" in source else mirror.paths(commit, source["pattern"])
    files = [(path, mirror.blob(commit, path)) for path in paths]
    digests = {path: sha256(data) for path, data in files}
    if "files" in source:
        for path, expected in source["files"].items():
            if digests[path] != expected:
                raise InputError(
                    f"github.com/{source['repo']}: {path} has SHA-256 {digests[path]}, expected {expected}"
                )
    else:
        found = listing_digest(digests)
        if (len(files), found) != (source["count"], source["listing"]):
            raise InputError(
                f"github.com/{source['repo']}: the {len(files)} files of "
                f"{source.get('pattern', 'its path list')} "
                f"have listing SHA-256 {found}, expected {source['count']} files with {source['listing']}"
            )
    return files, digests


# Readers: (path, bytes) -> [text]; a text is a str, or (str, variants) where the reader reworded the source's
# text (variants: the source's wording, checked against the held-out and evaluation hashes too).


def _csv_rows(data, **options):
    return list(csv.DictReader(io.StringIO(data.decode("utf-8")), **options))


def read_clinc(path, data):
    splits = json.loads(data)
    return [text for split in ("train", "oos_train") for text, _ in splits[split]]


def read_banking(path, data):
    return [row["text"] for row in _csv_rows(data)]


def read_restaurant8k(path, data):
    return [example["userInput"]["text"] for example in json.loads(data)]


def read_hwu(path, data):
    """The user's own words, or the annotators' plain copy where the former still holds slot brackets."""
    rows = _csv_rows(data, delimiter=";")
    return [row["answer_from_anno"] if "[" in row["answer_from_user"] else row["answer_from_user"] for row in rows]


def read_sonos(path, data):
    """Each example's parts joined (an emoji's two UTF-16 halves may sit in two parts: they are paired again)."""
    texts = [
        "".join(part["text"] for part in example["data"])
        for examples in json.loads(data).values()
        for example in examples
    ]
    return [text.encode("utf-16", "surrogatepass").decode("utf-16", "replace") for text in texts]


def read_wellformedness(path, data):
    texts = []
    for line in data.decode("utf-8").splitlines():
        question = line.split("\t")[0].strip()
        texts.append((question[:-2] + "?", (question,)) if question.endswith(" ?") else question)
    return texts


def read_gzip_lines(path, data):
    return gzip.decompress(data).decode("utf-8").splitlines()


def read_goemotions(path, data):
    return [row["text"] for row in _csv_rows(data, delimiter="\t")]


def read_sgd(path, data):
    return [turn["utterance"] for dialogue in json.loads(data) for turn in dialogue["turns"]]


def read_star(path, data):
    events = json.loads(data)["Events"]
    return [
        event["Text"]
        for event in events
        if event.get("Agent") in ("User", "Wizard")
        and event.get("Action") in ("utter", "pick_suggestion")
        and event.get("Text")
    ]


def read_tatoeba(path, data):
    lines = zipfile.ZipFile(io.BytesIO(data)).read("fra-eng/fra.txt").decode("utf-8").splitlines()
    return [line.split("\t")[0] for line in lines if line.strip()]


def read_homograph(path, data):
    return [row["sentence"] for row in _csv_rows(data, delimiter="\t")]


def _scalar(lines):
    """A YAML flow scalar (plain or single-quoted) spread over `lines`, folded to one line."""
    value = " ".join(line.strip() for line in lines)
    if value.startswith("'") and value.endswith("'") and len(value) > 1:
        value = value[1:-1].replace("''", "'")
    return value


def _wordnet_synsets(data):
    """[{field: [item lines]}] of a lexicographer file, for the fields definition, example and members (the fixed
    YAML layout of Open English WordNet's src/yaml: synset keys at column 0, fields at 2, items at '  - ')."""
    synsets, field, item = [], None, None
    for line in data.decode("utf-8").splitlines() + [""]:
        if item is not None and (line.startswith("  - ") or not line.startswith("    ")):
            synsets[-1].setdefault(field, []).append(item)
            item = None
        if line and not line.startswith(" "):
            synsets.append({})
        elif re.match(r"  [A-Za-z_]+:", line):
            field = line.split(":")[0].strip()
        elif line.startswith("  - ") and field in ("definition", "example", "members"):
            item = [line[4:]]
        elif line.startswith("    ") and item is not None:
            item.append(line)
    return synsets


def _wordnet_example(lines):
    """An example: a scalar, or a quotation {source, text} whose text is kept."""
    if not lines[0].startswith(("source: ", "text: ")):
        return _scalar(lines)
    keys, key = {}, None
    for line in lines:
        stripped = line.strip()
        at_key_column = line is lines[0] or (line.startswith("    ") and not line.startswith("     "))
        if at_key_column and re.match(r"(source|text): ", stripped):
            key, stripped = stripped.split(": ", 1)
        keys.setdefault(key, []).append(stripped)
    return _scalar(keys.get("text", [""]))


def read_wordnet(path, data):
    """Each synset's definitions as 'first lemma: definition', and its examples."""
    texts = []
    for synset in _wordnet_synsets(data):
        lemma = _scalar(synset["members"][0]) if synset.get("members") else None
        definitions = [_scalar(lines) for lines in synset.get("definition", [])]
        texts += [(f"{lemma}: {definition}", (definition,)) if lemma else definition for definition in definitions]
        texts += [_wordnet_example(lines) for lines in synset.get("example", [])]
    return texts


READERS = {
    name[len("read_") :]: function
    for name, function in list(globals().items())
    if name.startswith("read_") and name != "read_files"
}


def heldout_hashes(path):
    """(set of hashes, sha256 of the file): 64 lower-case hex digits a line, '#' lines comments."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise InputError(f"held-out hash file not found: {path} (--heldout-hashes)")
    data = path.read_bytes()
    hashes = set()
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        line = line.strip()
        if line and not line.startswith("#"):
            if not re.fullmatch(r"[0-9a-f]{64}", line):
                raise InputError(f"{path}, line {number}: not a SHA-256 in hex: {line[:80]!r}")
            hashes.add(line)
    if not hashes:
        raise InputError(f"{path}: no hashes")
    return hashes, sha256(data)


def evaluation_hashes(root):
    """(set of hashes, {path: {sha256, texts}}) of the repository's evaluation texts; a missing file is an error."""
    hashes, files = set(), {}
    for relative, fields in EVALUATION_FILES.items():
        path = pathlib.Path(root, relative)
        if not path.is_file():
            raise InputError(
                f"evaluation file missing: {path} (scripts/make_mteb_data.py writes it); refusing to "
                "build a corpus that could contain its texts"
            )
        data = path.read_bytes()
        try:
            rows = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
            texts = [row[field] for row in rows for field in fields]
        except (ValueError, KeyError, TypeError) as error:
            raise InputError(f"{path}: not JSON lines with the fields {', '.join(fields)} ({error})") from None
        hashes.update(text_hash(text) for text in texts)
        files[relative] = {"sha256": sha256(data), "texts": len(texts)}
    return hashes, files


def clean(raw):
    """One line: control characters dropped, whitespace runs collapsed; unpaired UTF-16 halves replaced."""
    text = " ".join(CONTROL.sub(" ", raw).split())
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def pieces(text):
    """The text itself, or its sentences when it is longer than MAX_WORDS words."""
    return [text] if len(text.split()) <= MAX_WORDS else [piece for piece in SENTENCE_END.split(text) if piece]


def verdict(text, banned, seen, variants=()):
    """The filter that removes `text` (None: kept). banned: {"heldout": hashes, "evaluation": hashes}; `variants`
    (the source's own wording of a text the reader reworded) are checked against them as the text is."""
    words = len(text.split())
    if words < MIN_WORDS:
        return "too_short"
    if words > MAX_WORDS:
        return "too_long"
    visible = text.replace(" ", "")
    if sum(character.isalpha() for character in visible) < MIN_ALPHABETIC * len(visible):
        return "non_alphabetic"
    key = text_hash(text)
    keys = {key, *(text_hash(variant) for variant in variants)}
    sentences = SENTENCE_END.split(text)
    sentence_keys = {text_hash(sentence) for sentence in sentences} if len(sentences) > 1 else set()
    for name in ("evaluation", "heldout"):
        if keys & banned[name]:
            return f"{name}_text"
        if sentence_keys & banned[name]:
            return f"{name}_sentence"
    return "duplicate" if key in seen else None


def source_texts(source, files, banned, seen):
    """(kept [(hash, text)], counts) of one source; `seen` (hashes kept so far) grows."""
    counts = dict.fromkeys(("raw_texts", "empty", "split_into_sentences", *FILTERS, "kept"), 0)
    kept = []
    for path, data in files:
        for raw in READERS[source["reader"]](path, data):
            raw, variants = raw if isinstance(raw, tuple) else (raw, ())
            counts["raw_texts"] += 1
            text = clean(raw)
            if not text:
                counts["empty"] += 1
                continue
            parts = pieces(text)
            counts["split_into_sentences"] += len(parts) > 1
            for part in parts:
                reason = verdict(part, banned, seen, [clean(variant) for variant in variants] if part == text else ())
                if reason:
                    counts[reason] += 1
                    continue
                key = text_hash(part)
                seen.add(key)
                kept.append((key, part))
    counts["kept"] = len(kept)
    return kept, counts


def collect(mirrors, banned):
    """(kept [(hash, text)] in source order, [manifest entry per source]) after checking every source file."""
    kept, entries, seen = [], [], set()
    for source in SOURCES:
        mirror = Mirror(mirrors, source["repo"])
        try:
            files, digests = read_files(mirror, source)
        finally:
            mirror.close()
        try:
            texts, counts = source_texts(source, files, banned, seen)
        except (KeyError, ValueError, zipfile.BadZipFile, OSError) as error:
            raise InputError(f"github.com/{source['repo']}: cannot read its texts ({type(error).__name__}: {error})")
        heldout = sum(is_heldout(key) for key, _ in texts)
        counts.update(kept_train=len(texts) - heldout, kept_heldout=heldout)
        entries.append(
            {
                "name": source["name"],
                "repository": f"https://github.com/{source['repo']}",
                "commit": source["commit"],
                "licence": source["licence"],
                "kind": source["kind"],
                "note": source["note"],
                "files": digests,
                "counts": counts,
                **({"listing_sha256": listing_digest(digests)} if "files" not in source else {}),
            }
        )
        kept += texts
    return kept, entries


def is_heldout(key):
    return int(key[:16], 16) % HELDOUT_EVERY == 0


def shards(texts, folder):
    """{relative path: bytes} of `texts` cut into shards of about SHARD_BYTES."""
    outputs, lines, size = {}, [], 0
    for text in texts:
        line = (text + "\n").encode("utf-8")
        lines.append(line)
        size += len(line)
        if size >= SHARD_BYTES:
            outputs[f"{folder}/part-{len(outputs):05d}.txt"], lines, size = b"".join(lines), [], 0
    if lines:
        outputs[f"{folder}/part-{len(outputs):05d}.txt"] = b"".join(lines)
    return outputs


def build(mirrors, heldout_path, root=ROOT):
    """{relative path: bytes} of every output, manifest.json included, after every check."""
    heldout, heldout_digest = heldout_hashes(heldout_path)
    evaluation, evaluation_files = evaluation_hashes(root)
    kept, entries = collect(mirrors, {"heldout": heldout, "evaluation": evaluation})
    outputs = shards([text for key, text in kept if not is_heldout(key)], "train")
    outputs.update(shards([text for key, text in kept if is_heldout(key)], "heldout"))
    totals = {name: sum(entry["counts"][name] for entry in entries) for name in entries[0]["counts"]}
    manifest = {
        "format": FORMAT,
        "built_by": "scripts/make_general_corpus.py",
        "text_hash": "sha256 of UTF-8 of ' '.join(text.lower().split())",
        "rules": {
            "min_words": MIN_WORDS,
            "max_words": MAX_WORDS,
            "min_alphabetic_share": MIN_ALPHABETIC,
            "heldout": f"int(text_hash[:16], 16) % {HELDOUT_EVERY} == 0",
            "sentence_end": SENTENCE_END.pattern,
            "filters_in_order": list(FILTERS),
            "shard_bytes": SHARD_BYTES,
        },
        "heldout_hashes": {"file": pathlib.Path(heldout_path).name, "sha256": heldout_digest, "hashes": len(heldout)},
        "evaluation_files": evaluation_files,
        "sources": entries,
        "totals": totals,
        "rejected": REJECTED,
        "shards": {
            path: {"sha256": sha256(data), "lines": data.count(b"\n"), "bytes": len(data)}
            for path, data in sorted(outputs.items())
        },
    }
    outputs["manifest.json"] = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode("utf-8")
    return outputs, totals


def write(outputs, out, overwrite):
    """Writes `outputs` into OUT.tmp-*, then renames it to `out` (an existing `out` replaced only with overwrite)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = pathlib.Path(tempfile.mkdtemp(prefix=f"{out.name}.tmp-", dir=out.parent))
    try:
        for name, data in outputs.items():
            path = temporary / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        os.chmod(temporary, 0o755)
        if out.exists():
            if not overwrite:
                raise InputError(f"{out} exists (pass --overwrite to replace it)")
            old = pathlib.Path(tempfile.mkdtemp(prefix=f"{out.name}.old-", dir=out.parent))
            out.rename(old / out.name)
            temporary.rename(out)
            shutil.rmtree(old)
        else:
            temporary.rename(out)
    finally:
        if temporary.exists():
            shutil.rmtree(temporary)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the corpus folder to write")
    parser.add_argument("--mirrors", default="/work/.mirror", help="folder of owner+name/repo git directories")
    parser.add_argument("--heldout-hashes", default=str(HELDOUT_HASHES), help="SHA-256 of every held-out text")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out).absolute()
    start = time.monotonic()
    try:
        if out.exists() and not args.overwrite:
            raise InputError(f"{out} exists (pass --overwrite to replace it)")
        outputs, totals = build(args.mirrors, args.heldout_hashes)
        write(outputs, out, args.overwrite)
    except InputError as error:
        print(f"make_general_corpus: {error}", file=sys.stderr)
        return 2
    removed = ", ".join(f"{name} {totals[name]:,}" for name in FILTERS)
    print(
        f"{out}: {totals['kept']:,} texts ({totals['kept_train']:,} train, {totals['kept_heldout']:,} held out) from "
        f"{len(SOURCES)} sources; removed: {removed}; {time.monotonic() - start:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
