"""Exporting a trained BERT run: TF-Hub encoder + preprocessor, TF Serving model, tarball.

    OUT/hub/<version>/encoder/           TF-Hub BERT encoder (reusable SavedModel, `.mlm`)
    OUT/hub/<version>/preprocess/        TF-Hub BERT preprocessor (`.tokenize`, `.bert_pack_inputs`)
    OUT/hub/<version>/hub.tar.gz         encoder/ + preprocess/, for upload to a model hub
    OUT/serving/<version>/               TF Serving SavedModel (+ assets.extra/tf_serving_warmup_requests)
    OUT/serving/models.config            TF Serving model config (base_path /models/<name>)

The contracts are those of tf-models-official's `export_tfhub` (the TF-Hub BERT family):
the encoder maps `input_word_ids`, `input_mask`, `input_type_ids` (int32 [batch, seq]) to
`pooled_output`, `default` (= pooled_output), `sequence_output` and `encoder_outputs`, is
callable with `training=` and exposes `variables`, `trainable_variables` and
`regularization_losses`, so `hub.KerasLayer(path, trainable=True)` fine-tunes it; `serve`
is a Keras-3 endpoint for `keras.layers.TFSMLayer`. Every graph uses core TensorFlow ops
only (the tokenizer is `export.text.WordPieceModule`), so stock TF Serving runs the
serving model and none of the artifacts needs tensorflow-text to load.

Everything is written into a staging folder inside OUT and renamed into place at the end:
an export that fails leaves nothing behind, and an existing version is replaced only
with `overwrite=True` (the old one is moved aside first and restored on failure).
"""

import json
import os
import pathlib
import shutil
import tarfile
import tempfile

import tensorflow as tf

from export.run import load_run
from training.text import WordPieceModule
from training.text import read_vocabulary

ENCODER_INPUTS = ("input_word_ids", "input_mask", "input_type_ids")
DEFAULT_SEQ_LENGTH = 128
WARMUP_TEXTS = ("The quick brown fox jumps over the lazy dog.", "", "Fixed head size attention keeps each head expressive.")


def _id_specs(names=ENCODER_INPUTS):
    return {name: tf.TensorSpec([None, None], tf.int32, name=name) for name in names}


def _encoder_outputs(encoder, inputs, training):
    outputs = encoder({name: inputs[name] for name in ENCODER_INPUTS}, training=training)
    return {
        "pooled_output": outputs["pooled_output"],
        "default": outputs["pooled_output"],
        "sequence_output": outputs["sequence_output"],
        "encoder_outputs": list(outputs["encoder_outputs"]),
    }


def _variables(model):
    """The tf.Variables behind a Keras model's variables (what the traced graphs capture)."""
    return [variable.value for variable in model.variables]


class _Reusable(tf.__internal__.tracking.AutoTrackable):
    """A reusable SavedModel object: `__call__(inputs, training)` + its variable lists."""

    def __init__(self, model, call, input_specs):
        super().__init__()
        self.variables = _variables(model)
        self.trainable_variables = [variable.value for variable in model.trainable_variables]
        self.regularization_losses = []
        self.__call__ = tf.function(call)
        for training in (False, True):
            self.__call__.get_concrete_function(input_specs, training=training)


def hub_encoder(pretrainer, vocabulary, lowercase):
    """The TF-Hub encoder object of a `BertPretrainer` (encoder + `.mlm`)."""
    encoder = pretrainer.encoder

    def call(inputs, training=False):
        return _encoder_outputs(encoder, inputs, training)

    def call_mlm(inputs, training=False):
        outputs = _encoder_outputs(encoder, inputs, training)
        outputs["mlm_logits"] = pretrainer.masked_lm_logits(outputs["sequence_output"], inputs["masked_lm_positions"])
        return outputs

    root = _Reusable(encoder, call, _id_specs())
    root.mlm = _Reusable(pretrainer, call_mlm, _id_specs((*ENCODER_INPUTS, "masked_lm_positions")))
    root.vocab_file = tf.saved_model.Asset(str(vocabulary))
    root.do_lower_case = tf.Variable(lowercase, trainable=False, name="do_lower_case")

    def serve(inputs):
        outputs = _encoder_outputs(encoder, inputs, training=False)
        outputs.pop("encoder_outputs")
        return outputs

    root.serve = tf.function(serve, input_signature=[_id_specs()])
    signature = tf.function(lambda **inputs: root.serve(inputs), input_signature=None)
    signatures = {"serving_default": signature.get_concrete_function(**_id_specs())}
    return root, signatures


def hub_preprocessor(tokenizer, seq_length):
    """The TF-Hub preprocessor: string [batch] -> encoder inputs at `seq_length`."""
    root = tf.__internal__.tracking.AutoTrackable()
    root.tokenizer = tokenizer
    text_spec = tf.TensorSpec([None], tf.string, name="text")

    root.__call__ = tf.function(lambda text: tokenizer.pack([tokenizer.tokenize(text)], seq_length), input_signature=[text_spec])
    root.tokenize = tf.__internal__.tracking.AutoTrackable()
    root.tokenize.__call__ = tf.function(tokenizer.tokenize, input_signature=[text_spec])
    root.tokenize.get_special_tokens_dict = tf.__internal__.tracking.AutoTrackable()
    # The keys of tf-models-official's BertTokenizer.get_special_tokens_dict (what BertPackInputs takes).
    special = {"start_of_sequence_id": "[CLS]", "end_of_segment_id": "[SEP]", "padding_id": "[PAD]", "mask_id": "[MASK]"}
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
            specs = [tf.RaggedTensorSpec([None] * (ragged_rank + 1), tf.int32, ragged_rank=ragged_rank) for _ in range(segments)]
            bert_pack_inputs.get_concrete_function(specs, seq_length=tf.TensorSpec([], tf.int32))
    root.bert_pack_inputs = tf.__internal__.tracking.AutoTrackable()
    root.bert_pack_inputs.__call__ = bert_pack_inputs
    signatures = {"serving_default": root.__call__.get_concrete_function()}
    return root, signatures


def serving_model(encoder, tokenizer, seq_length, pooling="mean"):
    """The TF Serving model: `serving_default` (text) and `serve_token_ids` (ids) signatures,
    both returning `embedding` [batch, hidden] and `sequence_output` [batch, seq, hidden],
    and `tokenize` (text -> the encoder inputs the first one computes)."""
    root = tf.__internal__.tracking.AutoTrackable()
    root.tokenizer = tokenizer
    root.variables = _variables(encoder)

    def embed(inputs):
        outputs = encoder({name: inputs[name] for name in ENCODER_INPUTS}, training=False)
        sequence = outputs["sequence_output"]
        if pooling == "cls":
            embedding = outputs["pooled_output"]
        else:
            mask = tf.cast(inputs["input_mask"], sequence.dtype)[:, :, None]
            embedding = tf.reduce_sum(sequence * mask, axis=1) / tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)
        return {"embedding": embedding, "sequence_output": sequence}

    root.serve_text = tf.function(
        lambda text: embed(tokenizer.pack([tokenizer.tokenize(text)], seq_length)),
        input_signature=[tf.TensorSpec([None], tf.string, name="text")],
    )
    root.serve_token_ids = tf.function(lambda **inputs: embed(inputs), input_signature=None)
    root.tokenize = tf.function(
        lambda text: tokenizer.pack([tokenizer.tokenize(text)], seq_length), input_signature=[tf.TensorSpec([None], tf.string, name="text")]
    )
    signatures = {
        "serving_default": root.serve_text.get_concrete_function(),
        "serve_token_ids": root.serve_token_ids.get_concrete_function(**_id_specs()),
        "tokenize": root.tokenize.get_concrete_function(),
    }
    return root, signatures


def write_warmup_requests(path, model_name, texts=WARMUP_TEXTS):
    """TF Serving's warm-up file: PredictionLog records of `serving_default` requests."""
    from tensorflow_serving.apis import model_pb2
    from tensorflow_serving.apis import predict_pb2
    from tensorflow_serving.apis import prediction_log_pb2

    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for batch in ([texts[0]], list(texts)):
            request = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(name=model_name, signature_name="serving_default"))
            request.inputs["text"].CopyFrom(tf.make_tensor_proto(batch, dtype=tf.string))
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


def _versions(out):
    serving = out / "serving"
    return sorted(int(path.name) for path in serving.iterdir() if path.name.isdigit()) if serving.is_dir() else []


def export_run(run_dir, out_dir, version=None, overwrite=False, seq_length=None, model_name=None, pooling="mean"):
    """Exports a BERT run to TF-Hub and TF Serving artifacts (see the module docstring).

    Args:
        run_dir: the trainer's run directory (reads config.json, model.weights.h5, vocab.txt).
        out_dir: the export directory (created; other versions in it are kept).
        version: integer version; default: one above the highest present (1 if none).
        overwrite: replace an existing version instead of failing.
        seq_length: sequence length of the preprocessor and of the serving model
            (default min(128, max_sequence_length)).
        model_name: the TF Serving model name (default: the run's config name).
        pooling: the serving `embedding`: "mean" over non-padding tokens or "cls"
            (the pooled output).

    Returns:
        dict of the written paths and the version.
    """
    config, pretrainer, vocabulary = load_run(run_dir)
    if config["model_type"] != "bert":
        raise ValueError(f"Only BERT runs export as TF-Hub encoders. Received: model_type={config['model_type']!r} ({run_dir})")
    if not vocabulary.is_file():
        raise ValueError(f"The run {str(run_dir)!r} has no vocab.txt.")
    read_vocabulary(vocabulary)  # fails now, before anything is written, if unusable
    if pooling not in ("mean", "cls"):
        raise ValueError(f"`pooling` must be 'mean' or 'cls'. Received: pooling={pooling!r}")
    max_length = config["model"]["max_sequence_length"]
    seq_length = seq_length or min(DEFAULT_SEQ_LENGTH, max_length)
    if not 3 <= seq_length <= max_length:
        raise ValueError(f"`seq_length` must be in [3, max_sequence_length={max_length}]. Received: seq_length={seq_length}")
    model_name = model_name or config.get("name") or "bert"
    out = pathlib.Path(out_dir)
    if version is None:
        version = (_versions(out) or [0])[-1] + 1
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"`version` must be a positive integer. Received: version={version!r}")
    targets = {"hub": out / "hub" / str(version), "serving": out / "serving" / str(version)}
    existing = [str(path) for path in targets.values() if path.exists()]
    if existing and not overwrite:
        raise ValueError(f"Version {version} already exists ({', '.join(existing)}); pass overwrite=True (--overwrite) to replace it.")

    training = config.get("training") or {}
    lowercase, strip_accents = True, bool(training.get("strip_accents", False))
    out.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=".export-", dir=out))
    try:
        # The vocabulary is copied into the staging folder first so that the assets
        # point at a file that is still there after the run directory is deleted.
        vocab_copy = staging / "vocab.txt"
        shutil.copyfile(vocabulary, vocab_copy)
        tokenizer = WordPieceModule(vocab_copy, lowercase=lowercase, strip_accents=strip_accents)
        hub_dir, serving_dir = staging / "hub", staging / "serving"
        encoder, signatures = hub_encoder(pretrainer, vocab_copy, lowercase)
        tf.saved_model.save(encoder, str(hub_dir / "encoder"), signatures=signatures)
        preprocess, signatures = hub_preprocessor(tokenizer, seq_length)
        tf.saved_model.save(preprocess, str(hub_dir / "preprocess"), signatures=signatures)
        with tarfile.open(hub_dir / "hub.tar.gz", "w:gz") as archive:
            for name in ("encoder", "preprocess"):
                archive.add(hub_dir / name, arcname=name)
        served, signatures = serving_model(pretrainer.encoder, tokenizer, seq_length, pooling)
        tf.saved_model.save(served, str(serving_dir), signatures=signatures)
        write_warmup_requests(serving_dir / "assets.extra" / "tf_serving_warmup_requests", model_name)
        (staging / "models.config").write_text(models_config(model_name))
        (staging / "export.json").write_text(
            json.dumps({"version": version, "model_name": model_name, "seq_length": seq_length, "pooling": pooling,
                        "lowercase": lowercase, "strip_accents": strip_accents, "config": config}, indent=1)
        )
        _commit(staging, {"hub": hub_dir, "serving": serving_dir}, targets)
        os.replace(staging / "models.config", out / "serving" / "models.config")
        os.replace(staging / "export.json", targets["hub"] / "export.json")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {
        "version": version,
        "encoder": str(targets["hub"] / "encoder"),
        "preprocess": str(targets["hub"] / "preprocess"),
        "tarball": str(targets["hub"] / "hub.tar.gz"),
        "serving": str(targets["serving"]),
        "models_config": str(out / "serving" / "models.config"),
        "seq_length": seq_length,
    }


def _commit(staging, staged, targets):
    """Renames the staged folders into place; replaced ones are moved aside first and put
    back if any rename fails."""
    aside, placed = {}, []
    try:
        for key, target in targets.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                aside[key] = staging / f"replaced-{key}"
                os.replace(target, aside[key])
            os.replace(staged[key], target)
            placed.append(key)
    except BaseException:
        for key in placed:
            shutil.rmtree(targets[key], ignore_errors=True)
        for key, path in aside.items():
            os.replace(path, targets[key])
        raise
