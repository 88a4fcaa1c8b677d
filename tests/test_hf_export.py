"""`concise-export --hf-dir`: a Hugging Face BERT folder exported as it is, checked against a
numpy BERT forward pass written here from the safetensors file (exact erf GELU, post-LN) and
fed the ids of Hugging Face's `tokenizers` (BertWordPieceTokenizer): all-MiniLM-L6-v2 served
in a fresh process that never imports tensorflow_text, a tiny BertForMaskedLM-layout
checkpoint with its MLM head, its Keras 3 preset fine-tuned with Adam, and bad folders."""

import json
import math
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest
import safetensors.numpy
import scipy.special

from concise_attention.cli.export import main

# --- The independent reference: BERT in numpy, from the checkpoint's tensors ---


def _tensors(directory):
    return {
        name.removeprefix("bert."): value.astype("float32")
        for name, value in safetensors.numpy.load_file(directory / "model.safetensors").items()
    }


def _layer_norm(x, tensors, prefix, epsilon):
    gamma = tensors.get(f"{prefix}.LayerNorm.weight", tensors.get(f"{prefix}.LayerNorm.gamma"))
    beta = tensors.get(f"{prefix}.LayerNorm.bias", tensors.get(f"{prefix}.LayerNorm.beta"))
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + epsilon) * gamma + beta


def _dense(x, tensors, prefix):
    weight = tensors[f"{prefix}.weight"]  # PyTorch's (out, in)
    return (x.reshape(-1, x.shape[-1]) @ weight.T + tensors[f"{prefix}.bias"]).reshape(*x.shape[:-1], weight.shape[0])


def _gelu(x):
    return 0.5 * x * (1.0 + scipy.special.erf(x / math.sqrt(2.0)))


def numpy_bert(tensors, config, ids_BxL):
    """BERT's sequence output (post-LN, exact GELU) of unpadded ids [B, L], segment 0."""
    heads, epsilon = config["num_attention_heads"], config["layer_norm_eps"]
    length = ids_BxL.shape[1]
    x = (
        tensors["embeddings.word_embeddings.weight"][ids_BxL]
        + tensors["embeddings.position_embeddings.weight"][:length]
    )
    x = _layer_norm(x + tensors["embeddings.token_type_embeddings.weight"][0], tensors, "embeddings", epsilon)
    for index in range(config["num_hidden_layers"]):
        prefix = f"encoder.layer.{index}"

        def split(name):  # [B, heads, L, head size]
            projected = _dense(x, tensors, f"{prefix}.attention.self.{name}")
            return projected.reshape(*projected.shape[:2], heads, -1).transpose(0, 2, 1, 3)

        q, k, v = split("query"), split("key"), split("value")
        probabilities = scipy.special.softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1]), axis=-1)
        context = (probabilities @ v).transpose(0, 2, 1, 3).reshape(x.shape)
        x = _layer_norm(
            x + _dense(context, tensors, f"{prefix}.attention.output.dense"),
            tensors,
            f"{prefix}.attention.output",
            epsilon,
        )
        hidden = _gelu(_dense(x, tensors, f"{prefix}.intermediate.dense"))
        x = _layer_norm(x + _dense(hidden, tensors, f"{prefix}.output.dense"), tensors, f"{prefix}.output", epsilon)
    return x


def numpy_mlm_logits(tensors, config, sequence_BxLxD, positions_BxP):
    hidden = np.take_along_axis(sequence_BxLxD, positions_BxP[:, :, None], axis=1)
    hidden = _gelu(_dense(hidden, tensors, "cls.predictions.transform.dense"))
    hidden = _layer_norm(hidden, tensors, "cls.predictions.transform", config["layer_norm_eps"])
    return hidden @ tensors["embeddings.word_embeddings.weight"].T + tensors["cls.predictions.bias"]


def reference_embeddings(directory, ids, batch=64):
    """Mean-pooled numpy BERT of each id list (no padding: rows of one length run together)."""
    tensors, config = _tensors(directory), json.loads((directory / "config.json").read_text())
    embeddings = np.zeros((len(ids), config["hidden_size"]))
    by_length = {}
    for row, row_ids in enumerate(ids):
        by_length.setdefault(len(row_ids), []).append(row)
    for rows in by_length.values():
        for start in range(0, len(rows), batch):
            chunk = rows[start : start + batch]
            embeddings[chunk] = numpy_bert(tensors, config, np.array([ids[row] for row in chunk])).mean(1)
    return embeddings


def hugging_face_ids(vocabulary, texts, seq_length, lowercase=True, strip_accents=None):
    """[CLS] + the first seq_length - 2 ids of BertWordPieceTokenizer + [SEP], per text."""
    from tokenizers import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(str(vocabulary), lowercase=lowercase, strip_accents=strip_accents)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    return [
        [cls] + encoding.ids[: seq_length - 2] + [sep]
        for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)
    ]


def keras_mean_pooled(encoder, ids):
    """A Keras `BertEncoder`'s token vectors averaged over each id list, one text at a time (no padding)."""
    return np.stack(
        [
            np.asarray(
                encoder(
                    {
                        "input_word_ids": np.array([row]),
                        "input_mask": np.ones((1, len(row)), "int32"),
                        "input_type_ids": np.zeros((1, len(row)), "int32"),
                    },
                    training=False,
                )["sequence_output"]
            )[0].mean(0)
            for row in ids
        ]
    )


def cosines(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _tree(path):
    return sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*"))


def _size(path):
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --- all-MiniLM-L6-v2 as it is, served in a fresh process ---

SERVE_SCRIPT = r"""
import json, sys
sys.modules["tensorflow_text"] = None  # stock TF Serving has no tensorflow-text: it must not be needed
import numpy as np
import tensorflow as tf

serving_dir, texts_path, out_path, subset_path = sys.argv[1:5]
texts = json.loads(open(texts_path, encoding="utf-8").read())
subset = [texts[i] for i in json.loads(open(subset_path).read())]  # the lines whose embeddings are compared
serving = tf.saved_model.load(serving_dir)
embeddings, ids = [], []
for start in range(0, len(texts), 128):
    batch = tf.constant(texts[start : start + 128])
    ids += [[int(i) for i in row if i] for row in serving.signatures["tokenize"](text=batch)["input_word_ids"].numpy()]
for start in range(0, len(subset), 128):
    embeddings.append(serving.signatures["serving_default"](text=tf.constant(subset[start : start + 128]))["embedding"].numpy())
np.save(out_path, np.concatenate(embeddings))
json.dump({"ids": ids, "tensorflow_text_imported": sys.modules.get("tensorflow_text") is not None}, open(out_path + ".json", "w"))
"""


@pytest.fixture(scope="module")
def minilm_export(minilm_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("minilm_export")
    before = _tree(minilm_dir)
    start = time.perf_counter()
    assert main(["--hf-dir", str(minilm_dir), "--out", str(root / "out"), "--model-name", "minilm"]) == 0
    seconds = time.perf_counter() - start
    assert _tree(minilm_dir) == before  # nothing written beside the checkpoint
    print(
        f"\nexport of all-MiniLM-L6-v2: {seconds:.1f} s, {_size(root / 'out') / 1e6:.1f} MB "
        f"(hub {_size(root / 'out' / 'hub') / 1e6:.1f} MB, serving {_size(root / 'out' / 'serving') / 1e6:.1f} MB)"
    )
    return root


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_minilm_served_embeddings_equal_a_numpy_bert_on_the_tokenisation_corpus(minilm_dir, minilm_export):
    """The served tokenisation of all 4,661 lines equals HF `tokenizers`' ids; the served embeddings equal a
    numpy BERT's on every 12th line and the 64 longest (truncated at 256, the max_seq_length of its
    sentence_bert_config.json, the export's default): given equal ids, an embedding
    depends on the ids' length and the chunk it is served in, which the subset spans (all 4,661 through
    MiniLM twice took 6 minutes of the suite)."""
    from test_text import build_corpus

    corpus = build_corpus()
    assert len(corpus) >= 3000
    subset = sorted(set(range(0, len(corpus), 12)) | set(np.argsort([-len(text) for text in corpus])[:64].tolist()))
    (minilm_export / "texts.json").write_text(json.dumps(corpus))
    (minilm_export / "subset.json").write_text(json.dumps(subset))
    out = minilm_export / "served.npy"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            SERVE_SCRIPT,
            str(minilm_export / "out" / "serving" / "1"),
            str(minilm_export / "texts.json"),
            str(out),
            str(minilm_export / "subset.json"),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=minilm_export,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    served, details = np.load(out), json.loads(pathlib.Path(f"{out}.json").read_text())
    assert not details["tensorflow_text_imported"]
    expected_ids = hugging_face_ids(minilm_dir / "vocab.txt", corpus, 256)
    assert details["ids"] == expected_ids
    assert max(len(expected_ids[i]) for i in subset) == 256 and min(len(expected_ids[i]) for i in subset) <= 4
    similarity = cosines(served, reference_embeddings(minilm_dir, [expected_ids[i] for i in subset]))
    print(
        f"served vs numpy BERT on {len(subset)} of {len(corpus)} lines: cosine min {similarity.min():.8f}, mean {similarity.mean():.8f}"
    )
    assert similarity.min() >= 0.99999, [corpus[subset[i]] for i in np.argsort(similarity)[:3]]


def test_minilm_export_holds_every_artifact(minilm_export, minilm_dir):
    import tensorflow as tf

    out = minilm_export / "out"
    export = json.loads((out / "hub" / "1" / "export.json").read_text())
    assert export["source_kind"] == "hf" and export["config"]["task"] is None
    assert (export["lowercase"], export["strip_accents"], export["model_name"]) == (True, None, "minilm")
    assert (export["seq_length"], export["pooling"]) == (256, "normalized_mean")  # its sentence-transformers settings
    hub_encoder = tf.saved_model.load(str(out / "hub" / "1" / "encoder"))
    assert not hasattr(hub_encoder, "mlm")  # a BertModel: no MLM head
    ids = hugging_face_ids(minilm_dir / "vocab.txt", ["A man is playing a guitar.", "Stocks fell."], 24)
    expected = reference_embeddings(minilm_dir, ids)
    outputs = hub_encoder({name: tf.constant(value) for name, value in _padded(ids).items()}, training=False)
    for name in ("pooled_output", "default", "embedding"):  # its sentence embedding, as sentence-transformers gives it
        np.testing.assert_allclose(
            outputs[name].numpy(), expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=2e-5
        )
    for path in (
        "hub/1/encoder/saved_model.pb",
        "hub/1/preprocess/saved_model.pb",
        "hub/1/hub.tar.gz",
        "hub/1/keras/model.weights.h5",
        "serving/1/saved_model.pb",
        "serving/1/assets.extra/tf_serving_warmup_requests",
        "serving/models.config",
    ):
        assert (out / path).is_file(), path
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no staging leftovers


# --- A tiny BertForMaskedLM checkpoint (HF layout, cased, accents kept), with its MLM head ---

WORDS = (
    "The the a cat sat on mat dog runs is good bad Café café cafe naïve naive Straße play ##s ##ing ##ed . , ! ?"
).split()
LETTERS = (
    [chr(c) for c in range(ord("a"), ord("z") + 1)]
    + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    + ["é", "ï", "ß", "É"]
)
VOCABULARY = list(
    dict.fromkeys(
        ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *LETTERS, *[f"##{c}" for c in LETTERS]]
    )
)
TEXTS = ["The cat sat on the mat.", "Café naïve Straße!", "the DOG runs, is good", "cafe CAFÉ ÉTÉ", ""]
HIDDEN, HEADS, LAYERS, INTERMEDIATE, POSITIONS = 16, 2, 2, 32, 40


def _tiny_tensors(seed=0):
    rng = np.random.default_rng(seed)

    def normal(*shape, mean=0.0):
        return (mean + rng.normal(scale=0.3, size=shape)).astype("float32")

    def dense(prefix, out, inputs):
        return {f"{prefix}.weight": normal(out, inputs), f"{prefix}.bias": normal(out)}

    def norm(prefix):
        return {f"{prefix}.LayerNorm.weight": normal(HIDDEN, mean=1.0), f"{prefix}.LayerNorm.bias": normal(HIDDEN)}

    vocab_size = len(VOCABULARY) + 3  # a vocabulary may be smaller than the embedding table
    tensors = {
        "bert.embeddings.word_embeddings.weight": normal(vocab_size, HIDDEN),
        "bert.embeddings.position_embeddings.weight": normal(POSITIONS, HIDDEN),
        "bert.embeddings.token_type_embeddings.weight": normal(2, HIDDEN),
        **norm("bert.embeddings"),
    }
    for index in range(LAYERS):
        prefix = f"bert.encoder.layer.{index}"
        for name in ("query", "key", "value"):
            tensors |= dense(f"{prefix}.attention.self.{name}", HIDDEN, HIDDEN)
        tensors |= dense(f"{prefix}.attention.output.dense", HIDDEN, HIDDEN) | norm(f"{prefix}.attention.output")
        tensors |= dense(f"{prefix}.intermediate.dense", INTERMEDIATE, HIDDEN) | dense(
            f"{prefix}.output.dense", HIDDEN, INTERMEDIATE
        )
        tensors |= norm(f"{prefix}.output")
    tensors |= dense("bert.pooler.dense", HIDDEN, HIDDEN)
    tensors |= dense("cls.predictions.transform.dense", HIDDEN, HIDDEN) | norm("cls.predictions.transform")
    tensors["cls.predictions.bias"] = normal(vocab_size)
    # tied, as HF saves it
    tensors["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"]
    tensors["cls.predictions.decoder.bias"] = tensors["cls.predictions.bias"]
    return tensors, vocab_size


def write_tiny_checkpoint(directory):
    directory.mkdir(parents=True)
    tensors, vocab_size = _tiny_tensors()
    safetensors.numpy.save_file(tensors, directory / "model.safetensors")
    config = {
        "architectures": ["BertForMaskedLM"],
        "model_type": "bert",
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": INTERMEDIATE,
        "hidden_act": "gelu",
        "max_position_embeddings": POSITIONS,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
    }
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "vocab.txt").write_text("\n".join(VOCABULARY) + "\n")
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "do_lower_case": False,
                "strip_accents": False,
                "tokenizer_class": "BertTokenizer",
                "model_max_length": 512,
                "unk_token": "[UNK]",
            }
        )
    )
    return directory


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny checkpoint exported through the CLI, in-process; the numpy reference of TEXTS."""
    root = tmp_path_factory.mktemp("tiny_hf")
    directory = write_tiny_checkpoint(root / "bert")
    before = _tree(directory)
    assert main(["--hf-dir", str(directory), "--out", str(root / "out"), "--seq-length", "24"]) == 0
    assert _tree(directory) == before
    ids = hugging_face_ids(directory / "vocab.txt", TEXTS, 24, lowercase=False, strip_accents=False)
    tensors, config = _tensors(directory), json.loads((directory / "config.json").read_text())
    sequences = [numpy_bert(tensors, config, np.array([row]))[0] for row in ids]
    positions = np.array([[1, 2], [2, 1], [1, 3], [3, 2], [0, 1]], "int32")
    logits = np.stack(
        [numpy_mlm_logits(tensors, config, sequence[None], row[None])[0] for sequence, row in zip(sequences, positions)]
    )
    return {
        "root": root,
        "dir": directory,
        "out": root / "out",
        "ids": ids,
        "sequences": sequences,
        "positions": positions,
        "logits": logits,
    }


def _padded(ids, length=24):
    word_ids = np.array([row + [0] * (length - len(row)) for row in ids], "int32")
    return {"input_word_ids": word_ids, "input_mask": (word_ids > 0).astype("int32"), "input_type_ids": 0 * word_ids}


def test_a_masked_lm_checkpoint_exports_with_its_head_and_its_tokenizer_settings(tiny):
    import tensorflow as tf

    inputs = _padded(tiny["ids"])
    encoder = tf.saved_model.load(str(tiny["out"] / "hub" / "1" / "encoder"))
    outputs = encoder.mlm({**inputs, "masked_lm_positions": tiny["positions"]}, training=False)
    for row, expected in enumerate(tiny["sequences"]):
        np.testing.assert_allclose(outputs["sequence_output"].numpy()[row, : len(expected)], expected, atol=1e-4)
    np.testing.assert_allclose(outputs["mlm_logits"].numpy(), tiny["logits"], atol=1e-4)
    serving = tf.saved_model.load(str(tiny["out"] / "serving" / "1"))
    served_ids = serving.signatures["tokenize"](text=tf.constant(TEXTS))["input_word_ids"].numpy()
    # cased, accents kept: tokenizer_config.json's settings
    assert [[i for i in row if i] for row in served_ids] == tiny["ids"]
    uncased = hugging_face_ids(tiny["dir"] / "vocab.txt", TEXTS, 24)
    assert uncased != tiny["ids"]  # (so the check above tells the settings apart)
    embeddings = serving.signatures["serving_default"](text=tf.constant(TEXTS))["embedding"].numpy()
    np.testing.assert_allclose(embeddings, [sequence.mean(0) for sequence in tiny["sequences"]], atol=1e-4)
    export = json.loads((tiny["out"] / "hub" / "1" / "export.json").read_text())
    assert (export["lowercase"], export["strip_accents"], export["model_name"], export["seq_length"]) == (
        False,
        False,
        "bert",
        24,
    )


def test_keras_preset_loads_and_fine_tunes_every_encoder_variable_with_adam(tiny, tmp_path):
    import keras

    from concise_attention.models import presets
    from concise_attention.models.bert import BertEncoder
    from concise_attention.models.bert import BertPretrainer
    from concise_attention.models.heads import BertClassifier
    from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer

    preset = tiny["out"] / "hub" / "1" / "keras"
    settings = presets.tokenizer_settings(preset)
    assert (settings["lowercase"], settings["strip_accents"]) == (False, False)
    assert wordpiece_tokenizer(**settings)(np.array(TEXTS)).to_list() == [row[1:-1] for row in tiny["ids"]]
    inputs = _padded(tiny["ids"])
    pretrainer = BertPretrainer.from_preset(preset)  # task.json: the checkpoint's MLM head
    logits = pretrainer({**inputs, "masked_lm_positions": tiny["positions"]}, training=False)["mlm_logits"]
    np.testing.assert_allclose(np.asarray(logits), tiny["logits"], atol=1e-4)
    assert BertEncoder.from_preset(preset).count_params() == pretrainer.encoder.count_params()

    classifier = BertClassifier.from_preset(preset, num_outputs=2)  # a new head on the preset's encoder
    before = [np.array(variable) for variable in classifier.encoder.trainable_variables]
    classifier.compile(
        keras.optimizers.Adam(1e-2), loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}
    )
    batch = {name: np.repeat(value, 4, axis=0) for name, value in inputs.items()}
    batch["input_type_ids"] = (np.arange(24) >= 3).astype("int32")[None].repeat(len(batch["input_mask"]), 0) * batch[
        "input_mask"
    ]
    classifier.fit(batch, np.arange(len(batch["input_mask"])) % 2, batch_size=10, epochs=3, verbose=0)
    unchanged = [
        v.path for v, b in zip(classifier.encoder.trainable_variables, before) if np.array_equal(np.array(v), b)
    ]
    assert len(before) == len(BertEncoder.from_preset(preset).trainable_variables) and unchanged == []

    expected = np.asarray(classifier.predict(inputs, verbose=0)["logits"])
    classifier.save(tmp_path / "tuned.keras")
    reloaded = keras.saving.load_model(tmp_path / "tuned.keras", compile=False)
    np.testing.assert_array_equal(np.asarray(reloaded.predict(inputs, verbose=0)["logits"]), expected)
    classifier.save_to_preset(tmp_path / "tuned_preset")
    np.testing.assert_array_equal(
        np.asarray(BertClassifier.from_preset(tmp_path / "tuned_preset").predict(inputs, verbose=0)["logits"]), expected
    )
    for same_head in (
        {"num_outputs": 2},
        {"dropout": 0.3},
    ):  # arguments that leave the trained head's weights as they are
        tuned = BertClassifier.from_preset(tmp_path / "tuned_preset", **same_head)
        np.testing.assert_array_equal(np.asarray(tuned.predict(inputs, verbose=0)["logits"]), expected)
    assert tuned.head_dropout.rate == 0.3
    with pytest.warns(UserWarning, match="trained head's weights are not loaded"):
        assert BertClassifier.from_preset(tmp_path / "tuned_preset", num_outputs=3).predict(inputs, verbose=0)[
            "logits"
        ].shape == (5, 3)


def _change_json(name, **changes):
    def change(directory):
        path = directory / name
        path.write_text(json.dumps(json.loads(path.read_text()) | changes))

    return change


def _write_vocabulary(tokens):
    def change(directory):
        (directory / "vocab.txt").write_text("\n".join(tokens) + "\n")

    return change


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda d: (d / "model.safetensors").unlink(),
            r"bert has no model\.safetensors: not a Hugging Face BERT folder",
        ),
        (
            _change_json("config.json", model_type="gpt2"),
            r"bert/config\.json: only BERT and MPNet checkpoints .* model_type='gpt2'",
        ),
        (
            _write_vocabulary([t for t in VOCABULARY if t != "[UNK]"]),
            r"bert/vocab\.txt lacks the special token\(s\) \[UNK\]",
        ),
        (
            _write_vocabulary([t for t in VOCABULARY if t != "[SEP]"]),
            r"bert/vocab\.txt lacks the special token\(s\) \[SEP\]",
        ),
        (
            _write_vocabulary(VOCABULARY + [f"w{i}" for i in range(4)]),
            rf"bert/vocab\.txt has {len(VOCABULARY) + 4} tokens, more than .*config\.json vocab_size={len(VOCABULARY) + 3}",
        ),
        (
            _change_json("config.json", pad_token_id=5),
            r"config\.json: pad_token_id=5 but \[PAD\] is line 0 of .*vocab\.txt",
        ),
        (
            _change_json("config.json", do_lower_case=True),
            r"tokenizer_config\.json: do_lower_case=False disagrees with .*config\.json: do_lower_case=True",
        ),
        (
            _change_json("tokenizer_config.json", unk_token="<unk>"),
            r"tokenizer_config\.json: unk_token='<unk>', but BERT's tokenisation uses '\[UNK\]'",
        ),
        (
            _change_json("tokenizer_config.json", tokenizer_class="RobertaTokenizer"),
            r"tokenizer_class='RobertaTokenizer'",
        ),
        (
            _change_json("tokenizer_config.json", tokenize_chinese_chars=False),
            r"tokenize_chinese_chars=False is not supported",
        ),
        (
            _change_json("tokenizer_config.json", strip_accents="yes"),
            r"tokenizer_config\.json: do_lower_case must be .* strip_accents='yes'",
        ),
        (lambda d: (d / "config.json").write_text("{"), r"bert/config\.json is not valid JSON"),
    ],
)
def test_bad_hugging_face_folders_are_named_and_nothing_is_written(tmp_path, capsys, change, message):
    import re

    directory = write_tiny_checkpoint(tmp_path / "bert")
    change(directory)
    with pytest.raises(SystemExit) as exit_info:
        main(["--hf-dir", str(directory), "--out", str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and re.search(message, error), error
    assert error.count("\n") == 1 and "Traceback" not in error
    assert not (tmp_path / "out").exists()


def test_model_max_length_above_the_positions_is_not_a_disagreement(tmp_path):
    from concise_attention.training import artifacts

    directory = write_tiny_checkpoint(tmp_path / "bert")
    _change_json("tokenizer_config.json", model_max_length=100_000)(directory)
    source = artifacts.read(directory, "hf")
    assert source.model["max_sequence_length"] == POSITIONS and source.tokenizer == {
        "lowercase": False,
        "strip_accents": False,
    }


def _is_collaborative(model_section):
    """Whether a config's BERT model section builds collaborative attention (read through the builder)."""
    from concise_attention.models import CollaborativeAttention
    from concise_attention.models.bert import BertEncoder

    return isinstance(BertEncoder(**model_section).blocks[0].attention, CollaborativeAttention)


@pytest.mark.slow
def test_a_converted_collaborative_minilm_exports_serves_and_fine_tunes_with_its_tokenizer(
    minilm_dir, tmp_path, capsys
):
    """all-MiniLM-L6-v2 with strip_accents=false in its tokenizer_config.json (not the
    uncased default, so a silent fallback shows), converted to collaborative attention at
    full rank (D~k = 384: exact), exported with `concise-export --run` and served; a
    fine-tuning run from the converted output keeps lowercase and strip_accents."""
    import tensorflow as tf

    from concise_attention.cli import collaborative as collaborative_cli
    from concise_attention.cli import train as train_cli

    source = tmp_path / "minilm_accents_kept"
    source.mkdir()
    for name in ("config.json", "vocab.txt", "model.safetensors"):
        (source / name).symlink_to(minilm_dir / name)
    settings = json.loads((minilm_dir / "tokenizer_config.json").read_text()) | {"strip_accents": False}
    (source / "tokenizer_config.json").write_text(json.dumps(settings))
    assert (
        collaborative_cli.main(
            ["--hf-dir", str(source), "--shared-key-dim", "384", "--out", str(tmp_path / "converted")]
        )
        == 0
    )
    assert not (tmp_path / "converted" / "model.weights.h5").exists()  # the converter keeps the backbone only
    assert main(["--run", str(tmp_path / "converted"), "--out", str(tmp_path / "out")]) == 0

    texts = ["Café naïve résumé, crème brûlée.", "A man is playing a guitar.", "Ærøskøbing à Zürich"]
    ids = hugging_face_ids(minilm_dir / "vocab.txt", texts, 128, strip_accents=False)
    assert ids != hugging_face_ids(minilm_dir / "vocab.txt", texts, 128)  # stripping accents would give other ids
    serving = tf.saved_model.load(str(tmp_path / "out" / "serving" / "1"))
    assert [
        [i for i in row if i]
        for row in serving.signatures["tokenize"](text=tf.constant(texts))["input_word_ids"].numpy()
    ] == ids
    served = serving.signatures["serving_default"](text=tf.constant(texts))["embedding"].numpy()
    assert cosines(served, reference_embeddings(minilm_dir, ids)).min() >= 0.9999
    exported = json.loads((tmp_path / "out" / "hub" / "1" / "export.json").read_text())["config"]
    assert _is_collaborative(exported["model"])

    argv = ["--config", "wordnet_topics", "--run-dir", str(tmp_path / "tuned"), "--quiet"]
    for override in (
        f"task.init={tmp_path / 'converted'}",
        "training.sequence_length=16",
        "training.batch_size=32",
        "training.train_steps=1",
        "training.train_epochs=null",
        "training.steps_per_epoch=1",
        "training.steps_per_execution=1",
        "training.jit_compile=false",
        "training.warmup_fraction=null",
        "training.warmup_steps=0",
    ):
        argv += ["--set", override]
    assert train_cli.main(argv) == 0
    saved = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert (saved["tokenizer"]["lowercase"], saved["tokenizer"]["strip_accents"]) == (True, False)
    assert _is_collaborative(saved["model"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # an explicit other setting is refused, not silently used
        train_cli.main(
            argv[:2] + ["--run-dir", str(tmp_path / "refused")] + argv[4:] + ["--set", "tokenizer.strip_accents=true"]
        )
    assert exit_info.value.code == 2 and "tokenizer.strip_accents=True disagrees" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()


@pytest.mark.slow
def test_the_served_minilm_export_scores_mtebs_published_figures(minilm_export, tmp_path, capsys):
    """MTEB's published all-MiniLM-L6-v2 scores (STSBenchmark 0.8203, Banking77Classification 0.8004) from our TF
    Serving export, through `concise-evaluate --encoder`: the data, both protocols and the export checked together."""
    from concise_attention.cli.evaluate import main as evaluate

    assert evaluate(["--encoder", str(minilm_export / "out"), "--output", str(tmp_path / "scores.json")]) == 0
    scores = json.loads((tmp_path / "scores.json").read_text())["rows"]["out"]
    print(capsys.readouterr().out)
    assert round(scores["STSBenchmark"], 3) == 0.820 and round(scores["Banking77Classification"], 3) == 0.800, scores
