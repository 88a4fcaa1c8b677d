"""Keras 3 preset directories in keras-hub's layout: `from_preset` and `save_to_preset`.

    PRESET/config.json                       the backbone (`keras.saving.serialize_keras_object`)
    PRESET/model.weights.h5                  its weights
    PRESET/metadata.json                     Keras version, parameter count
    PRESET/task.json, task.weights.h5        the task model around the backbone, when saved from
                                             one (e.g. `BertPretrainer`): config and weights
                                             (the backbone's included)
    PRESET/tokenizer.json                    the tokenizer's settings (written by the exporter):
    PRESET/assets/tokenizer/vocabulary.txt   `lowercase`, `strip_accents`, the vocabulary asset

`preset` is a folder, or the name of a preset shipped inside the package (`models/shipped/NAME/`,
`shipped_presets()`): float16 weights, vocabulary, model card (README.md) and a manifest.json of every
file's sha256, checked before anything is read (for any folder that has one).

A preset is a plain Keras model directory: `BertEncoder.from_preset(path)` rebuilds the encoder
from config.json and loads model.weights.h5, so it fine-tunes in Keras 3 with any optimizer
(every variable is a Keras variable; no SavedModel in between). The task classes load
task.json when it holds their class, else put a new head on the preset's backbone.
Local folders only.

Example:
>>> encoder = BertEncoder.from_preset("exported/hub/1/keras")
>>> classifier = BertClassifier.from_preset("exported/hub/1/keras", num_outputs=3)   # new head
>>> pretrainer = BertPretrainer.from_preset("exported/hub/1/keras")   # when saved with its MLM head
"""

import hashlib
import json
import os
import warnings

import h5py
import keras

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
TASK_CONFIG_FILE = "task.json"
TASK_WEIGHTS_FILE = "task.weights.h5"
METADATA_FILE = "metadata.json"
TOKENIZER_FILE = "tokenizer.json"
VOCABULARY_ASSET = "assets/tokenizer/vocabulary.txt"
MANIFEST_FILE = "manifest.json"
# What a backbone's `from_preset(**kwargs)` may change: rates, dtype and naming, never the shape of a weight.
OVERRIDABLE = ("dropout", "attention_dropout", "dtype", "name", "trainable")
SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shipped")


def shipped_presets():
    """The names of the presets shipped inside the package."""
    if not os.path.isdir(SHIPPED_DIR):
        return []
    # names starting with "." are staging folders
    return sorted(
        name
        for name in os.listdir(SHIPPED_DIR)
        if not name.startswith(".") and os.path.isfile(os.path.join(SHIPPED_DIR, name, CONFIG_FILE))
    )


def resolve(preset):
    """The folder of `preset` (a shipped preset's name, or a folder), its manifest checked. A shipped name
    wins over a folder of that name in the working directory (as keras-hub's built-in names do): write
    `./NAME` for the folder. A shipped preset without its manifest is refused."""
    path = str(preset)
    if path in shipped_presets():
        path = os.path.join(SHIPPED_DIR, path)
        if not os.path.isfile(os.path.join(path, MANIFEST_FILE)):
            raise ValueError(
                f"{os.path.join(path, MANIFEST_FILE)} is missing: the shipped preset cannot be checked; reinstall the package."
            )
    elif not os.path.isdir(path):
        raise ValueError(
            f"{path!r} is neither a preset folder nor a shipped preset (shipped: {', '.join(shipped_presets()) or 'none'})."
        )
    check_manifest(path)
    return path


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(folder):
    for root, _, names in os.walk(folder):
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            if relative != MANIFEST_FILE:
                yield relative


def write_manifest(folder):
    """Writes manifest.json: the sha256 of every other file of `folder`."""
    _write(
        folder,
        MANIFEST_FILE,
        {"sha256": {name: _sha256(os.path.join(folder, name)) for name in sorted(_files(folder))}},
    )


# folder -> the (name, size, mtime) of its manifest and files when their sha256s last matched: one
# load reads a preset through several entry points, each resolving it, and hashes its weights once.
_VERIFIED = {}


def _stamp(folder, names):
    """Each file's inode, size, mtime and ctime: a rewrite changes ctime even where it restores size and mtime."""
    stats = [(name, os.stat(os.path.join(folder, name))) for name in (MANIFEST_FILE, *names)]
    return tuple((name, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns) for name, stat in stats)


# Preset folders a user loads without a manifest, by path, separated as PATH is: the opt-out of verification.
UNVERIFIED_VARIABLE = "CONCISE_ATTENTION_UNVERIFIED_PRESETS"


def check_manifest(folder):
    """Raises ValueError naming the first file of `folder` that is missing or differs from its manifest
    (files unchanged since they last matched, in this process, are not hashed again). A folder without
    manifest.json is refused unless UNVERIFIED_VARIABLE names it."""
    if not os.path.isfile(os.path.join(folder, MANIFEST_FILE)):
        allowed = {
            os.path.abspath(entry) for entry in os.environ.get(UNVERIFIED_VARIABLE, "").split(os.pathsep) if entry
        }
        if os.path.abspath(folder) not in allowed:
            raise ValueError(
                f"{os.path.join(folder, MANIFEST_FILE)} is missing: the preset's files cannot be checked. Re-export "
                f"it, or name the folder in {UNVERIFIED_VARIABLE} to load it unverified."
            )
        return
    expected = _read(folder, MANIFEST_FILE)["sha256"]
    missing = {name for name in expected if not os.path.isfile(os.path.join(folder, name))}
    key = os.path.abspath(folder)
    if not missing and _VERIFIED.get(key) == _stamp(folder, expected):
        return
    for name, digest in expected.items():
        path = os.path.join(folder, name)
        if name in missing or _sha256(path) != digest:
            raise ValueError(
                f"{path} is missing or does not match the sha256 in {os.path.join(folder, MANIFEST_FILE)}: reinstall the package or re-export the preset."
            )
    _VERIFIED[key] = _stamp(folder, expected)


def _read(preset, name):
    path = os.path.join(str(preset), name)
    if not os.path.isfile(path):
        raise ValueError(f"{path} not found: {str(preset)!r} is not a preset directory.")
    with open(path, encoding="utf-8") as file:
        try:
            return json.load(file)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON ({error}).") from error


def _write(preset, name, value):
    with open(os.path.join(str(preset), name), "w", encoding="utf-8") as file:
        json.dump(value, file, indent=1)


def _check_class(config, cls, path):
    expected = keras.saving.get_registered_name(cls)
    if config.get("registered_name") != expected:
        raise ValueError(f"{path} holds a {config.get('registered_name')!r}, not a {expected!r}.")


def save_weights(model, path):
    """The model's own weights into `path` (.weights.h5), never its optimizer's state: Keras' `save_weights` of a
    compiled model also stores every optimizer variable (Adam: twice the weights), which a weights file does not
    need (a run's checkpoint/ keeps what resuming needs) and which another optimizer could not use anyway."""
    optimizer = getattr(model, "optimizer", None)
    keras.saving.save_weights(model, str(path), objects_to_skip=None if optimizer is None else [optimizer])


def save_to_preset(model, preset, weights_dtype=None):
    """Writes `model` (a backbone, or a task model with `.encoder`) as a preset into the folder `preset`;
    `weights_dtype="float16"` stores the backbone's weights at half size (they load into any dtype)."""
    os.makedirs(str(preset), exist_ok=True)
    backbone = getattr(model, "encoder", model)
    _write(preset, CONFIG_FILE, keras.saving.serialize_keras_object(backbone))
    stored = backbone
    if weights_dtype is not None:
        stored = backbone.__class__.from_config({**backbone.get_config(), "dtype": weights_dtype})
        for target, variable in zip(stored.weights, backbone.weights):
            target.assign(keras.ops.cast(variable, weights_dtype))
    save_weights(stored, os.path.join(str(preset), WEIGHTS_FILE))
    if backbone is not model:
        _write(preset, TASK_CONFIG_FILE, keras.saving.serialize_keras_object(model))
        save_weights(model, os.path.join(str(preset), TASK_WEIGHTS_FILE))
    _write(preset, METADATA_FILE, {"keras_version": keras.version(), "parameter_count": backbone.count_params()})
    _carry_tokenizer(getattr(backbone, "loaded_from_preset", None), preset)
    write_manifest(preset)  # every preset written here loads verified


def _carry_tokenizer(source, preset):
    """A backbone loaded by `from_preset` saves with the tokenizer of the preset it came from (tokenizer.json and its
    vocabulary), as keras-hub's presets carry theirs: `SentenceEncoder.from_preset`, `concise-export --preset` and
    `task.init` then read the saved preset. Nothing is copied where `preset` has a tokenizer or is `source` itself."""
    if (
        source is None
        or os.path.isfile(os.path.join(str(preset), TOKENIZER_FILE))
        or not os.path.isfile(os.path.join(source, TOKENIZER_FILE))
    ):
        return
    settings = _read(source, TOKENIZER_FILE)
    with open(os.path.join(source, settings.get("vocabulary", VOCABULARY_ASSET)), encoding="utf-8") as file:
        vocabulary = file.read()
    recorded = {key: settings.get(key) for key in ("sequence_length", "embedding", "serving_length")}
    save_tokenizer(preset, vocabulary, settings.get("lowercase", True), settings.get("strip_accents"), **recorded)


class PresetMixin:
    """`from_preset` and `save_to_preset` for a backbone (`BertEncoder`)."""

    @classmethod
    def from_preset(cls, preset, **kwargs):
        """The backbone of `preset`, weights loaded; `kwargs` change constructor arguments
        that do not change the weights (OVERRIDABLE: e.g. `dropout=0.1` for fine-tuning); any other is refused."""
        refused = sorted(set(kwargs) - set(OVERRIDABLE))
        if refused:
            raise ValueError(
                f"`from_preset` takes only arguments that leave the weights as they are ({', '.join(OVERRIDABLE)}). "
                f"Received: {', '.join(f'{name}={kwargs[name]!r}' for name in refused)}"
            )
        preset = resolve(preset)
        config = _read(preset, CONFIG_FILE)
        _check_class(config, cls, os.path.join(str(preset), CONFIG_FILE))
        model = cls.from_config({**config["config"], **kwargs})
        model.load_weights(os.path.join(str(preset), WEIGHTS_FILE))
        model.loaded_from_preset = str(preset)  # its tokenizer goes with it into `save_to_preset`
        return model

    save_to_preset = save_to_preset


HEAD_SHAPE = ("num_outputs",)  # task-head arguments that change the shape of its weights


class TaskPresetMixin:
    """`from_preset` and `save_to_preset` for a task model around a backbone (`self.encoder`)."""

    @classmethod
    def from_preset(cls, preset, **kwargs):
        """The task model saved in `preset` (task.json, of this class) with its trained head, `kwargs` that
        leave the head's weights as they are applied to it (`dropout`, `activation`, or the saved `num_outputs`
        again); else a new head of this class, built with `kwargs`, on the preset's backbone: for a preset
        without such a task, or with a `num_outputs` other than the saved one (a warning says the trained head is
        not loaded; keras-hub's `num_classes` also builds a new head)."""
        preset = resolve(preset)
        saved = _read(preset, TASK_CONFIG_FILE) if os.path.isfile(os.path.join(str(preset), TASK_CONFIG_FILE)) else None
        if saved is not None and saved.get("registered_name") == keras.saving.get_registered_name(cls):
            changed = {
                name: value
                for name, value in kwargs.items()
                if name in HEAD_SHAPE and value != saved["config"].get(name)
            }
            if not changed and set(kwargs) <= set(cls.head_arguments):
                model = keras.saving.deserialize_keras_object({**saved, "config": {**saved["config"], **kwargs}})
                model.load_weights(os.path.join(str(preset), TASK_WEIGHTS_FILE))
                model.encoder.loaded_from_preset = str(preset)
                return model
            if changed:
                warnings.warn(
                    f"{preset}: a new {cls.__name__} head for {changed} (its trained head has "
                    f"{ {name: saved['config'].get(name) for name in changed} }): the trained head's weights are not loaded."
                )
        backbone = keras.saving.deserialize_keras_object(_read(preset, CONFIG_FILE))
        backbone.load_weights(os.path.join(str(preset), WEIGHTS_FILE))
        backbone.loaded_from_preset = str(preset)
        if "pooling" in cls.head_arguments:  # the saved head's, else a sentence encoder's mean (`head_pooling`)
            kwargs = {
                "pooling": (saved or {}).get("config", {}).get("pooling") or head_pooling(sentence_embedding(preset)),
                **kwargs,
            }
        return cls(backbone, **kwargs)

    save_to_preset = save_to_preset


def stored_dtype(preset):
    """The dtype the backbone weights of `preset` are stored in ("float16" for a shipped preset), or None
    where they mix dtypes."""
    dtypes = set()
    with h5py.File(os.path.join(resolve(preset), WEIGHTS_FILE), "r") as weights:
        weights.visititems(
            lambda _, item: (
                dtypes.add(str(item.dtype)) if isinstance(item, h5py.Dataset) and item.dtype.kind == "f" else None
            )
        )
    return dtypes.pop() if len(dtypes) == 1 else None


def backbone_arguments(preset, cls):
    """The constructor arguments of the `cls` (e.g. `BertEncoder`) saved in `preset`."""
    preset = resolve(preset)
    config = _read(preset, CONFIG_FILE)
    _check_class(config, cls, os.path.join(preset, CONFIG_FILE))
    return {name: config["config"][name] for name in cls.config_arguments() if name in config["config"]}


def tokenizer_settings(preset):
    """The tokenizer of `preset` as `training.preprocessing.tokenizer.wordpiece_tokenizer`'s arguments:
    dict(path=the vocabulary, lowercase, strip_accents)."""
    preset = resolve(preset)
    settings = _read(preset, TOKENIZER_FILE)
    return {
        "path": os.path.join(str(preset), settings["vocabulary"]),
        "lowercase": settings["lowercase"],
        "strip_accents": settings["strip_accents"],
    }


def trained_sequence_length(preset):
    """The sequence length `preset` records having been trained at (tokenizer.json), or None."""
    return _read(resolve(preset), TOKENIZER_FILE).get("sequence_length")


def serving_length(preset):
    """The length `preset` embeds and exports at by default (tokenizer.json's `serving_length`: a shipped
    sentence encoder records its teacher's, 256), or None: then the length it was trained at."""
    folder = resolve(preset)
    return checked_length(
        _read(folder, TOKENIZER_FILE).get("serving_length"), os.path.join(folder, TOKENIZER_FILE), "serving_length"
    )


def checked_length(length, path, field):
    """A sequence length recorded in the file `path` under `field`: None, or an integer of at least 3 ([CLS] a
    token [SEP]); anything else is one ValueError naming the file, the field and the value."""
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 3):
        raise ValueError(f"{path}: `{field}` must be an integer of at least 3. Received: {field}={length!r}")
    return length


def head_pooling(embedding):
    """The pooling a new head reads from an encoder trained to give the sentence `embedding` (a preset's or a
    run's: "mean", "normalized_mean" or None): its mean token vector, not normalised ("mean"), else "cls".
    Measured fine-tuning the shipped student on WordNet topics (docs/tasks.md): a unit-length input kept the
    loss near ln(classes) after 3 epochs at lr 2e-5 (the served probabilities nearly uniform)."""
    return "mean" if embedding in ("mean", "normalized_mean") else "cls"


def sentence_embedding(preset):
    """The sentence embedding `preset` was trained to give (tokenizer.json's `embedding`, e.g.
    "normalized_mean" for a distilled sentence encoder), or None for a plain encoder or one saved without a tokenizer."""
    preset = resolve(preset)
    return (
        _read(preset, TOKENIZER_FILE).get("embedding")
        if os.path.isfile(os.path.join(str(preset), TOKENIZER_FILE))
        else None
    )


def save_tokenizer(
    preset, vocabulary_text, lowercase, strip_accents, sequence_length=None, embedding=None, serving_length=None
):
    """Writes tokenizer.json and the vocabulary asset of `preset`; `sequence_length`, when given, is the
    length the encoder was trained at; `serving_length`, the length `SentenceEncoder.from_preset` and
    `concise-export` default to where it differs (else they take `sequence_length`); `embedding`, the
    sentence embedding it was trained to give (what `concise-export` serves by default)."""
    os.makedirs(os.path.join(str(preset), os.path.dirname(VOCABULARY_ASSET)), exist_ok=True)
    with open(os.path.join(str(preset), VOCABULARY_ASSET), "w", encoding="utf-8") as file:
        file.write(vocabulary_text)
    settings = {"vocabulary": VOCABULARY_ASSET, "lowercase": lowercase, "strip_accents": strip_accents}
    recorded = {"sequence_length": sequence_length, "serving_length": serving_length, "embedding": embedding}
    _write(preset, TOKENIZER_FILE, {**settings, **{key: value for key, value in recorded.items() if value is not None}})
    if os.path.isfile(os.path.join(str(preset), MANIFEST_FILE)):
        write_manifest(preset)  # the tokenizer joins the preset's manifest
