"""Files as every part of a run writes and reads them, local or any `tf.io.gfile` path (gs://...).

Every file is written whole under a temporary name and renamed, so a reader never sees half of one; Keras' HDF5
weights go through a local temporary file and are copied. The names of a run directory's files are here too:
`training.run.runs` writes that directory and `training.artifacts` reads a finished one back.
"""

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import uuid

import tensorflow as tf

from concise_attention.models.presets import save_weights as weights_only

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


def user_cache(name):
    """A folder of the per-user cache, `$CONCISE_ATTENTION_CACHE/NAME` (default
    `$XDG_CACHE_HOME/concise_attention/NAME`, `~/.cache/...` without it): what is computed once per machine
    (teacher outputs, trained vocabularies) and verified by sha256 whenever it is read again."""
    if os.environ.get("CONCISE_ATTENTION_CACHE"):
        return os.path.join(os.environ["CONCISE_ATTENTION_CACHE"], name)
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "concise_attention", name)


def file_sha256(path):
    """The sha256 of a file (local or gs://), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(str(path), "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_verified(base, suffix, data, **record):
    """Writes `data` to `base``suffix` and then its record, `base`.json ({"sha256": ..., **record}), each whole:
    the record is written last, so a record found always describes a whole file. What the per-user cache keeps
    (teacher outputs, trained vocabularies); read back by `read_verified`."""
    data = data.encode("utf-8") if isinstance(data, str) else data
    write_bytes_atomically(base + suffix, data)
    write_json_atomically(base + ".json", {"sha256": hashlib.sha256(data).hexdigest(), **record})


def read_verified(base, suffix):
    """The bytes of `base``suffix` as `write_verified` wrote them, or None where no record was written. A record
    that cannot be read, or a file that is missing or does not match the sha256 it records, is a ValueError
    naming both files."""
    if not tf.io.gfile.exists(base + ".json"):
        return None
    record = read_json(base + ".json")
    data = b""
    if tf.io.gfile.exists(base + suffix):
        with tf.io.gfile.GFile(base + suffix, "rb") as file:
            data = file.read()
    if hashlib.sha256(data).hexdigest() != record.get("sha256"):
        raise ValueError(f"{base}{suffix} does not match the sha256 recorded in {base}.json (changed or cut short)")
    return data


def write_json_atomically(path, value):
    write_bytes_atomically(path, json.dumps(value, indent=1, sort_keys=True))


def read_json(path, kind=dict):
    """A JSON file as a dict (or the `kind` it must hold, e.g. list); a missing, truncated or non-JSON file is
    an error naming it."""
    path = str(path)
    if not tf.io.gfile.exists(path):
        raise ValueError(f"File not found: {path}")
    try:
        with tf.io.gfile.GFile(path, "r") as file:
            value = json.loads(file.read())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}).") from error
    if not isinstance(value, kind):
        raise ValueError(
            f"{path} must hold a JSON {'object' if kind is dict else kind.__name__}. Received: {type(value).__name__}"
        )
    return value


def save_weights(model, path):
    """The model's weights (not its optimizer's state: `models.presets.save_weights`) to any gfile path, through a
    local temporary file and a rename."""
    with tempfile.TemporaryDirectory() as local:
        local_path = os.path.join(local, "w.weights.h5")
        weights_only(model, local_path)
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
            raise ValueError(
                f"The weights in {path} cannot be loaded into this model: {str(error).splitlines()[0]}"
            ) from error


def move_folder_in(staging, target):
    """Moves the finished local folder `staging` (from `tempfile.mkdtemp` beside `target`) to `target`, with the
    permissions of a folder made by hand (mkdtemp's 0700 widened to 0777 less the umask). An existing `target` is
    first renamed aside (`.NAME.replaced-PID`) and removed only once the new one is in place: a kill at any moment
    leaves the old folder or the new one, never neither."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)
    target = os.path.normpath(str(target))
    aside = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.replaced-{os.getpid()}")
    if os.path.lexists(target):
        os.rename(target, aside)
    os.rename(staging, target)
    shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def staged_folder(target):
    """Yields a new temporary folder beside the local folder `target` (its parent made if missing); when the block
    ends, moves it into `target`'s place (`move_folder_in`), and when the block raises, removes it: a refused, failed
    or killed command leaves `target` as it was (a kill leaves only a hidden `.NAME.*` folder)."""
    parent = os.path.dirname(os.path.abspath(str(target)))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.normpath(str(target)))}.", dir=parent)
    try:
        yield staging
        move_folder_in(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_creatable(path, name):
    """Refuses a folder `path` (the setting `name`) that is a file or lies under one: one ValueError, before anything
    is written (TensorFlow would say FailedPrecondition only once it tries)."""
    path, existing = str(path), str(path)
    while not tf.io.gfile.exists(existing) and os.path.dirname(existing) not in ("", existing):
        existing = os.path.dirname(existing)
    if tf.io.gfile.exists(existing) and not tf.io.gfile.isdir(existing):
        where = "is" if existing == path else f"lies under {existing!r}, which is"
        raise ValueError(f"{name} {path!r} {where} an existing file.")
