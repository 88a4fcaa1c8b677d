"""Extension points: a new attention variant and a new task, defined HERE, registered through the
public registries and trained through the CLI's code path, with no library file touched."""

import dataclasses
import json

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from models.attention import FixedHeadSizeAttention
from models.transformer import ATTENTION_TYPES
from models.transformer import register_attention
from training import cli
from training.data import SAMPLE_CORPUS
from training.data import read_lines
from training.tasks import TASKS
from training.tasks import Task
from training.tasks import TaskSettings
from training.tasks import register_task


class SharpAttention(FixedHeadSizeAttention):
    """Fixed head size attention with logits twice as sharp: only the logits hook changes."""

    def _attention_logits(self, query, key):
        return 2.0 * super()._attention_logits(query, key)


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
        from models.heads import BertClassifier

        return BertClassifier(backbone, num_outputs=1)

    def compile_arguments(self):
        return {"loss": keras.losses.MeanSquaredError()}

    def datasets(self, tokenizer, skip_batches):
        length, batch = self.training.sequence_length, self.training.batch_size
        pad = tokenizer.token_to_id("[PAD]")

        def encode(text, count):
            ids = tokenizer(text[None])[0][:length]
            ids = tf.pad(ids, [[0, length - tf.shape(ids)[0]]], constant_values=pad)
            inputs = {"input_word_ids": ids, "input_mask": tf.cast(ids != pad, tf.int32), "input_type_ids": tf.zeros_like(ids)}
            return inputs, count, 1.0

        counts = np.array([len(line.split()) for line in self.lines], "float32")[:, None] / 10.0
        data = tf.data.Dataset.from_tensor_slices((self.lines, counts)).map(encode)
        train = data.repeat().shuffle(64, seed=self.training.seed).batch(batch, drop_remainder=True).skip(skip_batches)
        return train, data.batch(batch, drop_remainder=True)

    def evaluate(self, model, eval_data, eval_steps):
        return {"eval_loss": model.evaluate(eval_data, steps=eval_steps, verbose=0, return_dict=True)["loss"]}


def test_a_new_attention_variant_and_a_new_task_train_through_the_cli(tmp_path, capsys):
    register_attention("sharp", SharpAttention)
    register_task(WordCountTask)
    try:
        config = tmp_path / "word_count.yaml"
        config.write_text(
            "model_type: bert\n"
            "model: {vocab_size: 300, hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 32,"
            " attention_type: sharp, head_size: 16, max_sequence_length: 32}\n"
            "task: {name: word_count, max_lines: 120}\n"
            "training: {sequence_length: 32, batch_size: 8, train_steps: 6, steps_per_epoch: 3, steps_per_execution: 3,"
            " eval_batches: 2, learning_rate: 0.001, warmup_steps: 1, jit_compile: false}\n"
        )
        assert cli.main(["--config", str(config), "--run-dir", str(tmp_path / "run"), "--quiet"]) == 0
        out = capsys.readouterr().out
        metrics = json.loads(out[out.index("{"):])
        assert metrics["task"] == "word_count" and metrics["step"] == 6 and np.isfinite(metrics["eval_loss"])
        saved = json.loads((tmp_path / "run" / "config.json").read_text())
        assert saved["task"] == {"name": "word_count", "init": None, "max_lines": 120}
        assert json.loads((tmp_path / "run" / "metrics.json").read_text()) == metrics

        from training import runs

        _, model, backbone, _ = runs.load_model(tmp_path / "run")
        attention = backbone.blocks[0].attention
        assert type(attention) is SharpAttention
        # The hook is what runs: the logits are twice those of the base class on the same weights.
        x = ops.convert_to_tensor(np.random.default_rng(0).normal(size=(1, 5, 32)).astype("float32"))
        np.testing.assert_allclose(np.asarray(attention._attention_logits(x, x)),
                                   2.0 * np.asarray(FixedHeadSizeAttention._attention_logits(attention, x, x)), rtol=1e-6)
    finally:
        ATTENTION_TYPES.pop("sharp", None)
        TASKS.pop("word_count", None)


def test_a_variant_overriding_the_logits_hook_is_not_bypassed_by_the_fused_path():
    layer = SharpAttention(num_heads=2, head_size=8)
    x = np.random.default_rng(1).normal(size=(2, 5, 16)).astype("float32")
    sharp = np.asarray(layer(x, x))  # inference, no scores: the fused path would apply to the base class
    _, scores = layer(x, x, return_attention_scores=True)  # explicit path, through the overridden hook
    base = FixedHeadSizeAttention(num_heads=2, head_size=8)
    base(x, x)
    base.set_weights(layer.get_weights())
    assert np.abs(sharp - np.asarray(base(x, x))).max() > 1e-4  # the override changed the output
    np.testing.assert_allclose(sharp, np.asarray(layer(x, x, return_attention_scores=True)[0]), rtol=1e-5, atol=1e-6)
    assert scores.shape == (2, 2, 5, 5)
