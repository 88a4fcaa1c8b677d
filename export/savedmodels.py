"""Exporting a trained BERT as it is: TF-Hub encoder + preprocessor, Keras 3 preset, TF Serving
model, tarball; from a run directory, a `concise-collaborative` output or a Hugging Face BERT
folder alike (all read by `training.run.runs.load`: `training.artifacts`, with a run's task model), with no training.

    OUT/hub/<version>/encoder/           TF-Hub BERT encoder (reusable SavedModel, `.mlm` when the
                                         source has an MLM head)
    OUT/hub/<version>/preprocess/        TF-Hub BERT preprocessor (`.tokenize`, `.bert_pack_inputs`)
    OUT/hub/<version>/keras/             Keras 3 preset (`models.presets`, keras-hub's layout):
                                         `BertEncoder.from_preset` fine-tunes it with any optimizer
    OUT/hub/<version>/hub.tar.gz         encoder/ + preprocess/, for upload to a model hub
    OUT/hub/<version>/onnx/              with `onnx=True`: the encoder as ONNX with a `tokenizers` tokenizer.json and
                                         sentence-transformers' pooling config (`export.onnx`)
    OUT/hub/<version>/export.json        the export's settings, the source's model and export id
    OUT/serving/<version>/               TF Serving SavedModel (+ assets.extra/tf_serving_warmup_requests,
                                         assets.extra/export.json: the same export id)
    OUT/serving/models.config            TF Serving model config (base_path /models/<name>)

The contracts are those of tf-models-official's `export_tfhub` (the TF-Hub BERT family):
the encoder maps `input_word_ids`, `input_mask`, `input_type_ids` (int32 [batch, seq]) to
`pooled_output`, `default` (= pooled_output), `sequence_output` and `encoder_outputs`, is
callable with `training=` and exposes `variables`, `trainable_variables` and
`regularization_losses`, so `hub.KerasLayer(path, trainable=True)` fine-tunes it; `serve`
is a Keras-3 endpoint for `keras.layers.TFSMLayer`. The preprocessor's `.tokenize` and
`.bert_pack_inputs` each carry the tokenizer (its tables), so a tf_keras model built from
`hub.KerasLayer(preprocess.tokenize)` saves. Every graph uses core TensorFlow ops only (the
tokenizer is `training.preprocessing.text.WordPieceModule`, the one tokenizer of training and serving), so stock TF
Serving runs the serving model (an `xla=True` export's needs its --xla_cpu_compilation_enabled=true) and none of the
artifacts needs tensorflow-text to load.

A version is written into a staging folder and committed by `export.commit` (a journal,
then renames; see there what readers and TF Serving see meanwhile): at every instant each
half of a version is absent, complete-old or complete-new; a failed export leaves OUT as it
was; an export killed after its commit point is finished by the next one; an existing
version is replaced only with `overwrite=True`. OUT may be on an object store (gs://):
the version is then staged locally and committed through `GFileStore`.
"""

import contextlib
import json
import os
import posixpath
import re
import shutil
import tarfile
import tempfile

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import model_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_log_pb2

# Private: the save context under which `_save` traces (TensorFlow's public API has no way to trace for a save).
from tensorflow.python.saved_model import save_context

from concise_attention.export import commit
from concise_attention.export import onnx as onnx_export
from concise_attention.export.chunking import bucket_lengths
from concise_attention.export.chunking import checked_texts
from concise_attention.export.chunking import chunked
from concise_attention.export.chunking import text_input
from concise_attention.models import presets
from concise_attention.models.heads import POOLINGS
from concise_attention.models.heads import pool
from concise_attention.training import artifacts
from concise_attention.training.run import runs
from concise_attention.training.preprocessing.text import WordPieceModule
from concise_attention.training.preprocessing.text import read_vocabulary
from concise_attention.training.run import configs
from concise_attention.training.tasks import make_task

ENCODER_INPUTS = ("input_word_ids", "input_mask", "input_type_ids")
SAFE_MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
SAVE_OPTIONS = tf.saved_model.SaveOptions()
WARMUP_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "",
    "Fixed head size attention keeps each head expressive.",
)


def _id_specs(names=ENCODER_INPUTS):
    return {name: tf.TensorSpec([None, None], tf.int32, name=name) for name in names}


def inference(encoder):
    """The encoder at inference as one tf.function of the encoder inputs: traced once per export and called
    by every graph that runs the encoder so (the hub encoder's `__call__`, `.mlm` and `serve`, the serving
    model's chunks and `serve_token_ids`), instead of being traced again into each of them."""
    return tf.function(lambda inputs: encoder(inputs, training=False), input_signature=[_id_specs()], autograph=False)


def _encoder_outputs(encoder, inputs, training, infer, pooling="mean", sentence=False):
    """The TF-Hub encoder's outputs, with `embedding` (`models.heads.pool` by `pooling`); a sentence encoder's
    `pooled_output` and `default` are that embedding (its [CLS] pooler was never trained)."""
    inputs = {name: inputs[name] for name in ENCODER_INPUTS}
    outputs = encoder(inputs, training=True) if training else infer(inputs)
    embedding = pool(outputs, inputs["input_mask"], pooling)
    summary = embedding if sentence else outputs["pooled_output"]
    return {
        "pooled_output": summary,
        "default": summary,
        "embedding": embedding,
        "sequence_output": outputs["sequence_output"],
        "encoder_outputs": list(outputs["encoder_outputs"]),
    }


def _variables(model):
    """The tf.Variables behind a Keras model's variables (what the traced graphs capture)."""
    return [variable.value for variable in model.variables]


class _Reusable(tf.Module):
    """A reusable SavedModel object: `__call__(inputs, training)` + its variable lists."""

    # tf.Module computes these two as properties, which a SavedModel does not keep; the
    # reusable-SavedModel contract (hub.KerasLayer) needs them as saved attributes.
    variables = None
    trainable_variables = None

    def __init__(self, model, call, input_specs, unused=()):
        super().__init__()
        self.variables = _variables(model)
        # `unused`: variables no output reaches (a sentence encoder's [CLS] pooler), not offered for training: a
        # trainable hub.KerasLayer would warn at every step that they have no gradients
        left_out = {id(variable) for variable in unused}
        self.trainable_variables = [
            variable.value for variable in model.trainable_variables if id(variable) not in left_out
        ]
        self.regularization_losses = []
        self.__call__ = tf.function(call)
        for training in (False, True):
            self.__call__.get_concrete_function(input_specs, training=training)


def hub_encoder(encoder, vocabulary, lowercase, pretrainer=None, infer=None, pooling="mean", sentence=False):
    """The TF-Hub encoder object of a `BertEncoder`; a `BertPretrainer` around it adds `.mlm`.
    `infer`: the encoder's `inference` function, if the caller has one to share; `pooling`, `sentence`:
    its `embedding` output and whether it is a sentence encoder (`_encoder_outputs`)."""
    infer = infer or inference(encoder)

    def call(inputs, training=False):
        return _encoder_outputs(encoder, inputs, training, infer, pooling, sentence)

    def call_mlm(inputs, training=False):
        outputs = _encoder_outputs(encoder, inputs, training, infer, pooling, sentence)
        outputs["mlm_logits"] = pretrainer.masked_lm_logits(
            outputs["encoder_outputs"][-1], inputs["masked_lm_positions"]
        )
        return outputs

    unused = encoder.pooler.trainable_variables if sentence else ()
    root = _Reusable(encoder, call, _id_specs(), unused)
    if pretrainer is not None:
        root.mlm = _Reusable(pretrainer, call_mlm, _id_specs((*ENCODER_INPUTS, "masked_lm_positions")), unused)
    root.vocab_file = tf.saved_model.Asset(str(vocabulary))
    root.do_lower_case = tf.Variable(lowercase, trainable=False, name="do_lower_case")

    def serve(inputs):
        outputs = _encoder_outputs(encoder, inputs, False, infer, pooling, sentence)
        outputs.pop("encoder_outputs")
        return outputs

    root.serve = tf.function(serve, input_signature=[_id_specs()])
    signature = tf.function(lambda **inputs: root.serve(inputs), input_signature=None)
    signatures = {"serving_default": signature.get_concrete_function(**_id_specs())}
    return root, signatures


def _holding(tokenizer):
    """A sub-object that carries the tokenizer: whoever keeps only this object (a tf_keras
    model around `hub.KerasLayer(preprocess.tokenize)`) keeps the tables its graphs use."""
    module = tf.Module()
    module.tokenizer = tokenizer
    return module


def hub_preprocessor(tokenizer, seq_length):
    """The TF-Hub preprocessor: string [batch] -> encoder inputs at `seq_length`."""
    root = _holding(tokenizer)
    text_spec = text_input("text")

    # Served, a request's `text` reaches the graph unchecked (TF Serving checks no shape): `checked_texts` refuses it by name.
    root.__call__ = tf.function(
        lambda text: tokenizer.encode(checked_texts([text], ["text"])[0], seq_length), input_signature=[text_spec]
    )
    root.tokenize = _holding(tokenizer)
    root.tokenize.__call__ = tf.function(
        lambda text: tokenizer.tokenize(checked_texts([text], ["text"])[0]), input_signature=[text_spec]
    )
    root.tokenize.get_special_tokens_dict = _holding(tokenizer)
    # The keys of tf-models-official's BertTokenizer.get_special_tokens_dict (what BertPackInputs takes).
    special = {
        "start_of_sequence_id": "[CLS]",
        "end_of_segment_id": "[SEP]",
        "padding_id": "[PAD]",
        "mask_id": "[MASK]",
    }
    root.tokenize.get_special_tokens_dict.__call__ = tf.function(
        lambda: {
            "vocab_size": tf.cast(tokenizer.vocab_table.size(), tf.int32),
            **{key: tf.constant(tokenizer.special_ids[token], tf.int32) for key, token in special.items()},
        },
        input_signature=[],
    )

    @tf.function(autograph=False)
    def bert_pack_inputs(inputs, seq_length=seq_length):
        return tokenizer.pack(list(inputs), seq_length)

    for segments in (1, 2):
        for ragged_rank in (1, 2):
            specs = [
                tf.RaggedTensorSpec([None] * (ragged_rank + 1), tf.int32, ragged_rank=ragged_rank)
                for _ in range(segments)
            ]
            # As `_save` lists it again (positional, named): found traced, not traced twice.
            bert_pack_inputs.get_concrete_function(specs, tf.TensorSpec([], tf.int32, name="seq_length"))
    root.bert_pack_inputs = _holding(tokenizer)
    root.bert_pack_inputs.__call__ = bert_pack_inputs
    signatures = {"serving_default": root.__call__.get_concrete_function()}
    return root, signatures


# An XLA-compiled request of one text is padded to a multiple of this: ceil(seq_length / 16) compilations.
XLA_BUCKET = 16


def serving_model(encoder, tokenizer, seq_length, pooling="mean", infer=None, xla=False):
    """The TF Serving model and its signatures: `serving_default` (text -> `embedding` [batch, hidden],
    in length-sorted chunks: `export.chunking`), `serve_token_ids` (ids as sent -> `embedding` and
    `sequence_output`) and `tokenize` (text -> the encoder inputs at `seq_length`). `infer`: the
    encoder's `inference` function, if the caller has one. With `xla`, a one-text request runs compiled
    by XLA, padded to a multiple of XLA_BUCKET tokens; TF Serving then needs --xla_cpu_compilation_enabled=true.
    """
    root = _holding(tokenizer)
    root.encoder_variables = _variables(encoder)  # what the graphs capture must be tracked
    infer = infer or inference(encoder)

    def embed(inputs):
        outputs = infer({name: inputs[name] for name in ENCODER_INPUTS})
        return {
            "embedding": pool(outputs, inputs["input_mask"], pooling),
            "sequence_output": outputs["sequence_output"],
        }

    def embedding(inputs):
        return {"embedding": embed(inputs)["embedding"]}

    one_row = (tf.function(embedding, jit_compile=True, autograph=False), XLA_BUCKET) if xla else None

    def embed_text(text):  # length-sorted chunks, each padded to its own longest text: bounded memory
        return chunked([text], tokenizer, seq_length, embedding, ENCODER_INPUTS, one_row=one_row)

    root.serve_text = tf.function(embed_text, input_signature=[text_input("text")])

    def embed_ids(**inputs):  # ids as sent: outside the vocabulary or the segment types is an InvalidArgument
        vocabulary, types = encoder.get_config()["vocab_size"], encoder.get_config()["type_vocab_size"]
        checks = [
            tf.debugging.assert_non_negative(inputs[name], message=f"{name} must be >= 0") for name in ENCODER_INPUTS
        ]
        checks.append(
            tf.debugging.assert_less(
                inputs["input_word_ids"], vocabulary, message=f"input_word_ids must be < {vocabulary}"
            )
        )
        if types:  # an encoder without segment types (MPNet) ignores input_type_ids
            checks.append(
                tf.debugging.assert_less(inputs["input_type_ids"], types, message=f"input_type_ids must be < {types}")
            )
        with tf.control_dependencies(checks):
            return embed({name: tf.identity(inputs[name]) for name in ENCODER_INPUTS})

    root.serve_token_ids = tf.function(embed_ids, input_signature=None)
    root.tokenize = tf.function(
        lambda text: tokenizer.encode(checked_texts([text], ["text"])[0], seq_length),
        input_signature=[text_input("text")],
    )
    signatures = {
        "serving_default": root.serve_text.get_concrete_function(),
        "serve_token_ids": root.serve_token_ids.get_concrete_function(**_id_specs()),
        "tokenize": root.tokenize.get_concrete_function(),
    }
    return root, signatures


def task_serving_model(model, tokenizer, seq_length, signature):
    """The TF Serving model of a fine-tuned task model: `serving_default` takes the task's texts
    (`signature.texts`, e.g. `text` and `text_b`), packs them as in training and returns the
    task's outputs (`signature.outputs`: e.g. `probabilities` and `label`, or `score`)."""
    root = _holding(tokenizer)
    root.model_variables = _variables(model)

    def predict(*texts):  # length-sorted chunks, each padded to its own longest pair: bounded memory
        return chunked(
            list(texts),
            tokenizer,
            seq_length,
            lambda inputs: signature.outputs({name: inputs[name] for name in ENCODER_INPUTS}),
            ENCODER_INPUTS,
            text_names=signature.texts,
        )

    root.serve_text = tf.function(predict, input_signature=[text_input(name) for name in signature.texts])
    return root, {"serving_default": root.serve_text.get_concrete_function()}


def warmup_batches(seq_length, texts=WARMUP_TEXTS):
    """The warm-up requests: one text, a few texts, then for each chunk length a request can be padded to
    (`export.chunking.bucket_lengths`) a text of that length alone and twice (a request of one row and a chunk of
    several take two paths: `export.chunking.chunked`), so that the first request of each length is not slow (and an
    `--xla` export's one-row lengths are compiled before it serves)."""
    lengths = [" ".join(["a"] * (length - 2)) for length in bucket_lengths(seq_length)]
    return [[texts[0]], list(texts)] + [[text] * rows for text in lengths for rows in (1, 2)]


def write_warmup_requests(path, model_name, seq_length, texts=WARMUP_TEXTS, inputs=("text",)):
    """TF Serving's warm-up file: PredictionLog records of `serving_default` requests (`warmup_batches`;
    every input of `inputs` gets the same texts)."""
    tf.io.gfile.makedirs(os.path.dirname(str(path)))
    with tf.io.TFRecordWriter(str(path)) as writer:
        for batch in warmup_batches(seq_length, texts):
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name="serving_default")
            )
            for name in inputs:
                request.inputs[name].CopyFrom(tf.make_tensor_proto(batch, dtype=tf.string))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())


def models_config(model_name):
    """TF Serving's --model_config_file for the docker layout (OUT/serving mounted at /models/<name>)."""
    return (
        "model_config_list {\n"
        "  config {\n"
        f'    name: "{model_name}"\n'
        f'    base_path: "/models/{model_name}"\n'
        '    model_platform: "tensorflow"\n'
        "  }\n"
        "}\n"
    )


class GFileStore:
    """`export.commit`'s file operations through tf.io.gfile, for OUT on an object store
    (gs://...), where a rename is not atomic: a move copies every file, saved_model.pb files
    after the others and the export.json markers last, then deletes the source; a removal
    deletes in the reverse order. The version is staged in a local folder, moved into OUT's
    staging folder before the journal is written. No lock: one export into an OUT at a time."""

    join = staticmethod(posixpath.join)
    exists = staticmethod(tf.io.gfile.exists)
    isdir = staticmethod(tf.io.gfile.isdir)
    listdir = staticmethod(tf.io.gfile.listdir)
    makedirs = staticmethod(tf.io.gfile.makedirs)
    lock = staticmethod(lambda folder: contextlib.nullcontext())

    @staticmethod
    def _files(folder):
        """The files under `folder` (relative paths) in the order they are written."""
        files = [
            posixpath.join(directory, name)[len(folder.rstrip("/")) + 1 :]
            for directory, _, names in tf.io.gfile.walk(folder)
            for name in names
        ]
        return sorted(
            files,
            key=lambda path: (
                posixpath.basename(path) == "export.json",
                posixpath.basename(path) == "saved_model.pb",
                path,
            ),
        )

    def move(self, source, target):
        if not tf.io.gfile.isdir(source):
            self._copy(source, target)
        else:
            for path in self._files(source):
                tf.io.gfile.makedirs(posixpath.dirname(posixpath.join(target, path)))
                self._copy(posixpath.join(source, path), posixpath.join(target, path))
        self.remove(source)

    @staticmethod
    def _copy(source, target):
        # A replayed move finds some targets written already: they are deleted first, as
        # some filesystems (TF's ram://) append instead of replacing.
        if tf.io.gfile.exists(target):
            tf.io.gfile.remove(target)
        tf.io.gfile.copy(source, target)

    def remove(self, path):
        if not tf.io.gfile.exists(path):
            return
        if tf.io.gfile.isdir(path):
            for name in reversed(self._files(path)):
                tf.io.gfile.remove(posixpath.join(path, name))
            tf.io.gfile.rmtree(path)
        else:
            tf.io.gfile.remove(path)

    @staticmethod
    def read_text(path):
        with tf.io.gfile.GFile(path, "r") as file:
            return file.read()

    @staticmethod
    def write_text(path, text):
        if tf.io.gfile.exists(path):
            tf.io.gfile.remove(path)
        with tf.io.gfile.GFile(path, "w") as file:
            file.write(text)

    @staticmethod
    def working_folder(staging):
        return tempfile.mkdtemp(prefix=commit.STAGING_PREFIX)


def _store(out_dir):
    return GFileStore() if "://" in str(out_dir) else commit.LocalStore()


# task settings that name folders of the training machine
PATH_SETTINGS = ("init", "teacher", "student_init", "data_dir", "cache_dir")


def portable_task(task):
    """A run's task settings as export.json records them: each folder by its last component only (a shipped preset
    by its name), so that no path of the training machine travels with a served model."""

    def name(path):
        return posixpath.basename(str(path).rstrip("/")) or str(path)

    if not task:
        return task
    portable = dict(task)
    for key in PATH_SETTINGS:
        value = portable.get(key)
        if value:
            portable[key] = [name(item) for item in value] if isinstance(value, list) else name(value)
    return portable


def _export_settings(source, seq_length, model_name, pooling):
    """The export's settings (recorded in export.json), checked before anything is written."""
    if source.model_type != "bert":
        raise ValueError(
            f"Only BERT models export as TF-Hub encoders. Received: model_type={source.model_type!r} ({source.path})"
        )
    if not tf.io.gfile.exists(source.vocabulary):
        raise ValueError(f"{source.path!r} has no vocab.txt.")
    read_vocabulary(source.vocabulary)  # fails now, before anything is written, if unusable
    if pooling is None:  # the sentence embedding it was trained to give, else the mean of its tokens
        artifacts.check_mean_pooling(source)
        pooling = source.embedding or "mean"
    if pooling not in POOLINGS:
        raise ValueError(f"`pooling` must be one of {', '.join(POOLINGS)}. Received: pooling={pooling!r}")
    max_length = source.model["max_sequence_length"]
    if seq_length is None:  # a run's own length (what it was trained and evaluated at), else 128
        seq_length = source.serving_length
    if isinstance(seq_length, bool) or not isinstance(seq_length, int) or not 3 <= seq_length <= max_length:
        raise ValueError(
            f"`seq_length` must be in [3, max_sequence_length={max_length}]. Received: seq_length={seq_length}"
        )
    if model_name is not None and not SAFE_MODEL_NAME.fullmatch(str(model_name)):
        raise ValueError(
            f"`model_name` must be 1-64 letters, digits and _.- (it goes into paths and models.config). "
            f"Received: model_name={model_name!r}"
        )
    default_name = re.sub(r"[^A-Za-z0-9_.-]", "_", source.name or "model")[:64].lstrip(".") or "model"
    return {
        "model_name": model_name or default_name,
        "seq_length": seq_length,
        "pooling": pooling,
        "sentence_encoder": source.embedding in ("mean", artifacts.DISTILLED_EMBEDDING),
        **source.tokenizer,
    }


def _fix_seed_states(model):
    """Dropout's seed-generator states are drawn at random when a model is built: fixed here (generator
    i of the model gets seed i + 1, distinct ones) so that the same run exported twice gives identical variables."""
    states = [variable for variable in model.variables if variable.path.endswith("seed_generator_state")]
    for index, variable in enumerate(states):
        variable.assign(np.array([index + 1, 0], dtype=variable.dtype))


def export_run(
    source,
    out_dir,
    version=None,
    overwrite=False,
    seq_length=None,
    model_name=None,
    pooling=None,
    kind=None,
    onnx=False,
    xla=False,
):
    """Exports a trained BERT: TF-Hub, TF Serving and Keras artifacts.

    `source` is what `training.artifacts.read` reads ("hf" or "run" as `kind` insists), with any task
    head it holds; `out_dir` is local or gs://. `version` defaults to one above the highest
    present; `seq_length`, `model_name` and `pooling` ("mean", "normalized_mean" or "cls") to what the
    source records (else 128, its name, "mean"). `onnx` also writes hub/<version>/onnx/; `xla` compiles an
    encoder's single texts.

    Returns the written paths, version, length, export id and what was recovered.
    """
    store = _store(out_dir)
    commit.check_out_dir(out_dir, store)
    loaded = runs.load(source, kind)
    source, encoder, model = loaded.source, loaded.backbone, loaded.task_model
    _fix_seed_states(model or encoder)
    settings = _export_settings(source, seq_length, model_name, pooling)
    if onnx:
        onnx_export.check_onnx(settings["pooling"])
    settings["onnx"] = bool(onnx)
    task = portable_task(source.task) if model is not None else None
    described = {"model_type": source.model_type, "model": source.model, "task": task, "tokenizer": source.tokenizer}
    signature = _serving_signature(described, model) if model is not None else None
    if xla and signature is not None:
        raise ValueError(
            "The XLA export (xla=True, --xla) compiles an encoder's serving model (embeddings); this source serves its task model "
            f"({task['name']}), which is not compiled"
        )
    settings["xla"] = bool(xla)
    with commit.export_version(out_dir, version, overwrite, store) as staged:
        export = {
            "version": staged.version,
            "export_id": staged.export_id,
            **settings,
            "source_kind": source.kind,
            "config": described,
        }
        _write_version(staged, encoder, model, source, export, signature)
    return _written(staged, settings["seq_length"])


def _written(staged, seq_length):
    """What `export_run` returns for the committed version `staged`."""
    hub = posixpath.join(staged.out, "hub", str(staged.version))
    return {
        "version": staged.version,
        "encoder": posixpath.join(hub, "encoder"),
        "preprocess": posixpath.join(hub, "preprocess"),
        "tarball": posixpath.join(hub, "hub.tar.gz"),
        "keras": posixpath.join(hub, "keras"),
        "serving": posixpath.join(staged.out, "serving", str(staged.version)),
        "models_config": posixpath.join(staged.out, "serving", commit.MODELS_CONFIG),
        "seq_length": seq_length,
        "export_id": staged.export_id,
        "recovered": staged.recovered,
    }


def write_keras_preset(folder, model, vocabulary, source):
    """The Keras 3 preset (`models.presets`: keras-hub's layout) of `model` (the encoder, or the task
    model around it), with the tokenizer, trained length and sentence embedding `source` records, a
    preset's model card (README.md) where it has one, and the manifest of every file's sha256; a preset's
    float16 weights stay float16."""
    half = (
        source.kind == "preset"
        and model is getattr(model, "encoder", model)
        and presets.stored_dtype(source.path) == "float16"
    )
    presets.save_to_preset(model, folder, weights_dtype="float16" if half else None)
    with tf.io.gfile.GFile(str(vocabulary), "r") as file:
        presets.save_tokenizer(
            folder,
            file.read(),
            source.tokenizer["lowercase"],
            source.tokenizer["strip_accents"],
            sequence_length=source.sequence_length,
            embedding=source.embedding,
            serving_length=source.recorded_serving_length,
        )
    card = os.path.join(source.path, "README.md")
    if source.kind == "preset" and os.path.isfile(card):
        shutil.copyfile(card, os.path.join(folder, "README.md"))
    presets.write_manifest(folder)


def _serving_signature(config, model):
    """What the exported TF Serving model of a trained task `model` serves, from its run's config mapping
    (config.json): the task's `Task.serving_signature`, None if it has no serving model."""
    return make_task(configs.config_from_dict(config, config.get("name", "run"))).serving_signature(model)


def _save(build, arguments, path):
    """Saves the object and signatures `build(*arguments)` returns, traced in the save's own context, so that
    `tf.saved_model.save` finds its functions already traced instead of tracing each again (it does when they
    were traced outside it: the variable policy of the save options is part of a trace's cache key)."""
    with save_context.save_context(SAVE_OPTIONS):
        root, signatures = build(*arguments)
    tf.saved_model.save(root, path, signatures=signatures, options=SAVE_OPTIONS)


def _write_version(staged, encoder, model, source, export, signature):
    """Writes hub/ (encoder, preprocess, tarball, keras), serving/ and models.config of a
    version of `source` into `staged.folder` (local); `signature`: what its task model serves, or None (the encoder's
    embeddings)."""
    folder = staged.folder
    # The vocabulary is copied into the staging folder first so that the assets
    # point at a file that is still there after the source is deleted.
    vocab_copy = os.path.join(folder, "vocab.txt")
    tf.io.gfile.copy(str(source.vocabulary), vocab_copy, overwrite=True)
    tokenizer = WordPieceModule(vocab_copy, lowercase=export["lowercase"], strip_accents=export["strip_accents"])
    hub_dir, serving_dir = os.path.join(folder, "hub"), os.path.join(folder, "serving")
    pretrainer = model if hasattr(model, "masked_lm_logits") else None
    infer = inference(encoder)  # traced once, for the hub encoder and the serving model
    _save(
        hub_encoder,
        (encoder, vocab_copy, export["lowercase"], pretrainer, infer, export["pooling"], export["sentence_encoder"]),
        os.path.join(hub_dir, "encoder"),
    )
    _save(hub_preprocessor, (tokenizer, export["seq_length"]), os.path.join(hub_dir, "preprocess"))
    # Level 1: float weights hardly compress, and level 9 takes several times as long on them.
    with tarfile.open(os.path.join(hub_dir, "hub.tar.gz"), "w:gz", compresslevel=1) as archive:
        for name in ("encoder", "preprocess"):
            archive.add(os.path.join(hub_dir, name), arcname=name)
    write_keras_preset(os.path.join(hub_dir, "keras"), model or encoder, vocab_copy, source)
    if export["onnx"]:
        onnx_export.write_onnx_folder(os.path.join(hub_dir, "onnx"), encoder, vocab_copy, export)
    if signature is None:  # no task model of its own to serve: the encoder's embeddings
        _save(
            serving_model,
            (encoder, tokenizer, export["seq_length"], export["pooling"], infer, export["xla"]),
            serving_dir,
        )
    else:
        _save(task_serving_model, (model, tokenizer, export["seq_length"], signature), serving_dir)
    inputs = signature.texts if signature else ("text",)
    write_warmup_requests(
        os.path.join(serving_dir, "assets.extra", "tf_serving_warmup_requests"),
        export["model_name"],
        export["seq_length"],
        inputs=inputs,
    )
    with open(os.path.join(folder, commit.MODELS_CONFIG), "w") as file:
        file.write(models_config(export["model_name"]))
    for part, marker in commit.MARKERS.items():  # the export id in both halves
        with open(os.path.join(folder, part, marker), "w") as file:
            json.dump(export, file, indent=1)
