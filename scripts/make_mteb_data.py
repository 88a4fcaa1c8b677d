"""Builds the MTEB-protocol evaluation data from its public copies on GitHub (no registry ships it).

    python scripts/make_mteb_data.py --stsb-repo STSB_GIT_DIR --banking-repo BANKING_GIT_DIR [--out DIR]

STSB_GIT_DIR is a clone (or bare git directory) of github.com/PhilipMay/stsb-multi-mt, BANKING_GIT_DIR one of
github.com/PolyAI-LDN/task-specific-datasets. Each file is read at the pinned commit below with `git show`, checked
against its pinned SHA-256, parsed with Python's csv module, and checked against MTEB's published statistics of
the same task (the `descriptive_stats` files of the `mteb` package: row counts, total characters, mean score,
label counts). Written, one JSON object a line, into OUT (default: the package's `training/data/mteb`):

    STSBenchmark/test.jsonl              {"sentence1", "sentence2", "score"}  (score 0-5)
    STSBenchmark/dev.jsonl               the same, STS Benchmark's dev split (for choices, never a reported score)
    Banking77Classification/train.jsonl  {"text", "label"}  (label: its category's index in case-blind alphabetical order, MTEB's ids)
    Banking77Classification/test.jsonl
    manifest.json                        per file: source repository, commit, path, licence, its SHA-256, rows

Nothing is written unless every check passes; the same commits give byte-identical files.
"""

import argparse
import csv
import hashlib
import io
import json
import pathlib
import subprocess
import sys

OUT = pathlib.Path(__file__).resolve().parents[1] / "training" / "data" / "mteb"

STSB = {
    "repository": "https://github.com/PhilipMay/stsb-multi-mt",
    "commit": "30de0dec4ee199b7f42351d3f1a0b19592955385",
    "licence": "scores CC BY-SA 4.0 (STS Benchmark, Cer et al. 2017); texts keep their sources' terms",
}
BANKING = {
    "repository": "https://github.com/PolyAI-LDN/task-specific-datasets",
    "commit": "57ec275d8078af65b7731c2a98be812d844a6d6b",
    "licence": "CC BY 4.0 (Casanueva et al. 2020)",
}
SOURCE_SHA256 = {
    "data/stsb-en-test.csv": "11523b625219e94e9ca05d2816b5f02cac1614c5894fe657376fa0806378d053",
    "data/stsb-en-dev.csv": "d29586e96558c4eb52cf5ea5d14e9c24d3bf0e44f111b017caba43a5adc33226",
    "banking_data/train.csv": "b06e26ac675513959a63135f11b94ea7786ed02da65db93a5650d8838cbc664b",
    "banking_data/test.csv": "d12d6e3bc4c3103966ae786dc435913c0c563dfa328f5a3646d0e62cfeeb474d",
    "banking_data/categories.json": "53261da888122daf2d120d925458631d9619e15d82e56052e7a42e535ce32b63",
}
# MTEB's statistics of the same splits (mteb 2.26 descriptive_stats: STS/STSBenchmark.json,
# Classification/Banking77Classification.json), required equal; its character totals are recorded beside ours:
# the public STSBenchmark copy has 7 and 6 fewer characters in its two columns (whitespace, which no tokenizer sees).
# The dev split, which MTEB does not score, is checked against the STS Benchmark's published size (Cer et al. 2017).
MTEB_STATISTICS = {
    "STSBenchmark/test": {"rows": 1379, "mean_score": 2.607916606236405},
    "STSBenchmark/dev": {"rows": 1500},
    "Banking77Classification/train": {"rows": 10003, "characters": (594916,), "labels": 77},
    "Banking77Classification/test": {"rows": 3080, "characters": (167036,), "labels": 77},
}
MTEB_CHARACTERS = {
    "STSBenchmark/test": (74107, 73779),
    "Banking77Classification/train": (594916,),
    "Banking77Classification/test": (167036,),
}


def git_show(repository, commit, path):
    """The bytes of `path` at `commit` of the git directory `repository`; a missing one is one ValueError."""
    result = subprocess.run(
        [
            "git",
            "--git-dir" if pathlib.Path(repository, "HEAD").is_file() else "-C",
            repository,
            "show",
            f"{commit}:{path}",
        ],
        capture_output=True,
    )
    if result.returncode:
        raise ValueError(f"{repository}: cannot read {path} at commit {commit}: {result.stderr.decode().strip()}")
    return result.stdout


def read_source(repository, spec, path, digests):
    data = git_show(repository, spec["commit"], path)
    digest = hashlib.sha256(data).hexdigest()
    if SOURCE_SHA256[path] != digest:
        raise ValueError(f"{repository}: {path} has SHA-256 {digest}, expected {SOURCE_SHA256[path]}")
    digests[path] = digest
    return data.decode("utf-8")


def stsb_rows(repository, split, digests):
    rows = []
    for sentence1, sentence2, score in csv.reader(
        io.StringIO(read_source(repository, STSB, f"data/stsb-en-{split}.csv", digests))
    ):
        rows.append({"sentence1": sentence1, "sentence2": sentence2, "score": float(score)})
    return rows


def banking_rows(repository, split, digests):
    categories = json.loads(read_source(repository, BANKING, "banking_data/categories.json", digests))
    index = {name: position for position, name in enumerate(sorted(categories, key=str.lower))}  # MTEB's ids
    reader = csv.DictReader(io.StringIO(read_source(repository, BANKING, f"banking_data/{split}.csv", digests)))
    return [{"text": row["text"], "label": index[row["category"]]} for row in reader]


def characters(rows):
    columns = ("sentence1", "sentence2") if "score" in rows[0] else ("text",)
    return tuple(sum(len(row[column]) for row in rows) for column in columns)


def check(name, rows):
    """Each split's rows against MTEB's statistics of it: a difference is one ValueError naming the figure."""
    expected = MTEB_STATISTICS[name]
    found = {"rows": len(rows), "characters": characters(rows)}
    if "mean_score" in expected:
        found["mean_score"] = sum(row["score"] for row in rows) / len(rows)
    if "labels" in expected:
        found["labels"] = len({row["label"] for row in rows})
    for key, value in expected.items():
        same = abs(found[key] - value) < 1e-9 if isinstance(value, float) else found[key] == value
        if not same:
            raise ValueError(f"{name}: {key} {found[key]} differs from MTEB's published {value}")


def jsonl(rows):
    return "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows).encode("utf-8")


def build(stsb_repository, banking_repository):
    """{relative file name: bytes} of every output, manifest.json included, after every check."""
    digests = {}
    splits = {
        f"STSBenchmark/{split}": (stsb_rows(stsb_repository, split, digests), STSB, [f"data/stsb-en-{split}.csv"])
        for split in ("test", "dev")
    }
    for split in ("train", "test"):
        splits[f"Banking77Classification/{split}"] = (
            banking_rows(banking_repository, split, digests),
            BANKING,
            [f"banking_data/{split}.csv", "banking_data/categories.json"],
        )
    outputs, manifest = {}, {"built_by": "scripts/make_mteb_data.py", "files": {}}
    for name, (rows, spec, sources) in splits.items():
        check(name, rows)
        outputs[f"{name}.jsonl"] = jsonl(rows)
        manifest["files"][f"{name}.jsonl"] = {
            **spec,
            "sources": {path: digests[path] for path in sources},
            "rows": len(rows),
            "characters": characters(rows),
            **({"mteb_characters": MTEB_CHARACTERS[name]} if name in MTEB_CHARACTERS else {}),
            "sha256": hashlib.sha256(outputs[f"{name}.jsonl"]).hexdigest(),
        }
    outputs["manifest.json"] = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode("utf-8")
    return outputs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stsb-repo", required=True, help="a git clone of PhilipMay/stsb-multi-mt")
    parser.add_argument("--banking-repo", required=True, help="a git clone of PolyAI-LDN/task-specific-datasets")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    try:
        outputs = build(args.stsb_repo, args.banking_repo)
    except ValueError as error:
        print(f"make_mteb_data: {error}", file=sys.stderr)
        return 2
    for name, data in outputs.items():
        path = pathlib.Path(args.out, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_bytes(data)
        temporary.replace(path)
        print(f"{path}: {len(data):,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
