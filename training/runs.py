"""The run directory: the one module that writes and reads it.

    RUN/config.json              the resolved config: model, task, training, tokenizer settings
    RUN/vocab.txt                the WordPiece vocabulary
    RUN/backbone.weights.h5      the backbone alone (BertEncoder or CausalLM): what a later run,
                                 the exporters and the converter start from
    RUN/model.weights.h5         the whole task model (backbone + head); a `concise-collaborative`
                                 conversion of a run holds it too (the converted task model)
    RUN/metrics.json             the final evaluation
    RUN/checkpoint/              the trainer's `tf.train.Checkpoint`s: ckpt-STEP.index and
                                 ckpt-STEP.data-*-of-* per checkpoint, the `checkpoint` pointer
                                 file naming the kept ones (`training.checkpoints`)
    RUN/logs/                    TensorBoard

A run directory may be local or any `tf.io.gfile` path (gs://...): every file goes through
`tf.io.gfile`, and Keras' HDF5 weights are written to a local temporary file first and
copied; checkpoints are written by the TF runtime (committed by their pointer file last).
Every other file is written whole under a temporary name and renamed, so a reader never
sees half of one. A `concise-collaborative` output and a Hugging Face BERT folder are read
through the same functions (`read_source`), so anything that starts from a trained model
(fine-tuning, export, conversion) accepts all three.
"""

import dataclasses
import hashlib
import json
import os
import tempfile
import uuid

import tensorflow as tf

from concise_attention.models import presets
from concise_attention.models.bert import BertEncoder
from concise_attention.models.hf_import import check_tokenizer_agrees
from concise_attention.models.hf_import import hf_bert_config
from concise_attention.models.hf_import import hf_tokenizer_settings
from concise_attention.models.hf_import import load_hf_model
from concise_attention.training import configs
from concise_attention.training.tasks import make_task
from concise_attention.training.text import read_vocabulary

CONFIG = "config.json"
VOCABULARY = "vocab.txt"
BACKBONE_WEIGHTS = "backbone.weights.h5"
MODEL_WEIGHTS = "model.weights.h5"
METRICS = "metrics.json"
INPUTS = "inputs.json"  # sha256 of every file the run depends on, recorded when first used
CHECKPOINT_PREFIX = "ckpt"  # RUN/checkpoint/ckpt-STEP.*


def join(directory, name):
    return tf.io.gfile.join(str(directory), name)


def write_bytes_atomically(path, data):
    """Writes `data` (bytes or str) to `path` under a temporary name, then renames it."""
    path = str(path)
    tf.io.gfile.makedirs(os.path.dirname(path) or ".")
    temporary = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with tf.io.gfile.GFile(temporary, "wb") as file:
            file.write(data.encode("utf-8") if isinstance(data, str) else data)
        tf.io.gfile.rename(temporary, path, overwrite=True)
    except BaseException:  # disk full, a read-only folder, a kill signal's exception: no temporary file left
        if tf.io.gfile.exists(temporary):
            tf.io.gfile.remove(temporary)
        raise


def file_sha256(path):
    """The sha256 of a file (local or gs://), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(str(path), "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json_atomically(path, value):
    write_bytes_atomically(path, json.dumps(value, indent=1, sort_keys=True))


def read_json(path):
    """A JSON file as a dict; a missing, truncated or non-JSON file is an error naming it."""
    path = str(path)
    if not tf.io.gfile.exists(path):
        raise ValueError(f"File not found: {path}")
    try:
        with tf.io.gfile.GFile(path, "r") as file:
            value = json.loads(file.read())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}).") from error
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object. Received: {type(value).__name__}")
    return value


def save_weights(model, path):
    """`model.save_weights` to any gfile path, through a local temporary file and a rename."""
    with tempfile.TemporaryDirectory() as local:
        local_path = os.path.join(local, "w.weights.h5")
        model.save_weights(local_path)
        with open(local_path, "rb") as file:
            write_bytes_atomically(path, file.read())


def load_weights(model, path):
    """`model.load_weights` from any gfile path; an unreadable or mismatched file names itself."""
    path = str(path)
    if not tf.io.gfile.exists(path):
        raise ValueError(f"Weights file not found: {path}")
    with tempfile.TemporaryDirectory() as local:
        local_path = os.path.join(local, "w.weights.h5")
        tf.io.gfile.copy(path, local_path, overwrite=True)
        try:
            model.load_weights(local_path)
        except (ValueError, OSError, KeyError) as error:
            raise ValueError(f"The weights in {path} cannot be loaded into this model: {str(error).splitlines()[0]}") from error


DEFAULT_SERVING_LENGTH = 128


@dataclasses.dataclass(frozen=True)
class Source:
    """A trained model to start from: its architecture, weights and tokenizer.

    kind: "run" (a run directory or a `concise-collaborative` output) or "hf" (a Hugging
        Face BERT folder); model_type and model: the builder and its arguments;
    weights: the backbone weights file; vocabulary: vocab.txt; tokenizer: dict(lowercase,
        strip_accents); task: the task section of the run that wrote it (None for HF);
    model_weights: the whole task model's weights (backbone + head) where the run has them
        (a finished run, or a conversion of one), else None.
    name: the run's config name, or the Hugging Face folder's name.
    sequence_length: the length a run (or a preset that records it) was trained at, else None.
    """

    path: str
    kind: str
    model_type: str
    model: dict
    weights: str
    vocabulary: str
    tokenizer: dict
    task: dict = None
    model_weights: str = None
    name: str = None
    sequence_length: int = None

    @property
    def serving_length(self):
        """The length to serve and embed at by default: the one it was trained at where it records one (a
        run, a shipped preset), else DEFAULT_SERVING_LENGTH, never beyond its position embeddings."""
        limit = self.model.get("max_sequence_length", DEFAULT_SERVING_LENGTH)
        return min(self.sequence_length or DEFAULT_SERVING_LENGTH, limit)


def is_hf_folder(path):
    return tf.io.gfile.exists(join(path, "model.safetensors"))


def read_source(path, kind=None):
    """Reads what a run directory, a converter output or a Hugging Face folder holds.

    Args:
        path: the folder.
        kind: "hf" or "run" to insist on one (the error then says what is missing), or None.
    """
    path = str(path)
    if not tf.io.gfile.isdir(path):
        if kind is None and path in presets.shipped_presets():
            return _read_preset(presets.resolve(path))
        raise ValueError(f"Not a directory: {path!r} (expected a run directory, a Hugging Face BERT folder, a preset "
                         f"folder or a shipped preset: {', '.join(presets.shipped_presets()) or 'none is shipped'}).")
    if kind == "hf" and not is_hf_folder(path):
        raise ValueError(f"{path} has no model.safetensors: not a Hugging Face BERT folder.")
    if kind != "run" and is_hf_folder(path):
        return _read_hf_folder(path)
    if kind is None and is_preset_folder(path):
        return _read_preset(presets.resolve(path))
    config = read_json(join(path, CONFIG))
    for key in ("model_type", "model"):
        if key not in config:
            raise ValueError(f"{join(path, CONFIG)} has no `{key}`: not a run directory.")
    weights = join(path, BACKBONE_WEIGHTS)
    if not tf.io.gfile.exists(weights):
        raise ValueError(f"{path} has no {BACKBONE_WEIGHTS}: the run has not finished (or is not a run directory).")
    model = configs.nest_legacy_attention(config["model"])  # runs written before the nested attention config
    model_weights = join(path, MODEL_WEIGHTS)
    return Source(path, "run", config["model_type"], model, weights, join(path, VOCABULARY),
                  tokenizer_settings(config, join(path, CONFIG)), config.get("task"),
                  model_weights=model_weights if tf.io.gfile.exists(model_weights) else None,
                  name=config.get("name") or _basename(path), sequence_length=(config.get("training") or {}).get("sequence_length"))


def is_preset_folder(path):
    return tf.io.gfile.exists(join(path, presets.METADATA_FILE)) and tf.io.gfile.exists(join(path, presets.TOKENIZER_FILE))


def _read_preset(path):
    """A Keras preset folder (`models.presets`; a shipped preset's) as a source: its BERT encoder."""
    model = presets.backbone_arguments(path, BertEncoder)
    settings = presets.tokenizer_settings(path)
    return Source(path, "preset", "bert", model, join(path, presets.WEIGHTS_FILE), settings["path"],
                  {"lowercase": settings["lowercase"], "strip_accents": settings["strip_accents"]}, name=_basename(path),
                  sequence_length=presets.trained_sequence_length(path))


def _read_hf_folder(path):
    model, tokenizer = hf_bert_config(path), hf_tokenizer_settings(path)
    check_tokenizer_agrees(path, read_vocabulary(join(path, VOCABULARY)))
    return Source(path, "hf", "bert", model, join(path, "model.safetensors"), join(path, VOCABULARY), tokenizer,
                  name=_basename(path))


def _basename(path):
    return os.path.basename(path.rstrip("/")) or "model"


def tokenizer_settings(config, config_path):
    """dict(lowercase, strip_accents) of a run's config: its `tokenizer` section, else what
    runs written before it had (`training.strip_accents`; uncased); a bad value names the field."""
    tokenizer, training = config.get("tokenizer") or {}, config.get("training") or {}
    lowercase = True if tokenizer.get("lowercase") is None else tokenizer["lowercase"]  # None: BERT-uncased
    strip_accents = tokenizer.get("strip_accents", training.get("strip_accents"))
    if not isinstance(lowercase, bool):
        raise ValueError(f"{config_path}: `tokenizer.lowercase` must be true or false. Received: {lowercase!r}")
    if strip_accents is not None and not isinstance(strip_accents, bool):
        raise ValueError(f"{config_path}: `tokenizer.strip_accents` must be true, false or null. Received: {strip_accents!r}")
    return {"lowercase": lowercase, "strip_accents": strip_accents}


def load_source(path, kind=None):
    """The trained model a source holds, weights loaded: what the exporter starts from.

    Returns:
        (source, backbone, model): the `Source`; its backbone; the task model around it when
        the source holds a head (a run's model.weights.h5: e.g. `BertPretrainer`,
        `BertClassifier`; a Hugging Face checkpoint's MLM head), else None (a
        `concise-collaborative` output, a BertModel checkpoint).
    """
    source = read_source(path, kind)
    if source.kind == "preset":
        backbone, model = BertEncoder.from_preset(source.path), None
    elif source.kind == "hf":
        backbone, model = load_hf_model(source.path)
    elif tf.io.gfile.exists(join(source.path, MODEL_WEIGHTS)):
        _, model, backbone, _ = load_model(source.path)
    else:
        backbone = configs.BUILDERS[source.model_type](**source.model)
        load_weights(backbone, source.weights)
        model = None
    return source, backbone, model


_LOCKS = {}  # absolute run directory -> the open .lock file this process holds (see RunDirectory.lock)


def _with_defaults(saved):
    """A run's saved config.json as today's schema reads it (legacy attention nested, a field added since with
    its default), so that a run started before a new setting existed resumes; as saved where it no longer parses."""
    if isinstance(saved.get("model"), dict):  # a run started before the nested attention config
        saved["model"] = configs.nest_legacy_attention(saved["model"])
    try:
        return configs.config_from_dict({key: value for key, value in saved.items() if key != "name"}, saved.get("name", "run")).to_dict()
    except ValueError:
        return saved


class RunDirectory:
    """Paths and the read/write operations of one run directory (local or gs://)."""

    def __init__(self, path):
        self.path = str(path)

    def file(self, name):
        return join(self.path, name)

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
        if tf.io.gfile.exists(self.path) and not tf.io.gfile.isdir(self.path):
            raise ValueError(f"The run directory {self.path!r} is an existing file.")

    def start(self, config_dict):
        """Creates the directory and writes config.json; an existing run of another model is refused once it
        has trained (before its first checkpoint, a failed command's config is replaced by the corrected one's)."""
        self.check_writable()
        if tf.io.gfile.exists(self.file(CONFIG)):
            saved = _with_defaults(read_json(self.file(CONFIG)))
            differs = [section for section in ("model_type", "model", "task") if saved.get(section) != config_dict.get(section)]
            if differs and self.has_progress():
                raise ValueError(f"{self.path} holds a run with a different `{differs[0]}`; use a new run directory.")
            if not self.has_progress() and tf.io.gfile.exists(self.file(INPUTS)):  # an earlier command failed before
                tf.io.gfile.remove(self.file(INPUTS))  # its first checkpoint: the corrected one starts afresh
        tf.io.gfile.makedirs(self.path)
        write_json_atomically(self.file(CONFIG), config_dict)

    def has_progress(self):
        """Whether the run has trained: a checkpoint committed (or one of the earlier format), or final weights."""
        return any(tf.io.gfile.exists(path) for path in (join(self.checkpoint_dir, "checkpoint"), self.legacy_checkpoint,
                                                          self.file(BACKBONE_WEIGHTS)))

    def entries(self):
        """The names in the directory, or None when it does not exist (see `roll_back`)."""
        return set(tf.io.gfile.listdir(self.path)) if tf.io.gfile.isdir(self.path) else None

    def roll_back(self, before):
        """Removes what a command wrote to a run that has not trained, given `entries()` from before the
        command: the whole directory if it did not exist, else the entries it did not hold. A command
        refused after it began writing (a model the builder rejects) so leaves nothing behind."""
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
        `unlock` or when the process ends, however it ends); a second trainer on the same directory is refused. On gs:// there
        is no lock: one trainer per run directory is the rule (the Cloud TPU launcher keeps one per VM)."""
        if "://" in self.path:
            return
        import fcntl  # POSIX only, and only for local folders (gs:// has no lock)

        tf.io.gfile.makedirs(self.path)
        handle = open(self.file(".lock"), "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise ValueError(f"Another trainer is running on {self.path} (it holds {self.file('.lock')}): "
                             "wait for it to finish, or use another run directory.") from None
        _LOCKS[os.path.abspath(self.path)] = handle

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
                raise ValueError(f"{shown[name]} differs from the {name} this run started with (sha256 recorded in "
                                 f"{self.file(INPUTS)}): restore it, or start a new run directory.")
        return recorded

    def write_metrics(self, metrics):
        write_json_atomically(self.file(METRICS), metrics)

    def read_metrics(self):
        return read_json(self.file(METRICS))


def load_model(path):
    """The config, task model and backbone of a finished run directory, weights loaded.

    Returns:
        (config, model, backbone, vocabulary path): an `ExperimentConfig`, the task's
        model (e.g. `BertPretrainer`, `BertClassifier`; the `CausalLM` itself), its
        backbone and RUN/vocab.txt.
    """
    run = RunDirectory(path)
    raw = run.read_config()
    try:
        config = configs.config_from_dict({key: value for key, value in raw.items() if key != "name"}, raw.get("name", "run"))
    except ValueError as error:
        raise ValueError(f"{run.file(CONFIG)}: {error}") from error
    # Float32 whatever `training.precision` the run trained under (its variables are float32).
    backbone = config.build_model(dtype="float32")
    model = make_task(config).build_model(backbone)
    weights = run.file(MODEL_WEIGHTS)
    if not tf.io.gfile.exists(weights):
        raise ValueError(f"A finished run directory has {CONFIG} and {MODEL_WEIGHTS}; {run.path!r} lacks {MODEL_WEIGHTS}.")
    load_weights(model, weights)
    return config, model, backbone, run.file(VOCABULARY)
