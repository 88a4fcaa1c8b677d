"""Bit-identical training with dropout on: two runs agree, a killed and resumed run agrees with an
uninterrupted one (dropout seed states and masks in the checkpoint / keyed on the batch), and
train_steps is honoured exactly when steps_per_epoch does not divide it."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

import configs
from training.data import SAMPLE_CORPUS
from training.data import read_lines
from training.tokenizer import train_wordpiece
from training.trainer import train

DROPOUT = ["model.dropout=0.1", "model.attention_dropout=0.1", "training.jit_compile=false"]
# 28 = 5 epochs of 5 steps + a last epoch of 3: resumes cross the shorter epoch too.
STEPS = ["training.train_steps=28", "training.steps_per_epoch=5", "training.steps_per_execution=5",
         "training.warmup_steps=5", "training.eval_batches=1"]


def _arrays(path):
    """Every dataset of an .h5 file (weights, and optimizer state where saved), by name."""
    arrays = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: arrays.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None)
    assert arrays
    return arrays


def _max_difference(first, second):
    a, b = _arrays(first), _arrays(second)
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[name].astype(np.float64) - b[name].astype(np.float64)), initial=0.0)) for name in a)


def _cli(config, run_dir, overrides):
    command = [sys.executable, "-m", "training.cli", "--config", config, "--run-dir", str(run_dir), "--quiet"]
    for override in overrides:
        command += ["--set", override]
    return command


def _step_of(checkpoint):
    with h5py.File(checkpoint, "r") as f:  # the optimizer's step counter is saved with the weights
        return int(f["optimizer"]["vars"]["0"][()])


def _kill_when(process, ready, delay):
    """SIGKILLs `process` `delay` seconds after `ready()` holds; True if it was still running."""
    deadline = time.time() + 300
    while not ready() and process.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert ready(), "no (new) checkpoint was written"
    time.sleep(delay)
    running = process.poll() is None
    process.send_signal(signal.SIGKILL)  # no chance to clean up
    process.wait()
    return running


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory):
    """One WordPiece vocabulary for every run here (training it is most of a tiny run's time)."""
    return train_wordpiece(read_lines(SAMPLE_CORPUS), 1000, tmp_path_factory.mktemp("vocab") / "vocab.txt")


@pytest.mark.slow
@pytest.mark.parametrize("config", ["tiny_lm", "tiny_bert_fixed"])
def test_two_runs_and_a_twice_killed_run_end_bit_identical_with_dropout(tmp_path, config, vocabulary):
    """Two uninterrupted runs agree; a run killed at a random moment after its first checkpoint,
    restarted, killed right after a checkpoint's rename and restarted to the end agrees too:
    every array of the weights (and of the last checkpoint) and every metric."""
    overrides = [*DROPOUT, *STEPS, f"tokenizer.vocabulary={vocabulary}"]
    reference = train(configs.load_config(config, overrides), tmp_path / "straight", verbose=0)
    again = train(configs.load_config(config, overrides), tmp_path / "again", verbose=0)
    assert again == reference and reference["step"] == 28
    for name in ("model.weights.h5", "checkpoint/model.weights.h5"):
        assert _max_difference(tmp_path / "straight" / name, tmp_path / "again" / name) == 0.0, name

    checkpoint = tmp_path / "killed" / "checkpoint" / "model.weights.h5"
    first = subprocess.Popen(_cli(config, tmp_path / "killed", overrides), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert _kill_when(first, checkpoint.is_file, random.uniform(0.0, 0.5)), "the run ended before the random kill"
    first_step = _step_of(checkpoint)
    assert first_step < 28
    inode = os.stat(checkpoint).st_ino
    second = subprocess.Popen(_cli(config, tmp_path / "killed", overrides), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # The rename replaces the file: a new inode is a new checkpoint.
    assert _kill_when(second, lambda: os.stat(checkpoint).st_ino != inode, 0.0)
    assert first_step < _step_of(checkpoint) < 28

    result = subprocess.run(_cli(config, tmp_path / "killed", overrides), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    resumed = json.loads(result.stdout[result.stdout.index("{"):])
    assert resumed == reference
    for name in ("model.weights.h5", "checkpoint/model.weights.h5"):
        assert _max_difference(tmp_path / "straight" / name, tmp_path / "killed" / name) == 0.0, name


@pytest.mark.slow
def test_train_steps_not_a_multiple_of_steps_per_epoch_are_honoured(tmp_path, vocabulary):
    overrides = [f"tokenizer.vocabulary={vocabulary}", "training.train_steps=7", "training.steps_per_epoch=5", "training.steps_per_execution=5",
                 "training.warmup_steps=2", "training.eval_batches=1"]
    metrics = train(configs.load_config("tiny_lm", overrides), tmp_path / "run", verbose=0)
    assert metrics["step"] == 7 and _step_of(tmp_path / "run" / "checkpoint" / "model.weights.h5") == 7
    # 4 steps per execution do not divide 2 steps per epoch: each epoch still stops at its step.
    with pytest.warns(UserWarning, match="steps_per_execution=4 does not divide training.steps_per_epoch=2"):
        metrics = train(configs.load_config("tiny_lm", [f"tokenizer.vocabulary={vocabulary}", "training.train_steps=3", "training.steps_per_epoch=2",
                                                        "training.steps_per_execution=4", "training.warmup_steps=1",
                                                        "training.eval_batches=1"]), tmp_path / "run2", verbose=0)
    assert metrics["step"] == 3 and _step_of(tmp_path / "run2" / "checkpoint" / "model.weights.h5") == 3
