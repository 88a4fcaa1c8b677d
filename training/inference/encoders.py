"""Sentence encoders to evaluate, by name: anything the project loads, and the cheap baselines a user already has.

    >>> encoder = load_encoder("concise-minilm-d192")      # a preset, run, Keras preset or Hugging Face folder
    >>> served = load_encoder("minilm_export")             # a `concise-export` folder: its TF Serving model
    >>> pca = TeacherPca(load_encoder(teacher_dir), fit_texts, 192)
    >>> half = half_layers(teacher_dir)

Each has `name`, `width` and `encode(texts) -> float32 (N, width)` (unit rows).
"""

import os

import numpy as np
import tensorflow as tf

from concise_attention.models import BUILDERS
from concise_attention.models.shrink import shrink_into
from concise_attention.training import artifacts
from concise_attention.training.inference.embeddings import SentenceEncoder
from concise_attention.training.inference.embeddings import unit_rows

SERVED_BATCH = 256  # texts per request to a served model (it cuts its own chunks)


class Served:
    """A TF Serving model (`serving/<version>/` of a `concise-export` folder, the newest version) used as served:
    its `serving_default` signature's `embedding` of each text, scaled to unit length."""

    def __init__(self, folder):
        self.path = serving_version(folder)
        self.name = os.path.basename(os.path.normpath(folder))
        self._serve = tf.saved_model.load(self.path).signatures["serving_default"]
        self.width = int(self._serve.structured_outputs["embedding"].shape[-1])

    def encode(self, texts):
        rows = [
            self._serve(text=tf.constant(texts[start : start + SERVED_BATCH]))["embedding"].numpy()
            for start in range(0, len(texts), SERVED_BATCH)
        ]
        return unit_rows(np.concatenate(rows) if rows else np.zeros((0, self.width), np.float32))


def serving_version(folder):
    """The SavedModel folder of a served model: `folder` itself, or the newest integer version under folder/serving/;
    None if `folder` is neither."""
    folder = str(folder)
    if tf.io.gfile.exists(os.path.join(folder, "saved_model.pb")):
        return folder
    serving = os.path.join(folder, "serving")
    versions = [name.rstrip("/") for name in tf.io.gfile.listdir(serving)] if tf.io.gfile.isdir(serving) else []
    versions = sorted((int(name) for name in versions if name.isdigit()), reverse=True)
    return os.path.join(serving, str(versions[0])) if versions else None


class Loaded:
    """A `SentenceEncoder` with a name (its source's)."""

    def __init__(self, name, sentence_encoder):
        self.name, self.sentence_encoder, self.width = name, sentence_encoder, sentence_encoder.width

    def encode(self, texts):
        return self.sentence_encoder.encode(texts)

    def pooled(self, texts, batch_size=32):
        return self.sentence_encoder.pooled(texts, batch_size)


def load_encoder(spec, sequence_length=None):
    """An encoder for `spec`: a `concise-export` folder (or one SavedModel version of it) is served; a shipped preset,
    a Keras preset folder, a run directory or a Hugging Face folder is read by `SentenceEncoder.from_preset`."""
    if tf.io.gfile.isdir(str(spec)) and serving_version(spec) is not None:
        return Served(spec)
    return Loaded(encoder_name(spec), SentenceEncoder.from_preset(spec, sequence_length))


def encoder_name(spec):
    """A Hugging Face package's `model/` folder goes by its package's name."""
    spec = os.path.normpath(str(spec))
    base = os.path.basename(spec)
    return os.path.basename(os.path.dirname(spec)) if base == "model" else base


class TeacherPca:
    """The teacher's unit embedding projected on its `width` leading principal directions (fitted on the teacher's
    embeddings of `fit_texts`), at unit length: the same cost as the teacher, a `width`-wide embedding. `centred`:
    the corpus mean subtracted first (scikit-learn's `PCA.transform`); `uncentred()`: the same directions without
    it (the mean's own projection kept, which keeps more of the teacher's cosine geometry on some tasks)."""

    def __init__(self, teacher, fit_texts, width, centred=True, pca=None):
        from sklearn.decomposition import PCA  # scikit-learn: imported only to evaluate

        self.teacher, self.width, self.centred = teacher, int(width), centred
        self.name = f"{teacher.name}, PCA to {width}" + ("" if centred else ", uncentred")
        self.pca = pca or PCA(self.width, random_state=0).fit(teacher.encode(list(fit_texts)))

    def uncentred(self):
        return TeacherPca(self.teacher, (), self.width, centred=False, pca=self.pca)

    def encode(self, texts):
        embeddings = self.teacher.encode(texts)
        projected = self.pca.transform(embeddings) if self.centred else embeddings @ self.pca.components_.T
        return unit_rows(projected.astype(np.float32))


def half_layers(spec, sequence_length=None):
    """The teacher with every other layer dropped (layers 0, 2, 4 of 6): faster, full width, no training."""
    full = SentenceEncoder.from_preset(spec, sequence_length)
    source = artifacts.read(spec)
    layers = source.model["num_layers"]
    half = BUILDERS[source.model_type](**(source.model | {"num_layers": layers // 2}))
    shrink_into(full.backbone, half)
    return Loaded(
        f"{encoder_name(spec)}, {layers // 2} of {layers} layers",
        SentenceEncoder(half, full.tokenizer, full.sequence_length),
    )
