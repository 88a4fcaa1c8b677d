"""training.run.checkpoints: what a checkpoint holds (dropout seed states included), the older format refused,
SIGTERM as a flag, and the fit calls of a run resumed anywhere (kill/resume runs: test_reproducibility)."""

import os
import signal
import time
import uuid

import keras
import numpy as np
import pytest

from concise_attention.training.trainers.trainer import fit_segments
from concise_attention.training.run import configs
from concise_attention.training.run import runs
from concise_attention.training.run.checkpoints import TrainingCheckpoints
from concise_attention.training.run.checkpoints import dropout_seed_states
from concise_attention.training.run.checkpoints import handle_preemption


@pytest.mark.parametrize(
    "step, expected",
    [
        (0, [(0, 0, 5, 5), (25, 5, 6, 3)]),  # whole epochs, then the shorter last one
        (7, [(7, 1, 2, 3), (10, 2, 5, 5), (25, 5, 6, 3)]),  # the rest of epoch 1 first
        (10, [(10, 2, 5, 5), (25, 5, 6, 3)]),
        (26, [(26, 5, 6, 2)]),  # inside the shorter last epoch
        (28, []),
    ],
)
def test_fit_segments_cover_every_step_once_with_the_epoch_numbers_of_an_uninterrupted_run(step, expected):
    segments = fit_segments(step, train_steps=28, steps_per_epoch=5)
    assert segments == expected
    steps = [
        first + index for first, initial, epochs, length in segments for index in range((epochs - initial) * length)
    ]
    assert steps == list(range(step, 28))


def _model():
    config = configs.load_config("tiny_lm", ["model.dropout=0.1", "model.attention_dropout=0.1"])
    model = config.build_model()
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    model.optimizer.build(model.trainable_variables)
    return model


def test_a_checkpoint_restores_weights_optimizer_step_data_position_and_dropout_seed_states():
    # ram:// is a tf.io.gfile filesystem that is not the local one: nothing goes through os paths.
    run = runs.RunDirectory(f"ram://checkpoints-{uuid.uuid4().hex}")
    first = _model()
    states = dropout_seed_states(first)
    assert len(states) == 5  # the embedding dropout, and per layer attention and block dropout
    for index, state in enumerate(states):
        state.assign(np.array([index + 1, 1000 + index], dtype=state.dtype))
    first.optimizer.iterations.assign(17)
    TrainingCheckpoints(run, first, keep=3).save()

    second = _model()  # another build in this process: its seed generators have other names
    assert [s.path for s in dropout_seed_states(second)] != [s.path for s in states]
    assert TrainingCheckpoints(run, second, keep=3).restore() == 17
    for index, state in enumerate(dropout_seed_states(second)):
        np.testing.assert_array_equal(state.numpy(), [index + 1, 1000 + index])
    assert int(second.optimizer.iterations.numpy()) == 17
    for mine, theirs in zip(second.weights + second.optimizer.variables, first.weights + first.optimizer.variables):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy(), err_msg=mine.path)


def test_files_of_uncommitted_or_partly_deleted_checkpoints_are_removed_on_restore(tmp_path):
    run = runs.RunDirectory(tmp_path)
    model = _model()
    checkpoints = TrainingCheckpoints(run, model, keep=3)
    checkpoints.save()
    model.optimizer.iterations.assign(5)
    checkpoints.save()
    directory = tmp_path / "checkpoint"
    committed = sorted(path.name for path in directory.iterdir())
    assert committed == [
        "checkpoint",
        "ckpt-0.data-00000-of-00001",
        "ckpt-0.index",
        "ckpt-5.data-00000-of-00001",
        "ckpt-5.index",
    ]
    # What kills leave: a save's temporary shards, a checkpoint written but not named by the pointer file.
    (directory / "ckpt-10_temp").mkdir()
    (directory / "ckpt-10_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"half")
    (directory / "ckpt-10.index").write_bytes(b"not committed")
    (directory / "ckpt-10.data-00000-of-00001").write_bytes(b"not committed")
    assert TrainingCheckpoints(run, _model(), keep=3).restore() == 5
    assert sorted(path.name for path in directory.iterdir()) == committed
    # A pointer without timestamps (written by hand) names checkpoints all the same: none of them is a leftover.
    (directory / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-5"\nall_model_checkpoint_paths: "ckpt-0"\nall_model_checkpoint_paths: "ckpt-5"\n'
    )
    restored = _model()
    checkpoints = TrainingCheckpoints(run, restored, keep=3)
    assert checkpoints.restore() == 5
    assert sorted(path.name for path in directory.iterdir()) == committed
    restored.optimizer.iterations.assign(10)
    checkpoints.save()  # the manager keeps and rotates them as its own
    assert [os.path.basename(path) for path in TrainingCheckpoints(run, _model(), keep=3).manager.checkpoints] == [
        "ckpt-0",
        "ckpt-5",
        "ckpt-10",
    ]


def test_a_checkpoint_of_the_older_hdf5_format_is_refused_by_name(tmp_path):
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "model.weights.h5").write_bytes(b"\x89HDF")
    with pytest.raises(ValueError, match="model.weights.h5 is a checkpoint of an older version"):
        TrainingCheckpoints(runs.RunDirectory(tmp_path), _model(), keep=3).restore()


def test_sigterm_only_sets_the_flag_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    with handle_preemption() as preemption:
        assert not preemption.requested
        os.kill(os.getpid(), signal.SIGTERM)  # the process goes on
        deadline = time.time() + 5
        while not preemption.requested and time.time() < deadline:
            time.sleep(0.01)  # Python runs the handler in the main thread, between bytecodes
        assert preemption.requested
    assert signal.getsignal(signal.SIGTERM) == before
