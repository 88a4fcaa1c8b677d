"""MTEB's evaluation protocols on the package's copies of its tasks, for any `embed(texts) -> (N, D)` function.

    >>> from concise_attention.training.inference import mteb_protocol
    >>> mteb_protocol.evaluate(encoder.encode)   # {'STSBenchmark': 0.8203..., 'Banking77Classification': 0.8004...}

- STS (`STSBenchmark`, test split): Spearman correlation of the cosine similarity of each pair's embeddings with
  its gold score (MTEB's `cosine_spearman`).
- Classification (`Banking77Classification`): 10 experiments, each training scikit-learn's logistic regression
  (max_iter 100, random_state 42) on 8 training texts per label drawn as MTEB draws them (the training rows'
  indices shuffled again before each experiment by a fresh `numpy.random.RandomState(42)`, the first 8 of each
  label kept), on the raw embeddings; the test accuracy averaged (MTEB's `accuracy`).

`split="dev"` is the selection protocol, for choices (a checkpoint, an interpolation weight) that the test
splits must not make: STSBenchmark's dev split, and Banking77's experiments drawn from its train split as above,
scored on the train rows that no experiment drew. It reads no test text.

The data (`training/data/mteb`, built by `scripts/make_mteb_data.py` from public copies; sources, commits,
licences in its `manifest.json`) is checked against the manifest's SHA-256 before it is read. Scores are
fractions (MTEB's leaderboard shows them times 100).
"""

import functools
import hashlib
import json
import pathlib

import numpy as np

DATA_DIR = pathlib.Path(__file__).resolve().parents[1] / "data" / "mteb"
# The held-out evaluation texts of the project's own checks, known by `text_hash` only (no text is shipped).
HELDOUT_HASHES = pathlib.Path(__file__).resolve().parents[1] / "data" / "heldout-text-sha256.txt"
TASKS = ("STSBenchmark", "Banking77Classification")
SPLITS = ("test", "dev")
SEED = 42
EXPERIMENTS = 10
SAMPLES_PER_LABEL = 8
MAX_ITER = 100


def read_split(task, split, data_dir=None):
    """The rows of `task`'s `split` (dicts), after its file's SHA-256 is checked against the manifest's."""
    folder = pathlib.Path(data_dir or DATA_DIR)
    name = f"{task}/{split}.jsonl"
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    if name not in manifest["files"]:
        raise ValueError(f"{folder / 'manifest.json'}: no {name} (known: {', '.join(sorted(manifest['files']))})")
    data = (folder / name).read_bytes()
    digest, expected = hashlib.sha256(data).hexdigest(), manifest["files"][name]["sha256"]
    if digest != expected:
        raise ValueError(f"{folder / name}: SHA-256 {digest} differs from the manifest's {expected}")
    return [json.loads(line) for line in data.decode("utf-8").splitlines()]


def evaluation_texts(data_dir=None):
    """Every text of every evaluation split (what no training or fitting may read)."""
    rows = read_split("STSBenchmark", "test", data_dir)
    return (
        [row["sentence1"] for row in rows]
        + [row["sentence2"] for row in rows]
        + [row["text"] for row in read_split("Banking77Classification", "test", data_dir)]
    )


def cosines(first, second):
    first = np.asarray(first, np.float64)
    second = np.asarray(second, np.float64)
    norms = np.maximum(np.linalg.norm(first, axis=1) * np.linalg.norm(second, axis=1), 1e-12)
    return np.sum(first * second, axis=1) / norms


def sts(embed, rows):
    """MTEB's cosine_spearman of `embed` on STS rows ({sentence1, sentence2, score})."""
    from scipy.stats import spearmanr  # SciPy, scikit-learn: imported only to evaluate

    first = embed([row["sentence1"] for row in rows])
    second = embed([row["sentence2"] for row in rows])
    return float(spearmanr(cosines(first, second), [row["score"] for row in rows])[0])


def undersampled(labels, experiments=EXPERIMENTS, per_label=SAMPLES_PER_LABEL, seed=SEED):
    """The training rows of each experiment, as MTEB's classification task draws them: one index list each."""
    order, chosen = list(range(len(labels))), []
    for _ in range(experiments):
        np.random.RandomState(seed).shuffle(order)  # the previous experiment's order, shuffled again
        counts, rows = {}, []
        for index in order:
            if counts.get(labels[index], 0) < per_label:
                rows.append(index)
                counts[labels[index]] = counts.get(labels[index], 0) + 1
        chosen.append(rows)
    return chosen


def classification(embed, train_rows, test_rows):
    """MTEB's mean test accuracy of `embed` on a classification task ({text, label} rows)."""
    from sklearn.linear_model import LogisticRegression  # scikit-learn: imported only to evaluate

    labels = [row["label"] for row in train_rows]
    experiments = undersampled(labels)
    union = sorted(set().union(*experiments))
    position = {index: place for place, index in enumerate(union)}
    train_embeddings = np.asarray(embed([train_rows[index]["text"] for index in union]))
    test_embeddings = np.asarray(embed([row["text"] for row in test_rows]))
    test_labels = np.array([row["label"] for row in test_rows])
    accuracies = []
    for rows in experiments:
        model = LogisticRegression(max_iter=MAX_ITER, random_state=SEED)
        model.fit(train_embeddings[[position[index] for index in rows]], [labels[index] for index in rows])
        accuracies.append(float(np.mean(model.predict(test_embeddings) == test_labels)))
    return float(np.mean(accuracies))


def undrawn(train_rows):
    """The rows of `train_rows` that none of MTEB's experiments draws: the selection protocol's test rows."""
    drawn = set().union(*undersampled([row["label"] for row in train_rows]))
    return [row for index, row in enumerate(train_rows) if index not in drawn]


def check_tasks(tasks):
    """Refuses a task name this module does not score (one ValueError naming it)."""
    unknown = [task for task in tasks if task not in TASKS]
    if unknown:
        raise ValueError(f"--tasks {unknown[0]}: known tasks are {', '.join(TASKS)}")


def evaluate(embed, tasks=TASKS, data_dir=None, split="test"):
    """{task: MTEB's main score} of `embed` (texts -> (N, D) array) on each of `tasks`, on `split` (test, or dev:
    the selection protocol)."""
    check_tasks(tasks)
    if split not in SPLITS:
        raise ValueError(f"--split {split}: known splits are {', '.join(SPLITS)}")
    scores = {}
    for task in tasks:
        if task == "STSBenchmark":
            scores[task] = sts(embed, read_split(task, split, data_dir))
        else:
            train = read_split(task, "train", data_dir)
            scores[task] = classification(
                embed, train, read_split(task, "test", data_dir) if split == "test" else undrawn(train)
            )
    return scores


def text_hash(text):
    """The hash evaluation texts are known by: SHA-256 of the text lower-cased, whitespace runs one space, ends stripped."""
    return hashlib.sha256(" ".join(text.lower().split()).encode("utf-8")).hexdigest()


@functools.lru_cache(maxsize=1)
def excluded_hashes():
    """The `text_hash` of every text no training may read: the evaluation splits here and HELDOUT_HASHES."""
    lines = HELDOUT_HASHES.read_text(encoding="ascii").splitlines()
    return frozenset(line for line in lines if line and not line.startswith("#")) | {
        text_hash(text) for text in evaluation_texts()
    }


def table(rows, tasks, teacher=None):
    """A Markdown table of `rows` ({name: {width, task scores, mean}}), each mean also as a share of `teacher`'s."""
    lines = [
        "| encoder | width | " + " | ".join(tasks) + " | mean | share of teacher |",
        "|---|" + "---:|" * (len(tasks) + 3),
    ]
    for name, row in rows.items():
        share = f"{row['mean'] / rows[teacher]['mean']:.1%}" if teacher in rows else ""
        lines.append(
            f"| {name} | {row['width']} | "
            + " | ".join(f"{row[task]:.4f}" for task in tasks)
            + f" | {row['mean']:.4f} | {share} |"
        )
    return "\n".join(lines)


def with_mean(scores):
    """`scores` ({task: score}) with their "mean" added, the figure every table reports beside them."""
    return {**scores, "mean": float(np.mean(list(scores.values())))}


def score_rows(encoders, tasks=TASKS, data_dir=None, report=print, split="test"):
    """{encoder name: {width, each task's score, mean}} of `encoders` (each with name, width, encode) on `split`."""
    rows = {}
    for encoder in encoders:
        scores = evaluate(encoder.encode, tasks, data_dir, split)
        rows[encoder.name] = {"width": encoder.width, **with_mean(scores)}
        report(f"{encoder.name}: " + ", ".join(f"{task} {score:.4f}" for task, score in scores.items()))
    return rows
