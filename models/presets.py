"""Keras 3 preset directories in keras-hub's layout: `from_preset` and `save_to_preset`.

    PRESET/config.json                       the backbone (`keras.saving.serialize_keras_object`)
    PRESET/model.weights.h5                  its weights
    PRESET/metadata.json                     Keras version, parameter count
    PRESET/task.json, task.weights.h5        the task model around the backbone, when saved from
                                             one (e.g. `BertPretrainer`): config and weights
                                             (the backbone's included)
    PRESET/tokenizer.json                    the tokenizer's settings (written by the exporter):
    PRESET/assets/tokenizer/vocabulary.txt   `lowercase`, `strip_accents`, the vocabulary asset

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

import json
import os

import keras

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
TASK_CONFIG_FILE = "task.json"
TASK_WEIGHTS_FILE = "task.weights.h5"
METADATA_FILE = "metadata.json"
TOKENIZER_FILE = "tokenizer.json"
VOCABULARY_ASSET = "assets/tokenizer/vocabulary.txt"


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


def save_to_preset(model, preset):
    """Writes `model` (a backbone, or a task model with `.encoder`) as a preset into the folder `preset`."""
    os.makedirs(str(preset), exist_ok=True)
    backbone = getattr(model, "encoder", model)
    _write(preset, CONFIG_FILE, keras.saving.serialize_keras_object(backbone))
    backbone.save_weights(os.path.join(str(preset), WEIGHTS_FILE))
    if backbone is not model:
        _write(preset, TASK_CONFIG_FILE, keras.saving.serialize_keras_object(model))
        model.save_weights(os.path.join(str(preset), TASK_WEIGHTS_FILE))
    _write(preset, METADATA_FILE, {"keras_version": keras.version(), "parameter_count": backbone.count_params()})


class PresetMixin:
    """`from_preset` and `save_to_preset` for a backbone (`BertEncoder`)."""

    @classmethod
    def from_preset(cls, preset, **kwargs):
        """The backbone of `preset`, weights loaded; `kwargs` change constructor arguments
        that do not change the weights (e.g. `dropout=0.0`)."""
        config = _read(preset, CONFIG_FILE)
        _check_class(config, cls, os.path.join(str(preset), CONFIG_FILE))
        model = cls.from_config({**config["config"], **kwargs})
        model.load_weights(os.path.join(str(preset), WEIGHTS_FILE))
        return model

    save_to_preset = save_to_preset


class TaskPresetMixin:
    """`from_preset` and `save_to_preset` for a task model around a backbone (`self.encoder`)."""

    @classmethod
    def from_preset(cls, preset, **kwargs):
        """The task model saved in `preset` (task.json of this class, no `kwargs`), else a new
        head of this class, built with `kwargs`, on the preset's backbone."""
        task_path = os.path.join(str(preset), TASK_CONFIG_FILE)
        if not kwargs and os.path.isfile(task_path):
            config = _read(preset, TASK_CONFIG_FILE)
            if config.get("registered_name") == keras.saving.get_registered_name(cls):
                model = keras.saving.deserialize_keras_object(config)
                model.load_weights(os.path.join(str(preset), TASK_WEIGHTS_FILE))
                return model
        backbone = keras.saving.deserialize_keras_object(_read(preset, CONFIG_FILE))
        backbone.load_weights(os.path.join(str(preset), WEIGHTS_FILE))
        return cls(backbone, **kwargs)

    save_to_preset = save_to_preset


def tokenizer_settings(preset):
    """The tokenizer of `preset` as `training.tokenizer.wordpiece_tokenizer`'s arguments:
    dict(path=the vocabulary, lowercase, strip_accents)."""
    settings = _read(preset, TOKENIZER_FILE)
    return {"path": os.path.join(str(preset), settings["vocabulary"]), "lowercase": settings["lowercase"],
            "strip_accents": settings["strip_accents"]}


def save_tokenizer(preset, vocabulary_text, lowercase, strip_accents):
    """Writes tokenizer.json and the vocabulary asset of `preset`."""
    os.makedirs(os.path.join(str(preset), os.path.dirname(VOCABULARY_ASSET)), exist_ok=True)
    with open(os.path.join(str(preset), VOCABULARY_ASSET), "w", encoding="utf-8") as file:
        file.write(vocabulary_text)
    _write(preset, TOKENIZER_FILE, {"vocabulary": VOCABULARY_ASSET, "lowercase": lowercase, "strip_accents": strip_accents})
