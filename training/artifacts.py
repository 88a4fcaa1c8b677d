"""A model on disk, read by this one module: a shipped preset (by name), a Keras preset folder, a TF-Hub export of
this project (`concise-export`'s OUT, or one OUT/hub/<version>), a run directory (local or gs://) or a
`concise-collaborative` output, and a Hugging Face folder (BERT; MPNet, sentence-transformers' too).

    >>> model = load("concise-minilm-d192")          # or a folder of any kind above
    >>> model.backbone, model.task_model, model.config, model.tokenizer, model.pooling

`read(path)` is what it holds without its weights (a `Source`: architecture, files, tokenizer settings, the sentence
embedding it was trained to give, lengths); `load(path)` adds the backbone, weights loaded. A run's task model
(backbone + head) needs its task, which sits above this module: `training.run.runs.load` builds it around what
this module reads. Fine-tuning, distillation, export, conversion, evaluation and `SentenceEncoder` all read here;
`load_weights_into` puts a source's weights into a model built elsewhere (under a distribution strategy).
"""

import dataclasses
import hashlib
import os
import tempfile

import tensorflow as tf

from concise_attention.models import BUILDERS
from concise_attention.models import presets
from concise_attention.models.attention import check_nested_attention
from concise_attention.models.bert import BertEncoder
from concise_attention.models.hf_import import bert_named_tokens
from concise_attention.models.hf_import import check_tokenizer_agrees
from concise_attention.models.hf_import import hf_bert_config
from concise_attention.models.hf_import import hf_tokenizer_settings
from concise_attention.models.hf_import import load_hf_model
from concise_attention.models.hf_import import load_hf_weights
from concise_attention.models.hf_import import read_hf_config
from concise_attention.training import files
from concise_attention.training.files import BACKBONE_WEIGHTS
from concise_attention.training.files import CONFIG
from concise_attention.training.files import MODEL_WEIGHTS
from concise_attention.training.files import VOCABULARY
from concise_attention.training.files import join
from concise_attention.training.files import load_weights
from concise_attention.training.files import read_json
from concise_attention.training.preprocessing.text import read_vocabulary
from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer

DEFAULT_SERVING_LENGTH = 128
DISTILLED_EMBEDDING = "normalized_mean"  # what a distill run's student is trained to give: its teacher's pooling


@dataclasses.dataclass(frozen=True)
class Source:
    """A trained model to start from: its architecture, weights and tokenizer.

    Args:
        path: the folder it was read from.
        kind: "run" (a run directory or a `concise-collaborative` output), "preset" (a Keras preset
            folder) or "hf" (a Hugging Face folder).
        model_type, model: the builder and its arguments.
        weights: the backbone weights file; vocabulary: vocab.txt.
        tokenizer: dict(lowercase, strip_accents).
        task: the task section of the run that wrote it, else None.
        model_weights: the whole task model's weights (backbone + head) where a run has them, else None.
        name: the run's config name, or the folder's name.
        sequence_length: the length it was trained at, if recorded.
        embedding: the sentence embedding it was trained to give ("normalized_mean", "mean"), else None.
        recorded_serving_length: the length it records to serve at (a preset, a sentence-transformers folder).
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
    embedding: str = None
    recorded_serving_length: int = None

    @property
    def serving_length(self):
        """The length to serve and embed at by default: the one a preset records for serving (a shipped
        sentence encoder: its teacher's), else the one it was trained at where it records one (a run), else
        DEFAULT_SERVING_LENGTH, never beyond its position embeddings."""
        limit = self.model.get("max_sequence_length", DEFAULT_SERVING_LENGTH)
        return min(self.recorded_serving_length or self.sequence_length or DEFAULT_SERVING_LENGTH, limit)


def is_hf_folder(path):
    return tf.io.gfile.exists(join(path, "model.safetensors"))


def read(path, kind=None):
    """What a model on disk holds (module docstring), as a `Source`; no weights are read.

    Args:
        path: a shipped preset's name or a folder.
        kind: "hf" or "run" to insist on one (the error then says what is missing), or None.
    """
    path = str(path)
    if not tf.io.gfile.isdir(path):
        if kind is None and path in presets.shipped_presets():
            return _read_preset(presets.resolve(path))
        raise ValueError(
            f"Not a directory: {path!r} (expected a run directory, a Hugging Face folder, a preset folder, "
            f"a TF-Hub export or a shipped preset: {', '.join(presets.shipped_presets()) or 'none is shipped'})."
        )
    if kind == "hf" and not is_hf_folder(path):
        raise ValueError(f"{path} has no model.safetensors: not a Hugging Face BERT folder.")
    if kind != "run" and is_hf_folder(path):
        return _read_hf_folder(path)
    preset = _preset_in(path) if kind is None else None
    if preset is not None:
        return _read_preset(presets.resolve(preset))
    return _read_run(path)


def _preset_in(path):
    """The Keras preset folder `path` is or holds: itself, a TF-Hub export version's keras/ (OUT/hub/<version>), or
    an export folder's newest version's (OUT); None for anything else."""
    hub = join(path, "hub")
    versions = [name.rstrip("/") for name in tf.io.gfile.listdir(hub)] if tf.io.gfile.isdir(hub) else []
    newest = max((int(version) for version in versions if version.isdigit()), default=None)
    candidates = [path, join(path, "keras")] + ([join(join(hub, str(newest)), "keras")] if newest is not None else [])
    return next((folder for folder in candidates if is_preset_folder(folder)), None)


def _read_run(path):
    """A run directory (or a `concise-collaborative` output) as a `Source`."""
    config = read_json(join(path, CONFIG))
    for key in ("model_type", "model"):
        if key not in config:
            raise ValueError(f"{join(path, CONFIG)} has no `{key}`: not a run directory.")
    weights = join(path, BACKBONE_WEIGHTS)
    if not tf.io.gfile.exists(weights):
        raise ValueError(f"{path} has no {BACKBONE_WEIGHTS}: the run has not finished (or is not a run directory).")
    model = check_nested_attention(config["model"])
    model_weights = join(path, MODEL_WEIGHTS)
    return Source(
        path,
        "run",
        config["model_type"],
        model,
        weights,
        join(path, VOCABULARY),
        saved_tokenizer_settings(config, join(path, CONFIG)),
        config.get("task"),
        model_weights=model_weights if tf.io.gfile.exists(model_weights) else None,
        name=config.get("name") or _basename(path),
        sequence_length=(config.get("training") or {}).get("sequence_length"),
        embedding=_run_embedding(config.get("task") or {}),
    )


def _run_embedding(task):
    """The sentence embedding a run's encoder gives: a distill run's student its teacher's pooling; a head trained on
    the mean token vector (`task.pooling`) that mean; else None (a plain encoder: its [CLS] pooled output)."""
    if task.get("name") == "distill":
        return DISTILLED_EMBEDDING
    return task.get("pooling") if task.get("pooling") in ("mean", "normalized_mean") else None


def is_preset_folder(path):
    return tf.io.gfile.exists(join(path, presets.METADATA_FILE)) and tf.io.gfile.exists(
        join(path, presets.TOKENIZER_FILE)
    )


def _read_preset(path):
    """A Keras preset folder (`models.presets`; a shipped preset's) as a source: its BERT encoder."""
    model = presets.backbone_arguments(path, BertEncoder)
    settings = presets.tokenizer_settings(path)
    return Source(
        path,
        "preset",
        "bert",
        model,
        join(path, presets.WEIGHTS_FILE),
        settings["path"],
        {"lowercase": settings["lowercase"], "strip_accents": settings["strip_accents"]},
        name=_basename(path),
        sequence_length=presets.trained_sequence_length(path),
        embedding=presets.sentence_embedding(path),
        recorded_serving_length=presets.serving_length(path),
    )


def _read_hf_folder(path):
    model, tokenizer = hf_bert_config(path), hf_tokenizer_settings(path)
    tokens = read_vocabulary(join(path, VOCABULARY))
    check_tokenizer_agrees(path, tokens)
    serving_length, embedding = sentence_transformers_settings(path)
    vocabulary = (
        join(path, VOCABULARY)
        if read_hf_config(path)["model_type"] == "bert"
        else bert_named_vocabulary(bert_named_tokens(tokens))
    )
    return Source(
        path,
        "hf",
        "bert",
        model,
        join(path, "model.safetensors"),
        vocabulary,
        tokenizer,
        name=_basename(path),
        embedding=embedding,
        recorded_serving_length=serving_length,
    )


def bert_named_vocabulary(tokens):
    """A vocab.txt of `tokens` (an MPNet folder's, with BERT's special-token names at MPNet's ids:
    `hf_import.bert_named_tokens`), kept in the per-user cache under its own sha256 and verified when read again (in
    the temporary directory where the cache cannot be written): the vocabulary its tokenizer, exports and presets use."""
    text = "\n".join(tokens) + "\n"
    name = f"bert-named-{hashlib.sha256(text.encode('utf-8')).hexdigest()}"
    for folder in (
        files.user_cache("vocabularies"),
        os.path.join(tempfile.gettempdir(), "concise_attention_vocabularies"),
    ):
        base = os.path.join(folder, name)
        try:
            if files.read_verified(base, ".txt") is not None:
                return base + ".txt"
        except ValueError:
            pass  # a damaged copy: written again below
        try:
            files.write_verified(base, ".txt", text)
            return base + ".txt"
        except (OSError, tf.errors.OpError):
            continue
    raise ValueError(
        f"The BERT-named vocabulary could not be written to the cache ({files.user_cache('vocabularies')}) "
        "nor to the temporary directory"
    )


def sentence_transformers_settings(path):
    """(max_seq_length, embedding) of a sentence-transformers folder: its sentence_bert_config.json's
    max_seq_length (None without the file) and, from the modules modules.json lists, "normalized_mean" (mean
    pooling, then Normalize), "mean" (mean pooling alone) or a description of any other pipeline (CLS or
    max pooling, a Dense layer...), which `check_mean_pooling` refuses; (None, None) for a plain Hugging Face
    BERT folder. A file that says something else is one ValueError naming it."""
    settings_file, modules_file = join(path, "sentence_bert_config.json"), join(path, "modules.json")
    length = read_json(settings_file).get("max_seq_length") if tf.io.gfile.exists(settings_file) else None
    length = presets.checked_length(length, settings_file, "max_seq_length")
    if not tf.io.gfile.exists(modules_file):
        return length, None
    modules = read_json(modules_file, kind=list)
    if not all(isinstance(module, dict) and isinstance(module.get("type"), str) for module in modules):
        raise ValueError(f"{modules_file}: expected a list of modules, each with a `type`. Received: {modules!r:.200}")
    kinds = [module["type"].rsplit(".", 1)[-1] for module in modules]
    if kinds[:2] != ["Transformer", "Pooling"] or any(kind != "Normalize" for kind in kinds[2:]):
        return length, " + ".join(kinds)
    pooling_file = join(join(path, modules[1].get("path") or ""), "config.json")
    modes = [
        key[len("pooling_mode_") :]
        for key, value in read_json(pooling_file).items()
        if key.startswith("pooling_mode_") and value is True
    ]
    if modes != ["mean_tokens"]:
        return length, f"{' + '.join(modes) or 'no'} pooling"
    return length, DISTILLED_EMBEDDING if "Normalize" in kinds else "mean"


def check_mean_pooling(source):
    """Refuses a source whose sentence embedding is not the mean of its token vectors (a sentence-transformers
    folder with CLS or max pooling, or a Dense layer): `SentenceEncoder` and the exports compute mean pooling."""
    if source.embedding not in (None, "mean", DISTILLED_EMBEDDING):
        raise ValueError(
            f"{source.path}: its sentence-transformers modules give the sentence embedding by {source.embedding} "
            f"(modules.json), which this project does not compute: it pools by the mean of the token vectors."
        )


def _basename(path):
    return os.path.basename(path.rstrip("/")) or "model"


def saved_tokenizer_settings(config, config_path):
    """dict(lowercase, strip_accents) of a run's config: its `tokenizer` section, else what
    runs written before it had (`training.strip_accents`; uncased); a bad value names the field."""
    tokenizer, training = config.get("tokenizer") or {}, config.get("training") or {}
    lowercase = True if tokenizer.get("lowercase") is None else tokenizer["lowercase"]  # None: BERT-uncased
    strip_accents = tokenizer.get("strip_accents", training.get("strip_accents"))
    if not isinstance(lowercase, bool):
        raise ValueError(f"{config_path}: `tokenizer.lowercase` must be true or false. Received: {lowercase!r}")
    if strip_accents is not None and not isinstance(strip_accents, bool):
        raise ValueError(
            f"{config_path}: `tokenizer.strip_accents` must be true, false or null. Received: {strip_accents!r}"
        )
    return {"lowercase": lowercase, "strip_accents": strip_accents}


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A model on disk, weights loaded (`load`).

    source: what `read` found; backbone: its encoder (`BertEncoder`) or `CausalLM`, float32; task_model: the task
    model around it where the source holds a head (a run's model.weights.h5: `BertClassifier`, `BertPretrainer`...,
    from `training.run.runs.load`; a Hugging Face checkpoint's MLM head), else None; config: a run's
    `ExperimentConfig` where it has a task model.
    """

    source: Source
    backbone: object
    task_model: object = None
    config: object = None

    @property
    def tokenizer(self):
        """Its WordPiece tokenizer (`training.preprocessing.tokenizer`), as the source's settings say."""
        settings = self.source.tokenizer
        return wordpiece_tokenizer(
            self.source.vocabulary,
            lowercase=settings.get("lowercase", True),
            strip_accents=settings.get("strip_accents"),
        )

    @property
    def pooling(self):
        """The sentence embedding it was trained to give ("normalized_mean", "mean"), None for a plain encoder."""
        return self.source.embedding


def load(path, kind=None):
    """The model on disk at `path` (a shipped preset's name or a folder: module docstring), weights loaded: its
    backbone, and a Hugging Face checkpoint's MLM head where it has one. A run's task model is built by its task
    (`training.run.runs.load`, which reads it with this module)."""
    return from_source(read(path, kind))


def from_source(source):
    """`load` of what `read` found."""
    if source.kind == "hf":
        return LoadedModel(source, *load_hf_model(source.path))
    return LoadedModel(source, load_backbone(source))


def load_backbone(source):
    """The backbone a `Source` holds, weights loaded, float32 (a run's or conversion's backbone.weights.h5)."""
    if source.kind == "preset":
        return BertEncoder.from_preset(source.path)
    if source.kind == "hf":
        return load_hf_model(source.path)[0]
    backbone = BUILDERS[source.model_type](**source.model, dtype="float32")  # whatever precision it trained under
    load_weights(backbone, source.weights)
    return backbone


def load_weights_into(model, source, head=False):
    """Copies the weights of `source` into a model of its architecture built elsewhere (under a distribution
    strategy): the whole task model's (`head`: a run's model.weights.h5), else the backbone's."""
    if head:
        load_weights(model, source.model_weights)
    elif source.kind == "hf":
        load_hf_weights(model, source.path)
    else:
        load_weights(model, source.weights)
