"""Bit-identical training with dropout on: a run killed (SIGKILL) at random moments and
right after a checkpoint commit, or stopped by SIGTERM inside an epoch, or restarted from a corrupt
checkpoint, ends with the uninterrupted run's weights, dropout seed states, optimizer state and metrics;
train_steps is honoured exactly when steps_per_epoch does not divide it."""

import json
import random
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import tensorflow as tf

from concise_attention.cli import train as cli
from concise_attention.training.trainers.trainer import train
from concise_attention.training.data.packing import SAMPLE_CORPUS
from concise_attention.training.data.packing import read_lines
from concise_attention.training.preprocessing.tokenizer import train_wordpiece
from concise_attention.training.run import configs
from tensorboard_logs import logged

DROPOUT = ["model.dropout=0.1", "model.attention_dropout=0.1", "training.jit_compile=false"]
# 28 = 2 epochs of 10 steps + a last epoch of 8, in executions of 2 steps: a SIGTERM lands inside
# an epoch, and resumes cross the shorter last epoch. Only the last 2 checkpoints are kept.
STEPS = [
    "training.train_steps=28",
    "training.steps_per_epoch=10",
    "training.steps_per_execution=2",
    "training.warmup_steps=5",
    "training.eval_batches=1",
    "training.keep_checkpoints=2",
]
ITERATIONS = "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"


def _h5_arrays(path):
    arrays = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: arrays.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None)
    assert arrays
    return arrays


def _checkpoint_arrays(run_dir):
    """Every variable of the run's newest checkpoint (weights, optimizer, seed states, data position),
    but its save counter (how many saves this run made: a SIGTERM save is one more)."""
    reader = tf.train.load_checkpoint(str(run_dir / "checkpoint"))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if name not in ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    }


def _max_difference(first, second):
    assert first.keys() == second.keys()
    differences = {
        name: float(np.max(np.abs(first[name].astype(np.float64) - second[name].astype(np.float64)), initial=0.0))
        for name in first
    }
    worst = max(differences, key=differences.get)
    assert differences[worst] == 0.0, (worst, differences[worst])
    return differences[worst]


def _assert_same_run(run_dir, reference_dir):
    """The final weights and the newest checkpoint (dropout seed states included) are bit-identical."""
    assert (
        _max_difference(_h5_arrays(run_dir / "model.weights.h5"), _h5_arrays(reference_dir / "model.weights.h5")) == 0.0
    )
    mine, theirs = _checkpoint_arrays(run_dir), _checkpoint_arrays(reference_dir)
    assert any(name.startswith("dropout_seed_states/") for name in mine)
    assert _max_difference(mine, theirs) == 0.0


def _step_of(run_dir):
    """The step of the newest committed checkpoint, read from its optimizer's counter."""
    return int(tf.train.load_checkpoint(str(run_dir / "checkpoint")).get_tensor(ITERATIONS))


def _pointer(run_dir):
    """The checkpoint pointer file's text (changes when a checkpoint commits)."""
    path = run_dir / "checkpoint" / "checkpoint"
    return path.read_text() if path.is_file() else ""


def _training_started(run_dir, before):
    """Whether a new TensorBoard training log appeared (a fit call began) since `before` were listed."""
    return lambda: len(list((run_dir / "logs" / "train").glob("events.out.tfevents.*"))) > before


def _start(config, run_dir, overrides):
    command = [
        sys.executable,
        "-m",
        "concise_attention.cli.train",
        "--config",
        config,
        "--run-dir",
        str(run_dir),
        "--quiet",
    ]
    for override in overrides:
        command += ["--set", override]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for(process, ready):
    deadline = time.time() + 300
    while not ready() and process.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    return ready()


def _kill(process):
    """SIGKILL: no chance to clean up. True if it was still running."""
    running = process.poll() is None
    process.send_signal(signal.SIGKILL)
    process.wait()
    return running


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory):
    """One WordPiece vocabulary for every run here (training it is most of a tiny run's time)."""
    return train_wordpiece(read_lines(SAMPLE_CORPUS), 1000, tmp_path_factory.mktemp("vocab") / "vocab.txt")


def _overrides(vocabulary):
    return [*DROPOUT, *STEPS, f"tokenizer.vocabulary={vocabulary}"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, vocabulary):
    """The uninterrupted run of a config, trained once for every test here: (metrics, run directory)."""
    runs = {}

    def get(config):
        if config not in runs:
            run_dir = tmp_path_factory.mktemp(f"straight-{config}")
            runs[config] = train(configs.load_config(config, _overrides(vocabulary)), run_dir, verbose=0), run_dir
        return runs[config]

    return get


@pytest.mark.slow
def test_killed_three_times_ends_bit_identical_with_dropout(tmp_path, vocabulary, reference):
    """SIGKILL at two seeded random moments of training and once right after a checkpoint commit,
    restarted each time: the uninterrupted run's weights, checkpoint and metrics, bit for bit. The same
    command twice gives the same weights too: the killed run began in other processes than the reference
    (initialisation, data order, dropout seeds included), so any difference between two runs shows here.
    The masked LM: its masks are drawn per batch, so a resumed run must redraw those it would have drawn
    (the causal LM resumes the same way in the SIGTERM and unreadable-checkpoint tests below)."""
    config = "tiny_bert_fixed"
    run_dir, overrides = tmp_path / "killed", _overrides(vocabulary)
    rng = random.Random(f"kill-{config}")
    for kill in ("random", "after commit", "random"):
        before, logs = _pointer(run_dir), len(list((run_dir / "logs" / "train").glob("events.out.tfevents.*")))
        process = _start(config, run_dir, overrides)
        if kill == "after commit":
            assert _wait_for(process, lambda: _pointer(run_dir) != before), process.stderr.read()[-4000:]
        else:
            assert _wait_for(process, _training_started(run_dir, logs)), process.stderr.read()[-4000:]
            time.sleep(rng.uniform(0.0, 1.5))  # from the start of its first fit call: tracing, steps, validation
        assert _kill(process), f"the run ended before the {kill} kill"
    assert 0 < _step_of(run_dir) < 28
    metrics, reference_dir = reference(config)
    assert train(configs.load_config(config, overrides), run_dir, verbose=0) == metrics
    assert metrics["step"] == 28
    _assert_same_run(run_dir, reference_dir)
    # training.keep_checkpoints=2: of the checkpoints at steps 10, 20 and 28 the last two are kept.
    for directory in (reference_dir, run_dir):
        assert sorted(path.name for path in (directory / "checkpoint").glob("*.index")) == [
            "ckpt-20.index",
            "ckpt-28.index",
        ]


@pytest.mark.slow
def test_sigterm_inside_an_epoch_saves_that_step_exits_75_and_resumes_exactly(tmp_path, vocabulary, reference):
    run_dir, overrides = tmp_path / "preempted", _overrides(vocabulary)
    process = _start("tiny_lm", run_dir, overrides)
    assert _wait_for(process, _training_started(run_dir, 0)), process.stderr.read()[-4000:]
    process.send_signal(signal.SIGTERM)  # during the first execution: saved at its end, step 2
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 75, stderr[-4000:]
    step = _step_of(run_dir)
    assert 0 < step < 28 and step % 10 != 0, step  # inside an epoch
    assert f"saved a checkpoint at step {step}" in stderr and "Traceback" not in stderr
    reader = tf.train.load_checkpoint(str(run_dir / "checkpoint"))
    assert reader.get_tensor("data_position/.ATTRIBUTES/VARIABLE_VALUE") == step
    assert tf.train.latest_checkpoint(str(run_dir / "checkpoint")).endswith(f"ckpt-{step}")

    metrics, reference_dir = reference("tiny_lm")
    resumed = train(configs.load_config("tiny_lm", overrides), run_dir, verbose=0)
    assert resumed == metrics and resumed["step"] == 28  # the optimizer's iterations: no step lost or repeated
    _assert_same_run(run_dir, reference_dir)
    # The epoch the SIGTERM cut is logged again as the same epoch (its last 10 - step steps), not as a new one.
    epochs = [step for step, _ in logged(run_dir / "logs" / "validation", "epoch_loss")]
    assert sorted(set(epochs)) == [0, 1, 2] and epochs.count(0) == 1


@pytest.mark.slow
def test_an_unreadable_newest_checkpoint_falls_back_to_the_previous_one(
    tmp_path, vocabulary, reference, caplog, capsys
):
    metrics, reference_dir = reference("tiny_lm")
    run_dir = tmp_path / "run"
    shutil.copytree(reference_dir, run_dir)
    newest = run_dir / "checkpoint" / "ckpt-28.data-00000-of-00001"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    with caplog.at_level("WARNING", logger="concise_attention.training.run.checkpoints"):
        assert train(configs.load_config("tiny_lm", _overrides(vocabulary)), run_dir, verbose=0) == metrics
    fallbacks = [record.getMessage() for record in caplog.records if "cannot be read" in record.getMessage()]
    assert len(fallbacks) == 1 and str(run_dir / "checkpoint" / "ckpt-28") in fallbacks[0]
    _assert_same_run(run_dir, reference_dir)  # resumed from step 20 and retrained 20..28

    # None readable (a truncated data file, a truncated index): one line naming the directory, exit 2.
    for path in (newest, run_dir / "checkpoint" / "ckpt-20.index"):
        path.write_bytes(path.read_bytes()[:40])
    argv = ["--config", "tiny_lm", "--run-dir", str(run_dir), "--quiet"]
    for override in _overrides(vocabulary):
        argv += ["--set", override]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in error, error
    assert f"No readable checkpoint in {run_dir / 'checkpoint'}" in error.strip().splitlines()[-1], error


@pytest.mark.slow
def test_fine_tuning_killed_after_a_checkpoint_ends_bit_identical(tmp_path, vocabulary):
    """classification on the shipped WordNet topics, a tiny BERT, dropout on."""
    overrides = [
        "model_type=bert",
        "model.vocab_size=1000",
        "model.hidden_size=32",
        "model.num_layers=2",
        "model.num_heads=4",
        "model.intermediate_size=64",
        "model.max_sequence_length=64",
        "model.dropout=0.1",
        "model.attention_dropout=0.1",
        "training.sequence_length=32",
        "training.batch_size=8",
        "training.train_epochs=null",
        "training.train_steps=12",
        "training.steps_per_epoch=5",
        "training.steps_per_execution=1",
        "training.warmup_fraction=null",
        "training.warmup_steps=2",
        "training.jit_compile=false",
        f"tokenizer.vocabulary={vocabulary}",
    ]
    # Every run in a fresh process (as a user runs them): the comparison is then between processes
    # that started alike, not between a fresh one and this test process, which ran other tests.
    process = _start("wordnet_topics", tmp_path / "killed", overrides)
    assert _wait_for(process, lambda: _pointer(tmp_path / "killed") != ""), process.stderr.read()[-4000:]
    assert _kill(process)
    assert 0 < _step_of(tmp_path / "killed") < 12
    for run_dir in (tmp_path / "killed", tmp_path / "straight"):
        process = _start("wordnet_topics", run_dir, overrides)
        assert process.wait(timeout=600) == 0, process.stderr.read()[-4000:]
    metrics = [
        json.loads((run_dir / "metrics.json").read_text()) for run_dir in (tmp_path / "killed", tmp_path / "straight")
    ]
    assert metrics[0] == metrics[1] and metrics[0]["step"] == 12
    _assert_same_run(tmp_path / "killed", tmp_path / "straight")


@pytest.mark.slow
def test_train_steps_not_a_multiple_of_steps_per_epoch_are_honoured(tmp_path, vocabulary):
    overrides = [
        f"tokenizer.vocabulary={vocabulary}",
        "training.train_steps=7",
        "training.steps_per_epoch=5",
        "training.steps_per_execution=5",
        "training.warmup_steps=2",
        "training.eval_batches=1",
    ]
    metrics = train(configs.load_config("tiny_lm", overrides), tmp_path / "run", verbose=0)
    assert metrics["step"] == 7 and _step_of(tmp_path / "run") == 7
    # 4 steps per execution do not divide 2 steps per epoch: each epoch still stops at its step.
    with pytest.warns(UserWarning, match="steps_per_execution=4 does not divide training.steps_per_epoch=2"):
        metrics = train(
            configs.load_config(
                "tiny_lm",
                [
                    f"tokenizer.vocabulary={vocabulary}",
                    "training.train_steps=3",
                    "training.steps_per_epoch=2",
                    "training.steps_per_execution=4",
                    "training.warmup_steps=1",
                    "training.eval_batches=1",
                ],
            ),
            tmp_path / "run2",
            verbose=0,
        )
    assert metrics["step"] == 3 and _step_of(tmp_path / "run2") == 3
