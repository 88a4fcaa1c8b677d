"""The trainer's checkpoints and preemption: `tf.train.Checkpoint`s kept by a `CheckpointManager`.

A checkpoint (RUN/checkpoint/ckpt-STEP.index + .data-* shards, named by `runs`) holds the
model's variables, the optimizer (its `iterations` is the step), the state of the model's
dropout seed generators and the data position (the number of training batches consumed,
which `task.data(tokenizer, skip_batches=position)` resumes from). The TF runtime writes
it, sharded, through its own filesystem layer (local, gs:// and any registered filesystem).

Commit: TF writes the data files and the index first and rewrites the small `checkpoint`
pointer file (RUN/checkpoint/checkpoint) last, so a reader, or a run restarted after a kill at
any instant, never sees half of a checkpoint: either the pointer names the new one, complete,
or it still names the previous ones. The last `training.keep_checkpoints` are kept. When the
newest cannot be read (a truncated or corrupt data or index file), the restore logs one line
naming it and falls back to the previous one; when none can be read it is an error naming
the directory. Files of checkpoints that the pointer does not name (left by a kill during a
save or a deletion) are removed at the restart. Only the chief writes; the other workers of
a multi-worker run restore but never save (their variables are the chief's). A run directory holding a checkpoint of the
older format (one HDF5 file per epoch, checkpoint/model.weights.h5) is refused: it cannot be
resumed bit-exactly from it.

Preemption: Cloud TPU VMs get SIGTERM before a preemption or maintenance event. While
`handle_preemption()` is active a SIGTERM only sets a flag; `CheckpointCallback` sees it at
the next end of a training batch, saves a checkpoint at the step reached and raises
`Preempted` (the CLI exits with `PREEMPTED_EXIT_CODE`, 75 = EX_TEMPFAIL, which
scripts/cloud_tpu.py restarts on). With `steps_per_execution` > 1 Keras reports batch ends
once per execution, so the checkpoint is at the last execution boundary reached.
`tf.distribute.experimental.PreemptionCheckpointHandler` is not used: it wraps the step
function of a custom training loop and exits the process itself, where `model.fit` offers
only callbacks. The flag is per process: on Cloud TPU one process drives the TPU; the
workers of a MultiWorkerMirroredStrategy run are not coordinated (one that stops while the
others go on leaves them waiting in their collectives), which that handler would do.
"""

import contextlib
import logging
import signal
import time

import keras
import tensorflow as tf
from google.protobuf.message import DecodeError

from concise_attention.training import files

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: a checkpoint was saved on SIGTERM; run the same command again

logger = logging.getLogger(__name__)


class Preempted(Exception):
    """Training stopped on SIGTERM after saving a checkpoint at `step`."""

    def __init__(self, step, directory):
        super().__init__(
            f"SIGTERM: saved a checkpoint at step {step} in {directory}; run the same command again to resume."
        )
        self.step = step


def dropout_seed_states(model):
    """The state variables of the model's random seed generators (dropout), in model order.

    Keras keeps them in `model.variables` but neither in `model.weights` nor in the model's
    `tf.train.Checkpoint` dependencies, so the checkpoint lists them itself: a resumed run
    would draw other dropout masks than an uninterrupted one. They are matched by order, as
    Keras matches weights: their names carry process-wide counters (seed_generator_7).
    """
    weights = {id(variable) for variable in model.weights}
    return [
        variable
        for variable in model.variables
        if id(variable) not in weights and variable.path.endswith("seed_generator_state")
    ]


class TrainingCheckpoints:
    """The checkpoints of one run: save (chief only) and restore with fallback.

    Args:
        run: the `runs.RunDirectory`.
        model: the compiled task model (its optimizer is checkpointed with it).
        keep: how many checkpoints to keep (training.keep_checkpoints).
        is_chief: whether this process writes.
    """

    def __init__(self, run, model, keep, is_chief=True):
        self.run, self.model, self.is_chief = run, model, is_chief
        self.directory = run.checkpoint_dir
        self.position = tf.Variable(0, dtype=tf.int64, trainable=False, name="data_position")
        self.checkpoint = tf.train.Checkpoint(
            model=model,
            optimizer=model.optimizer,
            dropout_seed_states=dropout_seed_states(model),
            data_position=self.position,
        )
        self.keep = keep
        self.manager = self._manager()
        self.saved_step = None  # the step of the checkpoint this process restored or saved last

    def _manager(self):
        return tf.train.CheckpointManager(
            self.checkpoint, self.directory, max_to_keep=self.keep, checkpoint_name=files.CHECKPOINT_PREFIX
        )

    @property
    def step(self):
        return int(self.model.optimizer.iterations.numpy())

    def save(self):
        """Commits a checkpoint at the current step (one training batch per step), unless
        this process restored or saved that step already."""
        if not self.is_chief or self.saved_step == self.step:
            return
        self.position.assign(self.step)
        self.manager.save(checkpoint_number=self.step)
        self.saved_step = self.step

    def restore(self):
        """Restores the newest readable checkpoint (under the strategy's scope).

        Returns:
            the data position (batches consumed), or None when there is no checkpoint.
        """
        named = self._named()
        if tf.io.gfile.exists(self.run.legacy_checkpoint) and not named:
            raise ValueError(
                f"{self.run.legacy_checkpoint} is a checkpoint of an older version of the trainer (one HDF5 file), "
                "which cannot be resumed exactly: start a new run directory."
            )
        if self.is_chief:
            self._adopt_untimed_pointer(named)
            self._remove_leftovers(named)
        candidates = list(reversed(named))
        if candidates:
            self.model.optimizer.build(self.model.trainable_variables)  # its variables exist to be restored into
        for path in candidates:
            try:
                self.checkpoint.restore(path).assert_existing_objects_matched()
            except (tf.errors.OpError, AssertionError, ValueError, IndexError, DecodeError) as error:
                # IndexError: TF's reader on a truncated data file; DecodeError: a corrupt object graph.
                logger.warning("Checkpoint %s cannot be read (%s); trying the previous one.", path, _first_line(error))
                continue
            self.saved_step = self.step
            return int(self.position.numpy())
        if candidates:
            raise ValueError(
                f"No readable checkpoint in {self.directory} (tried {len(candidates)}): start a new run directory."
            )
        return None

    def _named(self):
        """The checkpoints the pointer file names, oldest first. The manager lists none from a pointer without
        timestamps (one written by hand, or by another tool): its paths are then read as written."""
        if self.manager.checkpoints or not tf.io.gfile.isdir(self.directory):
            return list(self.manager.checkpoints)
        state = tf.train.get_checkpoint_state(self.directory)
        if state is None or not state.model_checkpoint_path:
            return []
        return list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]

    def _adopt_untimed_pointer(self, named):
        """Gives a pointer without timestamps (naming the checkpoints `named`) the timestamps TF's manager needs to
        list (and so keep and rotate) them: else its first save would write a pointer naming that save alone."""
        named = [path.rsplit("/", 1)[-1] for path in named]  # relative, as the manager writes them
        if named and not self.manager.checkpoints:
            now = time.time()
            tf.compat.v1.train.update_checkpoint_state(
                self.directory,
                named[-1],
                named,
                all_model_checkpoint_timestamps=[now] * len(named),
                last_preserved_timestamp=now - 1,
            )
            self.manager = self._manager()

    def _remove_leftovers(self, named):
        """Removes what a killed save or clean-up left: files of checkpoints the pointer file
        does not name (`named`; a save's ckpt-N_temp/ shards, a checkpoint written but not committed,
        one partly deleted)."""
        if not tf.io.gfile.isdir(self.directory):
            return
        kept = {path.rsplit("/", 1)[-1] for path in named}
        for name in tf.io.gfile.listdir(self.directory):
            name = name.rstrip("/")
            if name.startswith(f"{files.CHECKPOINT_PREFIX}-") and name.split(".")[0].split("_temp")[0] not in kept:
                path = files.join(self.directory, name)
                (tf.io.gfile.rmtree if tf.io.gfile.isdir(path) else tf.io.gfile.remove)(path)


def _first_line(error):
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


class CheckpointCallback(keras.callbacks.Callback):
    """Saves a checkpoint at each epoch end, and on preemption at the end of the batch reached."""

    def __init__(self, checkpoints, preemption):
        super().__init__()
        self.checkpoints, self.preemption = checkpoints, preemption

    def on_train_batch_end(self, batch, logs=None):
        self._stop_if_preempted()

    def on_epoch_end(self, epoch, logs=None):
        self.checkpoints.save()
        self._stop_if_preempted()

    def _stop_if_preempted(self):
        if self.preemption.requested:
            self.checkpoints.save()
            raise Preempted(self.checkpoints.step, self.checkpoints.directory)


class PreemptionFlag:
    """Set by SIGTERM while `handle_preemption` is active."""

    requested = False


@contextlib.contextmanager
def handle_preemption():
    """Within: SIGTERM sets the returned flag instead of ending the process (main thread only;
    elsewhere the flag is never set). The previous handler is restored on exit."""
    flag = PreemptionFlag()

    def on_sigterm(signum, frame):
        flag.requested = True

    try:
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread: signals cannot be handled here
        yield flag
        return
    try:
        yield flag
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
