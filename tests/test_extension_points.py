"""Extension points: a new attention variant and a new task, defined HERE, registered through the
public registries, trained through the CLI's code path and exported (the task's own TF Serving
signature), with no library file touched.

The variant has an argument no library file knows of (`temperature`): it travels from the
config's nested `model.attention` section (and a `--set model.attention.temperature=...`
override) to the layer's constructor unchanged."""

import dataclasses
import json
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from concise_attention.cli import train as cli
from concise_attention.models.attention import ATTENTION_TYPES
from concise_attention.models.attention import FixedHeadSizeAttention
from concise_attention.models.attention import register_attention
from concise_attention.training.data.packing import SAMPLE_CORPUS
from concise_attention.training.data.packing import read_lines
from concise_attention.training.tasks import ServingSignature
from concise_attention.training.tasks import TASKS
from concise_attention.training.tasks import Task
from concise_attention.training.tasks import TaskSettings
from concise_attention.training.tasks import register_task


class TemperedAttention(FixedHeadSizeAttention):
    """Fixed head size attention with a softmax temperature: logits / temperature. A new
    constructor argument and the logits hook are all that change."""

    def __init__(self, num_heads, head_size, temperature=1.0, **kwargs):
        super().__init__(num_heads=num_heads, head_size=head_size, **kwargs)
        if not temperature > 0:
            raise ValueError(f"`temperature` must be positive. Received: temperature={temperature!r}")
        self.temperature = temperature

    def _attention_logits(self, query, key):
        return super()._attention_logits(query, key) / self.temperature

    def get_config(self):
        return super().get_config() | {"temperature": self.temperature}


@dataclasses.dataclass(frozen=True)
class WordCountSettings(TaskSettings):
    max_lines: int = 200


class WordCountTask(Task):
    """Predict the number of words of a real sentence (a regression on the pooled output)."""

    name, Config, backbone_type = "word_count", WordCountSettings, "bert"

    def load_data(self):
        self.lines = [line[:200] for line in read_lines(SAMPLE_CORPUS)[: self.settings.max_lines]]

    def vocabulary_text(self):
        return iter(self.lines)

    def build_model(self, backbone):
        from concise_attention.models.heads import BertClassifier

        return BertClassifier(backbone, num_outputs=1)

    def compile_arguments(self):
        return {"loss": keras.losses.MeanSquaredError()}

    def datasets(self, tokenizer, skip_batches):
        length, batch = self.training.sequence_length, self.training.batch_size
        pad = tokenizer.token_to_id("[PAD]")

        def encode(text, count):
            ids = tokenizer(text[None])[0][:length]
            ids = tf.pad(ids, [[0, length - tf.shape(ids)[0]]], constant_values=pad)
            inputs = {
                "input_word_ids": ids,
                "input_mask": tf.cast(ids != pad, tf.int32),
                "input_type_ids": tf.zeros_like(ids),
            }
            return inputs, count, 1.0

        counts = np.array([len(line.split()) for line in self.lines], "float32")[:, None] / 10.0
        data = tf.data.Dataset.from_tensor_slices((self.lines, counts)).map(encode)
        train = data.repeat().shuffle(64, seed=self.training.seed).batch(batch, drop_remainder=True).skip(skip_batches)
        return train, data.batch(batch, drop_remainder=True)

    def evaluate(self, model, final):  # final: the held-out batches the run kept (datasets gave no final data)
        return {"eval_loss": model.evaluate(final, verbose=0, return_dict=True)["loss"]}

    def serving_signature(self, model):
        """The exported TF Serving model: `sentence` -> `words` (the predicted word count)."""
        return ServingSignature(
            ("sentence",), lambda inputs: {"words": 10.0 * model(inputs, training=False)["logits"][:, 0]}
        )


@pytest.fixture()
def registered():
    register_attention("tempered", TemperedAttention)
    register_task(WordCountTask)
    yield
    ATTENTION_TYPES.pop("tempered", None)
    TASKS.pop("word_count", None)


def _config_file(tmp_path):
    config = tmp_path / "word_count.yaml"
    config.write_text(
        "model_type: bert\n"
        "model: {vocab_size: 300, hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 32, max_sequence_length: 32,"
        " attention: {type: tempered, head_size: 16, temperature: 2.0}}\n"
        "task: {name: word_count, max_lines: 120}\n"
        "training: {sequence_length: 32, batch_size: 8, train_steps: 6, steps_per_epoch: 3, steps_per_execution: 3,"
        " eval_batches: 2, learning_rate: 0.001, warmup_steps: 1, jit_compile: false}\n"
    )
    return str(config)


@pytest.mark.slow
def test_a_new_attention_variant_and_a_new_task_train_through_the_cli(registered, tmp_path, capsys):
    arguments = ["--config", _config_file(tmp_path), "--run-dir", str(tmp_path / "run"), "--quiet"]
    assert cli.main([*arguments, "--set", "model.attention.temperature=0.5"]) == 0
    out = capsys.readouterr().out
    metrics = json.loads(out[out.index("{") :])
    assert metrics["task"] == "word_count" and metrics["step"] == 6 and np.isfinite(metrics["eval_loss"])
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["task"] == {"name": "word_count", "init": None, "max_lines": 120}
    assert saved["model"]["attention"] == {"type": "tempered", "head_size": 16, "temperature": 0.5}
    assert json.loads((tmp_path / "run" / "metrics.json").read_text()) == metrics

    from concise_attention.training.run import runs

    loaded = runs.load(tmp_path / "run")
    model, backbone = loaded.task_model, loaded.backbone
    attention = backbone.blocks[0].attention
    assert type(attention) is TemperedAttention and (attention.temperature, attention.head_size) == (0.5, 16)
    # The argument is used: the probabilities are softmax(q k^T / sqrt(16) / 0.5), recomputed in
    # numpy from the trained layer's projection weights.
    x = np.random.default_rng(0).normal(size=(1, 5, 32)).astype("float32")
    _, probabilities = attention(x, x, return_attention_scores=True)
    query, key = (
        np.einsum("bti,inh->btnh", x, np.asarray(dense.kernel)) + np.asarray(dense.bias)
        for dense in (attention.query_dense, attention.key_dense)
    )
    logits = np.einsum("btnh,bsnh->bnts", query, key) / np.sqrt(16) / 0.5
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(
        np.asarray(probabilities), expected / expected.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7
    )

    # The task's own serving signature is what the exporter serves; the reloaded SavedModel
    # agrees with the live model on inputs packed by HF `tokenizers` (BERT's [CLS] text [SEP]).
    import tokenizers

    from concise_attention.export.savedmodels import export_run

    sentences = ["The quick brown fox jumps over the lazy dog.", "Attention is all you need", "one"]
    served = tf.saved_model.load(export_run(tmp_path / "run", tmp_path / "out")["serving"]).signatures[
        "serving_default"
    ]
    words = served(sentence=tf.constant(sentences))["words"].numpy()
    tokenizer = tokenizers.BertWordPieceTokenizer(str(tmp_path / "run" / "vocab.txt"), lowercase=True)
    tokenizer.enable_padding(length=32)
    encodings = tokenizer.encode_batch(sentences)
    inputs = {
        "input_word_ids": np.array([e.ids for e in encodings], "int32"),
        "input_mask": np.array([e.attention_mask for e in encodings], "int32"),
        "input_type_ids": np.array([e.type_ids for e in encodings], "int32"),
    }
    np.testing.assert_allclose(
        words, 10.0 * np.asarray(model(inputs, training=False)["logits"])[:, 0], rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "model.attention.temprature=0.5",
            "Unknown key `model.attention.temprature` for attention type 'tempered' "
            "(TemperedAttention). Known keys: type, head_size, temperature",
        ),
        # A value is the variant's own constructor's to check: the config constructs it once at load.
        ("model.attention.temperature=-1", "`temperature` must be positive. Received: temperature=-1"),
    ],
)
def test_a_bad_argument_of_the_new_variant_is_one_line_naming_it(registered, tmp_path, capsys, override, message):
    arguments = ["--config", _config_file(tmp_path), "--run-dir", str(tmp_path / "run"), "--quiet", "--set", override]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(arguments)
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in error and len(error.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()  # refused when the config is read, before anything is written


def test_a_variant_overriding_the_logits_hook_is_not_bypassed_by_the_fused_path():
    layer = TemperedAttention(num_heads=2, head_size=8, temperature=0.5)
    x = np.random.default_rng(1).normal(size=(2, 5, 16)).astype("float32")
    sharp = np.asarray(layer(x, x))  # inference, no scores: the fused path would apply to the base class
    _, scores = layer(x, x, return_attention_scores=True)  # explicit path, through the overridden hook
    base = FixedHeadSizeAttention(num_heads=2, head_size=8)
    base(x, x)
    base.set_weights(layer.get_weights())
    assert np.abs(sharp - np.asarray(base(x, x))).max() > 1e-4  # the override changed the output
    np.testing.assert_allclose(sharp, np.asarray(layer(x, x, return_attention_scores=True)[0]), rtol=1e-5, atol=1e-6)
    assert scores.shape == (2, 2, 5, 5)


def test_the_protocol_reads_the_data_once_first_and_evaluates_the_final_data():
    """`Task.data` runs `load_data` before `datasets`, once however often it is called; `final_metrics` evaluates
    the task's own final data, or the held-out batches the run kept when its datasets gave none."""
    calls = []

    class Probe(Task):
        def load_data(self):
            calls.append("load_data")

        def datasets(self, tokenizer, skip_batches):
            calls.append(f"datasets {skip_batches}")
            return ("train", "eval", "final") if tokenizer == "with final" else ("train", "eval")

        def evaluate(self, model, final):
            return {"evaluated": final}

    task = Probe(types.SimpleNamespace(task=None, training=None))
    data = task.data("with final", skip_batches=3)
    assert (data.train, data.eval, data.final) == ("train", "eval", "final")
    assert task.data("without").final is None
    assert calls == ["load_data", "datasets 3", "datasets 0"]
    assert task.final_metrics("model", data, "kept") == {"evaluated": "final"}
    assert task.final_metrics("model", task.data("without"), "kept") == {"evaluated": "kept"}
