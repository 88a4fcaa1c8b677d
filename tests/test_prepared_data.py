"""Prepared data (`concise-prepare-data`, `task.dataset: prepared`) and the JAX shard trainer.

The shards hold the corpus tokenised as Hugging Face's `tokenizers` tokenises it; the prepared
pipelines give the text pipelines' evaluation batches exactly; a resumed pipeline starts at
the batch it would have reached; the TensorFlow trainer and the TensorFlow-free JAX trainer
follow the same loss curve from the same weights; the JAX trainer resumes bit-identically.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from concise_attention.cli import train as train_cli
from concise_attention.training import files
from concise_attention.training.trainers import prepare_data
from concise_attention.training.trainers import shard_trainer
from concise_attention.training.data import shards
from concise_attention.training.data.packing import SAMPLE_CORPUS
from concise_attention.training.data.packing import read_lines
from concise_attention.training.data.pipeline import EVAL_EVERY
from concise_attention.training.data.pipeline import corpus_lines
from concise_attention.training.data.pipeline import language_model_dataset
from concise_attention.training.data.pipeline import masked_examples
from concise_attention.training.data.pipeline import masked_lm_dataset
from concise_attention.training.data.pipeline import prepared_dataset
from concise_attention.training.preprocessing.text import read_vocabulary
from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer
from concise_attention.training.run import configs
from concise_attention.training.run import runs
from tensorboard_logs import logged

ROOT = pathlib.Path(__file__).parent.parent
ROWS_PER_SHARD = 100


def _errors(capsys, main, argv, *expected):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and error.strip().count("\n") == 0 and "Traceback" not in error, error
    for text in expected:
        assert text in error, error


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """tiny_lm's sample corpus prepared twice into two folders (100 rows per shard)."""
    folders = [tmp_path_factory.mktemp("prepared") / "lm" for _ in range(2)]
    for folder in folders:
        assert (
            prepare_data.main(
                ["--config", "tiny_lm", "--out", str(folder), "--rows-per-shard", str(ROWS_PER_SHARD), "--quiet"]
            )
            == 0
        )
    return folders


@pytest.fixture(scope="module")
def prepared_mlm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prepared") / "mlm"
    assert (
        prepare_data.main(["--config", "tiny_bert_fixed", "--out", str(folder), "--rows-per-shard", "64", "--quiet"])
        == 0
    )
    return folder


@pytest.mark.slow  # the prepared-corpus fixtures take ~40 s
def test_prepare_is_deterministic_and_shards_are_numpy(prepared):
    first, second = prepared
    names = sorted(path.name for path in first.iterdir())
    assert names == sorted(path.name for path in second.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    manifest = json.loads((first / shards.MANIFEST).read_text())
    train = manifest["splits"]["train"]
    assert train["rows"] == sum(shard["rows"] for shard in train["shards"]) and len(train["shards"]) > 3
    assert all(shard["rows"] == ROWS_PER_SHARD for shard in train["shards"][:-1])
    rows = np.load(first / "train-00000.npy")  # numpy alone reads a shard
    assert rows.dtype == np.int32 and rows.shape == (ROWS_PER_SHARD, 3, 64)
    assert manifest["vocabulary_sha256"] == shards.vocabulary_sha256(read_vocabulary(first / "vocab.txt"))
    assert not [name for name in names if ".tmp" in name]


@pytest.mark.slow  # the prepared-corpus fixtures take ~40 s
def test_shards_hold_the_corpus_as_hugging_face_tokenizes_it(prepared):
    """The train rows' segments are the train lines' HF ids (cut into rows of 64), each once, in a shuffled order."""
    import tokenizers

    folder = prepared[0]
    reference = tokenizers.BertWordPieceTokenizer(str(folder / "vocab.txt"), lowercase=True)
    lines = [line for index, line in enumerate(read_lines(SAMPLE_CORPUS)) if index % EVAL_EVERY != 0]
    expected = [
        tuple(encoding.ids[start : start + 64])
        for encoding in reference.encode_batch(lines, add_special_tokens=False)
        for start in range(0, len(encoding.ids), 64)
    ]
    manifest = shards.read_manifest(folder)
    rows = np.concatenate(
        [shards.load_shard(folder, "train", index) for index in range(len(manifest["splits"]["train"]["shards"]))]
    )
    token_ids, segment_ids, positions = rows[:, 0], rows[:, 1], rows[:, 2]
    segments = [
        tuple(row_ids[row_segments == segment].tolist())
        for row_ids, row_segments in zip(token_ids, segment_ids)
        for segment in range(1, row_segments.max() + 1)
    ]
    assert sorted(segments) == sorted(expected)
    assert segments != expected  # stored in a seeded random order, not the corpus's
    assert np.all(token_ids[segment_ids == 0] == 0)
    # positions restart at 0 with each segment
    previous = np.concatenate([np.zeros_like(segment_ids[:, :1]), segment_ids[:, :-1]], axis=1)
    starts = (segment_ids > 0) & (previous != segment_ids)
    assert np.all(positions[starts] == 0) and np.all(positions[(segment_ids > 0) & ~starts] > 0)


@pytest.mark.slow  # the prepared-corpus fixtures take ~40 s
def test_prepare_writes_and_training_reads_through_tf_io_gfile(prepared):
    """A non-local tf.io.gfile filesystem (TF's in-memory ram://) holds the same bytes."""
    folder, remote = prepared[0], "ram://prepared_test/lm"
    argv = [
        "--config",
        "tiny_lm",
        "--out",
        remote,
        "--rows-per-shard",
        str(ROWS_PER_SHARD),
        "--quiet",
        "--set",
        f"tokenizer.vocabulary={folder}/vocab.txt",
    ]
    assert prepare_data.main(argv) == 0
    for path in folder.iterdir():
        if path.suffix in (".npy", ".json"):
            with tf.io.gfile.GFile(f"{remote}/{path.name}", "rb") as file:
                assert file.read() == path.read_bytes(), path.name
    reader = shards.ShardReader(remote, "train", tf.io.gfile.GFile, seed=1)
    np.testing.assert_array_equal(
        reader.batch(77, 8)["token_ids"], shards.ShardReader(folder, "train", seed=1).batch(77, 8)["token_ids"]
    )


def test_training_order_is_a_permutation_per_epoch():
    shard_rows = [100, 100, 37]
    total = sum(shard_rows)
    shard_ids, rows = shards.training_rows(seed=3, start=0, count=2 * total, shard_rows=shard_rows)
    pairs = list(zip(shard_ids.tolist(), rows.tolist()))
    every_row = {(shard, row) for shard, size in enumerate(shard_rows) for row in range(size)}
    assert set(pairs[:total]) == every_row == set(pairs[total:]) and len(set(pairs[:total])) == total
    assert pairs[:total] != pairs[total:]  # each epoch has its own order
    # any window is computed directly, equal to the same window of a longer read
    window = shards.training_rows(seed=3, start=total - 5, count=20, shard_rows=shard_rows)
    assert list(zip(*(part.tolist() for part in window))) == pairs[total - 5 : total + 15]
    other_seed = shards.training_rows(seed=4, start=0, count=total, shard_rows=shard_rows)
    assert list(zip(*(part.tolist() for part in other_seed))) != pairs[:total]


def _batches(dataset, count):
    return [tf.nest.map_structure(lambda tensor: tensor.numpy(), batch) for batch in dataset.take(count)]


def _assert_equal_batches(left, right):
    assert len(left) == len(right)
    for one, other in zip(left, right):
        tf.nest.map_structure(np.testing.assert_array_equal, one, other)


@pytest.mark.slow  # the prepared-corpus fixtures take ~40 s
def test_prepared_pipelines_give_the_text_pipelines_eval_batches_and_resume_directly(prepared, prepared_mlm):
    # causal_lm: the eval split read in stored order is the text pipeline's (unshuffled) batches
    folder = prepared[0]
    tokenizer = wordpiece_tokenizer(folder / "vocab.txt")
    eval_lines = corpus_lines("sample", None, "eval")
    text = _batches(language_model_dataset(eval_lines, tokenizer, 64, 8, training=False), 100)
    reader = shards.ShardReader(folder, "eval")
    _assert_equal_batches(_batches(prepared_dataset(reader, 8), 100), text)
    train = shards.ShardReader(folder, "train", seed=5)
    _assert_equal_batches(
        _batches(prepared_dataset(train, 8, skip_batches=140), 3), _batches(prepared_dataset(train, 8), 143)[140:]
    )
    # masked_lm: same rows and the same masks, keyed on (seed, batch index)
    tokenizer = wordpiece_tokenizer(prepared_mlm / "vocab.txt")
    text = _batches(masked_lm_dataset(eval_lines, tokenizer, 64, 4, 10, 0.15, training=False, seed=7), 100)
    mask = masked_examples(tokenizer, 64, 4, 10, 0.15, seed=7)
    _assert_equal_batches(_batches(prepared_dataset(shards.ShardReader(prepared_mlm, "eval"), 4, mask=mask), 100), text)
    train = shards.ShardReader(prepared_mlm, "train", seed=7)
    _assert_equal_batches(
        _batches(prepared_dataset(train, 4, skip_batches=90, mask=mask), 2),
        _batches(prepared_dataset(train, 4, mask=mask), 92)[90:],
    )


@pytest.mark.slow  # the prepared-corpus fixtures take ~40 s
def test_bad_prepared_data_is_one_line(prepared, tmp_path, capsys):
    folder = prepared[0]
    other_vocabulary = tmp_path / "other_vocab.txt"
    other_vocabulary.write_text("\n".join(read_vocabulary(folder / "vocab.txt")[:-1]) + "\n")
    prepared_run = [
        "--config",
        "tiny_lm",
        "--run-dir",
        str(tmp_path / "run"),
        "--set",
        "task.dataset=prepared",
        "--set",
        f"task.data_dir={folder}",
        "--set",
        f"tokenizer.vocabulary={folder}/vocab.txt",
    ]
    _errors(
        capsys,
        train_cli.main,
        prepared_run + ["--set", "training.sequence_length=32"],
        "sequence_length=64",
        "training.sequence_length=32",
        "manifest.json",
    )
    _errors(
        capsys,
        train_cli.main,
        prepared_run + ["--set", f"tokenizer.vocabulary={other_vocabulary}"],
        "another vocabulary",
        f"tokenizer.vocabulary={folder}/vocab.txt",
    )
    _errors(capsys, train_cli.main, prepared_run[:-2], "tokenizer.vocabulary=", "vocab.txt")
    _errors(capsys, train_cli.main, prepared_run[:-4] + ["--set", f"task.data_dir={tmp_path}"], "concise-prepare-data")
    _errors(
        capsys,
        train_cli.main,
        prepared_run[:-2] + ["--set", "tokenizer.lowercase=false", "--set", f"tokenizer.vocabulary={folder}/vocab.txt"],
        "lowercase",
    )
    _errors(
        capsys,
        prepare_data.main,
        [
            "--config",
            "tiny_lm",
            "--out",
            str(tmp_path / "out"),
            "--set",
            "task.dataset=text_files",
            "--set",
            f"task.data_dir={tmp_path / 'missing'}",
        ],
        "missing",
    )
    _errors(capsys, prepare_data.main, ["--config", "tiny_lm", "--out", str(folder)], "already prepared")
    # this process runs TensorFlow
    _errors(
        capsys,
        shard_trainer.main,
        ["--config", "tiny_lm", "--data", str(folder), "--run-dir", str(tmp_path / "jax")],
        "KERAS_BACKEND=jax",
    )
    assert (
        not (tmp_path / "out").exists()
        and not (tmp_path / "run" / "checkpoint").exists()
        and not (tmp_path / "jax").exists()
    )


JAX_RUNS = """
import json, os, sys
import numpy as np
from concise_attention.training.trainers import shard_trainer
data, root, init = sys.argv[1:4]
common = ["--config", "tiny_lm", "--data", data, "--quiet", "--set", "training.steps_per_epoch=10"]
def run(name, *overrides):
    argv = common + ["--run-dir", os.path.join(root, name)]
    for override in overrides:
        argv += ["--set", override]
    assert shard_trainer.main(argv) == 0
    return os.path.join(root, name, "checkpoint", "state.npz")
no_dropout = ("model.dropout=0", "model.attention_dropout=0", f"task.init={init}")
run("same_init", *no_dropout)
whole = run("whole", "training.train_steps=40")
run("resumed", "training.train_steps=20")
resumed = run("resumed", "training.train_steps=40")
try:
    shard_trainer.main(common + ["--run-dir", os.path.join(root, "bad"), "--set", "training.sequence_length=32"])
except SystemExit as exit_info:
    bad_exit = exit_info.code
with np.load(whole) as a, np.load(resumed) as b:
    differences = {name: float(np.max(np.abs(a[name] - b[name]))) for name in a.files if name != "history"}
history = json.loads(open(os.path.join(root, "same_init", "metrics.json")).read())["history"]
print("RESULT " + json.dumps({"tensorflow_imported": "tensorflow" in sys.modules, "differences": differences, "bad_exit": bad_exit,
                             "losses": [epoch["loss"] for epoch in history], "steps": [epoch["step"] for epoch in history]}))
"""


def _tensorboard_losses(logs_dir):
    losses = dict(logged(os.path.join(logs_dir, "train"), "epoch_loss"))
    return [losses[step] for step in sorted(losses)]


@pytest.mark.slow
def test_jax_shard_trainer_matches_the_tf_trainer_and_resumes_bit_identically(prepared, tmp_path):
    import keras

    folder = prepared[0]
    same_init = ["model.dropout=0", "model.attention_dropout=0", "training.steps_per_epoch=10"]
    config = configs.load_config("tiny_lm", same_init)
    init = runs.RunDirectory(tmp_path / "init")  # the one set of initial weights both trainers start from
    init.start(config.to_dict() | {"name": "init", "tokenizer": {"lowercase": True, "strip_accents": None}})
    keras.utils.set_random_seed(11)
    files.save_weights(config.build_model(), init.file(files.BACKBONE_WEIGHTS))
    init.write_vocabulary(read_vocabulary(folder / "vocab.txt"))
    environment = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    jax = subprocess.run(
        [sys.executable, "-c", JAX_RUNS, str(folder), str(tmp_path / "jax"), init.path],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert jax.returncode == 0, jax.stderr[-3000:]
    result = json.loads(next(line for line in jax.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT ") :])
    argv = [
        "--config",
        "tiny_lm",
        "--run-dir",
        str(tmp_path / "tf"),
        "--quiet",
        "--set",
        "task.dataset=prepared",
        "--set",
        f"task.data_dir={folder}",
        "--set",
        f"task.init={init.path}",
    ]
    assert train_cli.main(argv + [item for override in same_init for item in ("--set", override)]) == 0
    tf_losses = _tensorboard_losses(tmp_path / "tf" / "logs")
    print(f"epoch losses: jax {result['losses']}, tensorflow {tf_losses}")
    assert result["steps"] == [10, 20, 30, 40] and len(tf_losses) == 4
    np.testing.assert_allclose(result["losses"], tf_losses, rtol=0.02)
    assert tf_losses[-1] < tf_losses[0] - 0.5  # a curve that moves, not two flat lines
    assert not result["tensorflow_imported"]
    assert (
        result["bad_exit"] == 2
        and "training.sequence_length=32" in jax.stderr
        and not (tmp_path / "jax" / "bad").exists()
    )
    assert len(result["differences"]) > 20 and max(result["differences"].values()) == 0.0, result["differences"]


def test_the_shuffle_folder_of_a_killed_run_is_removed_by_the_next(tmp_path):
    """SIGKILL leaves a process no chance to clean up: the next prepare-data removes the shuffle folders whose
    owner has ended, keeps those of running processes, and its own goes when its block ends."""
    import signal

    from concise_attention.training.trainers.prepare_data import WORK_PREFIX
    from concise_attention.training.trainers.prepare_data import work_directory

    script = f"import os, sys, time; os.mkdir(os.path.join(sys.argv[1], '{WORK_PREFIX}%d-abc' % os.getpid())); print('ready', flush=True); time.sleep(60)"
    killed = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert killed.stdout.readline().strip() == "ready"
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    (tmp_path / f"{WORK_PREFIX}{killed.pid}-abc" / "3.bin").write_bytes(b"rows")
    alive = tmp_path / f"{WORK_PREFIX}{os.getpid()}-def"  # a running process's (this one's)
    alive.mkdir()
    with work_directory(str(tmp_path)) as work:
        assert sorted(path.name for path in tmp_path.iterdir()) == sorted([alive.name, os.path.basename(work)])
    assert [path.name for path in tmp_path.iterdir()] == [alive.name]
