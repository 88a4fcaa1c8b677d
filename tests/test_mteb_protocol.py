"""MTEB's protocols (`training.inference.mteb_protocol`) and `concise-evaluate --encoder`'s refusals; the published
figures themselves are reproduced from the served all-MiniLM-L6-v2 export in test_hf_export."""

import shutil

import numpy as np
import pytest

from concise_attention.training.inference import mteb_protocol


def test_the_data_has_mtebs_row_counts_and_labels():
    stsb = mteb_protocol.read_split("STSBenchmark", "test")
    train = mteb_protocol.read_split("Banking77Classification", "train")
    test = mteb_protocol.read_split("Banking77Classification", "test")
    assert (len(stsb), len(train), len(test)) == (1379, 10003, 3080)
    assert np.mean([row["score"] for row in stsb]) == pytest.approx(2.607916606236405, abs=1e-12)  # MTEB's statistics
    assert sorted({row["label"] for row in test}) == list(range(77))
    assert {row["label"] for row in test if row["text"] == "I am still waiting on my card?"} <= {11}  # card_arrival


def test_a_tampered_data_file_is_named(tmp_path):
    folder = tmp_path / "mteb"
    shutil.copytree(mteb_protocol.DATA_DIR, folder)
    path = folder / "STSBenchmark" / "test.jsonl"
    path.write_bytes(path.read_bytes().replace(b"A girl", b"A boy", 1))
    with pytest.raises(ValueError, match=r"STSBenchmark/test.jsonl: SHA-256 .* differs from the manifest"):
        mteb_protocol.read_split("STSBenchmark", "test", folder)


def test_experiments_draw_8_texts_per_label_as_mteb_does():
    """MTEB shuffles the same index list again before each experiment, each time with RandomState(42)."""
    labels = [index % 5 for index in range(200)]
    experiments = mteb_protocol.undersampled(labels, experiments=3, per_label=8)
    order = np.arange(200)
    for rows in experiments:
        order = order[np.random.RandomState(42).permutation(200)]
        expected = [
            int(i) for i in order if np.sum(np.array(labels)[order[: list(order).index(i) + 1]] == labels[i]) <= 8
        ]
        assert rows == expected and len(rows) == 40
    assert experiments[0] != experiments[1]


def test_the_selection_protocol_reads_no_test_text_and_scores_banking77_on_undrawn_train_texts(monkeypatch):
    """--split dev: STSBenchmark's dev split (the STS Benchmark's 1,500 pairs) and Banking77's train texts that none
    of MTEB's experiments draws, its few-shot training rows drawn as on test."""
    dev = mteb_protocol.read_split("STSBenchmark", "dev")
    assert len(dev) == 1500 and dev[0]["sentence1"] == "A man with a hard hat is dancing."  # sts-dev.csv's first
    read, seen = mteb_protocol.read_split, []
    monkeypatch.setattr(
        mteb_protocol, "read_split", lambda task, split, data_dir=None: seen.append(split) or read(task, split)
    )
    embedded = []

    def embed(texts):
        embedded.append(list(texts))
        return np.stack([np.eye(77)[hash(text) % 77] + 1e-3 * len(text) for text in texts])

    mteb_protocol.evaluate(embed, split="dev")
    assert "test" not in seen
    train = read("Banking77Classification", "train")
    drawn = set().union(*mteb_protocol.undersampled([row["label"] for row in train]))
    assert embedded[3] == [row["text"] for index, row in enumerate(train) if index not in drawn]  # the dev texts
    assert 10003 - len(drawn) == len(embedded[3]) == 5387


def test_sts_is_spearman_of_cosines_and_classification_reads_its_labels():
    from scipy.stats import spearmanr

    rng = np.random.default_rng(0)
    vectors = {}

    def embed(texts):
        return np.stack([vectors.setdefault(text, rng.normal(size=8)) for text in texts])

    rows = [{"sentence1": f"a{i}", "sentence2": f"b{i}", "score": float(i % 6)} for i in range(50)]
    first, second = embed([f"a{i}" for i in range(50)]), embed([f"b{i}" for i in range(50)])
    cosine = [a @ b / np.linalg.norm(a) / np.linalg.norm(b) for a, b in zip(first, second)]
    assert mteb_protocol.sts(embed, rows) == pytest.approx(
        spearmanr(cosine, [row["score"] for row in rows])[0], abs=1e-12
    )
    train = [{"text": f"t{i}", "label": i % 3} for i in range(60)]
    vectors.update({f"t{i}": np.eye(8)[i % 3] for i in range(60)} | {f"q{i}": np.eye(8)[i % 3] for i in range(30)})
    assert mteb_protocol.classification(embed, train, [{"text": f"q{i}", "label": i % 3} for i in range(30)]) == 1.0


def test_the_pca_baseline_never_fits_on_an_evaluation_text(tmp_path):
    from concise_attention.cli.evaluate import draw_fit_texts

    stsb = mteb_protocol.read_split("STSBenchmark", "test")
    banking = mteb_protocol.read_split("Banking77Classification", "test")
    texts = [
        "A sentence of our own.",
        "  " + stsb[3]["sentence2"].upper() + " ",
        banking[7]["text"].replace(" ", "  \t"),
    ]
    for split in ("train", "heldout"):
        (tmp_path / split).mkdir()
        (tmp_path / split / "part.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert draw_fit_texts(str(tmp_path), 10) == ["A sentence of our own."]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--encoder", "x", "--teacher", "y"], "--teacher needs --fit-texts"),
        (["--run", "r", "--teacher", "y", "--fit-texts", "c"], "--teacher and --fit-texts go with --encoder"),
        (["--encoder", "x", "--data-dir", "d"], "--data-dir goes with --run"),
        (["--encoder", "x", "--fit-count", "0"], "--fit-count must be a positive integer. Received: 0"),
        (["--encoder", "x", "--pca-width", "-3"], "--pca-width must be positive integers. Received: -3"),
        (
            ["--encoder", "concise-minilm-d192", "--tasks", "SICK-R"],
            "--tasks SICK-R: known tasks are STSBenchmark, Banking77",
        ),
        (["--encoder", "no/such/folder"], "Not a directory: 'no/such/folder'"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(argv, message, capsys, tmp_path):
    from concise_attention.cli.evaluate import main

    output = tmp_path / "scores.json"
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--output", str(output)])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in error and len(error.strip().splitlines()) == 1, error
    assert not output.exists()
