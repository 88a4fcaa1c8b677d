"""The concise encoders shipped inside the package: small, float16, hash-checked, documented, loadable by
name with no network, exported and served like any other model, and still the student their model card
describes (its card's MTEB-protocol figure recomputed here)."""

import json
import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from concise_attention.models import presets

SHIPPED = presets.shipped_presets()
LIMIT = 25 * 10**6


def test_a_concise_encoder_is_shipped():
    assert SHIPPED, "no preset in models/shipped"


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_preset_is_small_float16_hashed_and_documented(name):
    import h5py

    folder = pathlib.Path(presets.SHIPPED_DIR) / name
    files = [path for path in folder.rglob("*") if path.is_file()]
    assert sum(path.stat().st_size for path in files) <= LIMIT
    manifest = json.loads((folder / presets.MANIFEST_FILE).read_text())["sha256"]
    assert sorted(manifest) == sorted(
        str(path.relative_to(folder)) for path in files if path.name != presets.MANIFEST_FILE
    )
    with h5py.File(folder / presets.WEIGHTS_FILE) as weights:  # read here with h5py, not with presets.stored_dtype
        dtypes = set()
        weights.visititems(
            lambda _, item: (
                dtypes.add(str(item.dtype)) if isinstance(item, h5py.Dataset) and item.dtype.kind == "f" else None
            )
        )
    assert dtypes == {"float16"} and presets.stored_dtype(name) == "float16"
    card = (folder / "README.md").read_text()
    for section in ("## Model", "## Evaluation", "## Training", "## Data and licences", "## Intended use and limits"):
        assert section in card, section


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_preset_exports_and_serves_its_embeddings(name, tmp_path):
    """`concise-export --preset NAME`: the served embedding and the TF-Hub encoder's `default`, `pooled_output` and
    `embedding` are the Keras encoder's mean pooling (numpy) on the same ids at unit length, for texts of mixed
    lengths, and the preset's own `encode()`; the exported Keras preset keeps the trained length, the embedding,
    the model card and a manifest, and encodes as the shipped one."""
    import tensorflow_hub as hub

    from concise_attention.cli import export as export_cli
    from concise_attention.models.bert import BertEncoder
    from concise_attention.training.inference.embeddings import SentenceEncoder

    assert export_cli.main(["--preset", name, "--out", str(tmp_path / "export")]) == 0
    texts = ["A man is playing a guitar.", "", "Stocks fell sharply on Monday, the third fall in a row. " * 6, "ok"]
    serving = tf.saved_model.load(str(tmp_path / "export" / "serving" / "1"))
    served = serving.signatures["serving_default"](text=tf.constant(texts))["embedding"].numpy()
    inputs = serving.signatures["tokenize"](text=tf.constant(texts))
    encoder = BertEncoder.from_preset(name)
    sequence = np.asarray(encoder({key: value for key, value in inputs.items()}, training=False)["sequence_output"])
    mask = inputs["input_mask"].numpy()[:, :, None]
    mean = (sequence * mask).sum(1) / mask.sum(1)
    unit = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    np.testing.assert_allclose(served, unit, atol=2e-5)
    assert served.shape[1] == encoder.hidden_size
    np.testing.assert_allclose(
        served, SentenceEncoder.from_preset(name, sequence_length=mask.shape[1]).encode(texts), atol=2e-5
    )
    layer = hub.KerasLayer(str(tmp_path / "export" / "hub" / "1" / "encoder"), trainable=True)
    hub_outputs = layer(dict(inputs))
    for key in ("default", "pooled_output", "embedding"):
        np.testing.assert_allclose(hub_outputs[key].numpy(), unit, atol=2e-5, err_msg=key)
    # Fine-tuning it in tf_keras: every variable offered for training has a gradient from the sentence embedding
    # (the [CLS] pooler, which no output reaches, is not offered: no "Gradients do not exist" at every step).
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(dict(inputs), training=True)["pooled_output"][:, 0])
    gradients = tape.gradient(loss, layer.trainable_variables)
    assert len(gradients) == len(encoder.trainable_variables) - len(encoder.pooler.trainable_variables)
    assert [v.name for v, g in zip(layer.trainable_variables, gradients) if g is None] == []
    keras_preset = tmp_path / "export" / "hub" / "1" / "keras"
    assert presets.trained_sequence_length(keras_preset) == presets.trained_sequence_length(name)
    assert presets.serving_length(keras_preset) == presets.serving_length(name)
    export_settings = json.loads((tmp_path / "export" / "serving" / "1" / "assets.extra" / "export.json").read_text())
    # one default cut for both
    assert export_settings["seq_length"] == SentenceEncoder.from_preset(name).sequence_length
    assert presets.sentence_embedding(keras_preset) == "normalized_mean"
    assert (keras_preset / "README.md").read_text() == (
        pathlib.Path(presets.SHIPPED_DIR) / name / "README.md"
    ).read_text()
    assert presets.stored_dtype(keras_preset) == "float16" == presets.stored_dtype(name)
    long_text = ["word " * 300]
    np.testing.assert_allclose(
        SentenceEncoder.from_preset(str(keras_preset)).encode(long_text),
        SentenceEncoder.from_preset(name).encode(long_text),
        atol=2e-5,
    )
    (keras_preset / presets.WEIGHTS_FILE).write_bytes(b"tampered")
    with pytest.raises(ValueError, match="does not match the sha256"):
        BertEncoder.from_preset(str(keras_preset))


def test_from_preset_refuses_arguments_that_would_change_the_weights_or_are_misspelt():
    """Only rates, dtype and naming may change; a misspelt or shape-changing argument is one ValueError naming it."""
    from concise_attention.models.bert import BertEncoder

    name = SHIPPED[0]
    assert BertEncoder.from_preset(name, dropout=0.1, attention_dropout=0.1).get_config()["dropout"] == 0.1
    for arguments in ({"droput": 0.1}, {"num_layers": 3}, {"max_sequence_length": 128}):
        with pytest.raises(ValueError, match=f"Received: {next(iter(arguments))}="):
            BertEncoder.from_preset(name, **arguments)


def test_a_shipped_name_wins_over_a_folder_of_that_name(tmp_path, monkeypatch):
    """keras-hub's rule for built-in names: an (empty) folder named like a shipped preset in the working
    directory does not hide it; `./NAME` reads the folder."""
    name = SHIPPED[0]
    (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path)
    assert presets.resolve(name) == os.path.join(presets.SHIPPED_DIR, name)
    with pytest.raises(ValueError, match="manifest.json is missing"):
        presets.trained_sequence_length(f"./{name}")


@pytest.mark.parametrize("name", SHIPPED)
def test_the_model_cards_mteb_figure_holds_for_the_shipped_weights(name):
    """The card's STSBenchmark figure (MTEB's protocol: Spearman of cosines on the test split) recomputed from the
    shipped float16 preset with SciPy, on the pairs of the evaluation data: to the third decimal."""
    import re

    from scipy.stats import spearmanr

    from concise_attention.training.inference import mteb_protocol
    from concise_attention.training.inference.embeddings import SentenceEncoder

    card = (pathlib.Path(presets.SHIPPED_DIR) / name / "README.md").read_text()
    stated = float(re.search(r"\| this encoder \| \d+ \| (\d\.\d{4}) \|", card).group(1))
    assert re.search(r"^\| encoder \| width \| STSBenchmark \|", card, re.M)  # the first task column
    rows = mteb_protocol.read_split("STSBenchmark", "test")
    encoder = SentenceEncoder.from_preset(name)
    first, second = (encoder.encode([row[key] for row in rows]) for key in ("sentence1", "sentence2"))
    spearman = spearmanr(np.sum(first * second, axis=1), [float(row["score"]) for row in rows])[0]
    assert abs(spearman - stated) < 0.001, (spearman, stated)


def test_the_readmes_three_lines_print_the_shipped_encoders_embeddings(capsys):
    """The README's first example, run as written (`from concise_attention import SentenceEncoder`): what it prints
    is what it says, and its cosines are those of the shipped Keras encoder mean-pooled in numpy over Hugging Face
    `tokenizers` ids (an independent tokenizer), cut to the 256 tokens the preset reads by default."""
    import ast
    import re

    from test_hf_export import hugging_face_ids
    from test_hf_export import keras_mean_pooled

    from concise_attention.models.bert import BertEncoder

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    example = next(
        block
        for block in re.findall(r"```python\n(.*?)```", readme, re.S)
        if "from concise_attention import SentenceEncoder" in block
    )
    namespace = {}
    exec(compile(example, "README.md", "exec"), namespace)
    out = capsys.readouterr().out.strip()
    assert f"prints `{out}`" in readme, out
    name, texts = (
        re.search(r'from_preset\("([^"]+)"\)', example).group(1),
        re.search(r"encode\((\[.*?\])\)", example).group(1),
    )
    assert namespace["encoder"].sequence_length == 256  # its teacher's cut, recorded by ship --serving-length
    vocabulary = pathlib.Path(presets.SHIPPED_DIR) / name / "assets" / "tokenizer" / "vocabulary.txt"
    pooled = keras_mean_pooled(
        BertEncoder.from_preset(name), hugging_face_ids(vocabulary, ast.literal_eval(texts), 256, strip_accents=True)
    )
    unit = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
    np.testing.assert_allclose(namespace["vectors"], unit, atol=2e-5)
    assert out == f"{unit.shape} float32 {(unit @ unit.T)[0].round(2)}"
