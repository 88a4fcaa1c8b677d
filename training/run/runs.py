"""The run directory: the one module that writes it.

    RUN/config.json              the resolved config: model, task, training, tokenizer settings
    RUN/vocab.txt                the WordPiece vocabulary
    RUN/backbone.weights.h5      the backbone alone (BertEncoder or CausalLM): what a later run,
                                 the exporters and the converter start from
    RUN/model.weights.h5         the whole task model (backbone + head); a `concise-collaborative`
                                 conversion of a run holds it too (the converted task model)
    RUN/metrics.json             the final evaluation
    RUN/checkpoint/              the trainer's `tf.train.Checkpoint`s: ckpt-STEP.index and
                                 ckpt-STEP.data-*-of-* per checkpoint, the `checkpoint` pointer
                                 file naming the kept ones (`training.run.checkpoints`)
    RUN/logs/                    TensorBoard

A run directory may be local or any `tf.io.gfile` path (gs://...): every file goes through
`training.files` (written whole under a temporary name and renamed, so a reader never sees
half of one); checkpoints are written by the TF runtime (committed by their pointer file
last). A finished run is read back, with every other kind of model on disk, by `training.artifacts`; `load` adds
the task model its task builds around the backbone.
"""

import os

import tensorflow as tf

from concise_attention.training.files import BACKBONE_WEIGHTS
from concise_attention.training.files import CONFIG
from concise_attention.training.files import INPUTS
from concise_attention.training.files import METRICS
from concise_attention.training.files import MODEL_WEIGHTS
from concise_attention.training.files import VOCABULARY
from concise_attention.training.files import file_sha256
from concise_attention.training.files import check_creatable
from concise_attention.training.files import join
from concise_attention.training.files import load_weights
from concise_attention.training.files import read_json
from concise_attention.training.files import save_weights
from concise_attention.training.files import write_bytes_atomically
from concise_attention.training.files import write_json_atomically
from concise_attention.training import artifacts
from concise_attention.training.run import configs
from concise_attention.training.tasks import make_task


_LOCKS = {}  # absolute run directory -> the open .lock file this process holds (see RunDirectory.lock)


def _with_defaults(saved):
    """A run's saved config.json as today's schema reads it (a field added since with its default), so that a run
    started before a new setting existed resumes; as saved where it no longer parses."""
    try:
        return configs.config_from_dict(
            {key: value for key, value in saved.items() if key != "name"}, saved.get("name", "run")
        ).to_dict()
    except ValueError:
        return saved


class RunDirectory:
    """Paths and the read/write operations of one run directory (local or gs://)."""

    def __init__(self, path):
        self.path = str(path)

    def file(self, name):
        return join(self.path, name)

    def has(self, name):
        return tf.io.gfile.exists(self.file(name))

    @property
    def checkpoint_dir(self):
        return self.file("checkpoint")

    @property
    def legacy_checkpoint(self):
        """The single HDF5 checkpoint of earlier versions (refused on resume)."""
        return join(self.checkpoint_dir, MODEL_WEIGHTS)

    @property
    def logs_dir(self):
        return self.file("logs")

    def check_writable(self):
        """Refuses a run directory that is a file, or lies under one (one line, before anything is written)."""
        check_creatable(self.path, "The run directory")

    def start(self, config_dict):
        """`check_start`, then config.json (`record_config`)."""
        self.check_start(config_dict)
        self.record_config(config_dict)

    def check_start(self, config_dict):
        """Creates the directory; an existing run of another model is refused once it has trained (before its first
        checkpoint, a failed command's inputs are forgotten: the corrected one starts afresh). The trainer writes
        config.json (`record_config`) once the run's inputs are verified, so a refused resume leaves it as it was."""
        self.check_writable()
        if tf.io.gfile.exists(self.file(CONFIG)):
            saved = _with_defaults(read_json(self.file(CONFIG)))
            differs = [
                section for section in ("model_type", "model", "task") if saved.get(section) != config_dict.get(section)
            ]
            if differs and self.has_progress():
                raise ValueError(
                    f"{self.path} holds a run with a different `{differs[0]}` "
                    f"({_differences(differs[0], saved.get(differs[0]), config_dict.get(differs[0]))}); use a new run directory."
                )
        if not self.has_progress() and tf.io.gfile.exists(self.file(INPUTS)):
            tf.io.gfile.remove(self.file(INPUTS))
        tf.io.gfile.makedirs(self.path)

    def record_config(self, config_dict):
        write_json_atomically(self.file(CONFIG), config_dict)

    def has_progress(self):
        """Whether the run has trained: a checkpoint committed (or one of the earlier format), or final weights."""
        return any(
            tf.io.gfile.exists(path)
            for path in (join(self.checkpoint_dir, "checkpoint"), self.legacy_checkpoint, self.file(BACKBONE_WEIGHTS))
        )

    def entries(self):
        """The names in the directory, or None when it does not exist."""
        return set(tf.io.gfile.listdir(self.path)) if tf.io.gfile.isdir(self.path) else None

    def roll_back(self, before):
        """Removes what a command wrote to a run that has not trained, given what `lock` returned: the whole
        directory if the command created it, else the entries it did not hold. A command refused after it
        began writing (a model the builder rejects) so leaves nothing behind; only the lock's holder calls it."""
        if self.has_progress():
            return
        if before is None:
            if tf.io.gfile.isdir(self.path):
                tf.io.gfile.rmtree(self.path)
            return
        for name in sorted((self.entries() or set()) - before):
            path = self.file(name.rstrip("/"))
            tf.io.gfile.rmtree(path) if tf.io.gfile.isdir(path) else tf.io.gfile.remove(path)

    def read_config(self):
        return read_json(self.file(CONFIG))

    def write_vocabulary(self, tokens):
        write_bytes_atomically(self.file(VOCABULARY), "\n".join(tokens) + "\n")

    def save_models(self, backbone, model):
        """The final weights: the backbone alone, then the whole task model."""
        save_weights(backbone, self.file(BACKBONE_WEIGHTS))
        save_weights(model, self.file(MODEL_WEIGHTS))

    def lock(self):
        """Takes this process's exclusive lock on a local run directory (`.lock`, flock: released by
        `unlock` or when the process ends), so a second trainer is refused before it reads or writes
        anything. On gs:// there is no lock: one trainer per run directory is the rule. Returns what the
        directory held once the lock was taken, less what taking it created (None: the directory
        itself), which is what `roll_back` keeps.
        """
        if "://" in self.path:
            return self.entries()
        import fcntl  # POSIX only, and only for local folders (gs:// has no lock)

        self.check_writable()
        created, had_lock = not tf.io.gfile.isdir(self.path), tf.io.gfile.exists(self.file(".lock"))
        tf.io.gfile.makedirs(self.path)
        handle = open(self.file(".lock"), "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise ValueError(
                f"Another trainer is running on {self.path} (it holds {self.file('.lock')}): "
                "wait for it to finish, or use another run directory."
            ) from None
        _LOCKS[os.path.abspath(self.path)] = handle
        if created:
            return None
        return self.entries() if had_lock else self.entries() - {".lock"}

    def unlock(self):
        """Releases this process's lock on the directory, if it holds one."""
        handle = _LOCKS.pop(os.path.abspath(self.path), None) if "://" not in self.path else None
        if handle is not None:
            handle.close()

    def verify_inputs(self, files, record=True):
        """Checks the files a run depends on ({name: path}: its vocabulary, the prepared shards'
        manifest) against the sha256s in inputs.json; a file seen for the first time is recorded
        there (when `record`). A file that changed since (a truncated vocab.txt, a rebuilt data
        folder) is refused: a resumed run would silently read other ids or other data."""
        current = {name: file_sha256(path) for name, path in files.items()}
        recorded = self.check_inputs(current, files)
        if record and any(name not in recorded for name in current):
            write_json_atomically(self.file(INPUTS), {**recorded, **current})

    def check_inputs(self, digests, shown):
        """Raises if a sha256 of `digests` ({name: sha256}) differs from the one inputs.json recorded
        (`shown[name]` names the file in the message); returns what inputs.json holds."""
        recorded = read_json(self.file(INPUTS)) if tf.io.gfile.exists(self.file(INPUTS)) else {}
        for name, digest in digests.items():
            if recorded.get(name, digest) != digest:
                raise ValueError(
                    f"{shown[name]} differs from the {name} this run started with (sha256 recorded in "
                    f"{self.file(INPUTS)}): restore it, or start a new run directory."
                )
        return recorded

    def write_metrics(self, metrics):
        write_json_atomically(self.file(METRICS), metrics)

    def read_metrics(self):
        return read_json(self.file(METRICS))


def read_run_config(path):
    """The `ExperimentConfig` a run directory records (RUN/config.json), checked; nothing else is read."""
    run = RunDirectory(path)
    raw = run.read_config()
    try:
        return configs.config_from_dict(
            {key: value for key, value in raw.items() if key != "name"}, raw.get("name", "run")
        )
    except ValueError as error:
        raise ValueError(f"{run.file(CONFIG)}: {error}") from error


def load(path, kind=None):
    """`training.artifacts.load`, with the task model of a run that has one (model.weights.h5: the backbone and its
    head, weights loaded, float32 whatever precision it trained under) and its `ExperimentConfig`."""
    source = artifacts.read(path, kind)
    if source.kind != "run" or source.model_weights is None:
        return artifacts.from_source(source)
    config = read_run_config(source.path)
    backbone = config.build_model(dtype="float32")
    model = make_task(config).build_model(backbone)
    load_weights(model, source.model_weights)
    return artifacts.LoadedModel(source, backbone, model, config)


def _differences(name, saved, now, most=3):
    """`name.key: saved -> now` for the first `most` keys where two config sections differ (the values themselves
    where a section is not a mapping)."""
    if not (isinstance(saved, dict) and isinstance(now, dict)):
        return f"{name}: {saved!r} -> {now!r}"
    keys = sorted(key for key in set(saved) | set(now) if saved.get(key) != now.get(key))
    shown = [f"{name}.{key}: {saved.get(key)!r} -> {now.get(key)!r}" for key in keys[:most]]
    return "; ".join(shown + ([f"{len(keys) - most} more"] if len(keys) > most else []))
