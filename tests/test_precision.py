"""training.precision: mixed bfloat16 and float16 train tiny_lm as float32 does, through the
CLI's code path, with float32 variables and optimizer state; the served model is float32."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from concise_attention.cli import export as export_cli
from concise_attention.cli import train as train_cli
from concise_attention.training.run import configs
from concise_attention.training.tasks.objectives import StepCountingLossScaleOptimizer

STEPS = 200


def _train(run, precision, config="tiny_lm", overrides=()):
    """Trains through `concise-train-lm`'s main; returns (metrics.json, the model fit trained)."""
    models = []
    fit = keras.Model.fit

    def recording_fit(model, *args, **kwargs):
        models.append(model)
        return fit(model, *args, **kwargs)

    argv = ["--config", config, "--run-dir", str(run), "--quiet", "--set", f"training.precision={precision}"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(keras.Model, "fit", recording_fit)
        assert train_cli.main(argv + [item for override in overrides for item in ("--set", override)]) == 0
    return json.loads((run / "metrics.json").read_text()), models[-1]


def _tiny_lm(run, precision):
    return _train(run, precision, overrides=[f"training.train_steps={STEPS}", f"training.steps_per_epoch={STEPS}"])


def _policies(model):
    """The dtype policies of the model's layers that hold weights."""
    return {layer.dtype_policy.name for layer in model.layers if layer.weights}


@pytest.fixture(scope="module")
def float32_run(tmp_path_factory):
    return _tiny_lm(tmp_path_factory.mktemp("float32") / "run", "float32")


@pytest.mark.slow
@pytest.mark.parametrize("precision, compute_dtype", [("mixed_bfloat16", "bfloat16"), ("mixed_float16", "float16")])
def test_mixed_precision_trains_like_float32_with_float32_variables(float32_run, tmp_path, precision, compute_dtype):
    reference, float32_model = float32_run
    metrics, model = _tiny_lm(tmp_path / "run", precision)
    assert metrics["step"] == reference["step"] == STEPS
    # Within 2% of float32's evaluation loss, and not the float32 run itself.
    assert abs(metrics["eval_loss"] / reference["eval_loss"] - 1.0) < 0.02, (metrics, reference)
    assert metrics["eval_loss"] != reference["eval_loss"]
    assert _policies(float32_model) == {"float32"} and not isinstance(
        float32_model.optimizer, keras.optimizers.LossScaleOptimizer
    )
    # The model computes in 16 bits; its variables and the optimizer's state stay float32.
    assert _policies(model) == {precision}
    assert [weight.path for weight in model.weights if weight.dtype != "float32"] == []
    state = model.optimizer.variables
    assert [variable.path for variable in state if variable.dtype not in ("float32", "int64", "int32")] == []
    assert len([variable for variable in state if variable.dtype == "float32"]) >= 2 * len(model.trainable_weights)
    logits = model({name: np.zeros((1, 8), "int32") for name in ("token_ids", "segment_ids", "positions")})
    assert keras.backend.standardize_dtype(logits.dtype) == compute_dtype
    # float16 (and only float16) trains through dynamic loss scaling, every step counted.
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer) == (precision == "mixed_float16")
    assert int(model.optimizer.iterations.numpy()) == STEPS


def test_a_skipped_float16_step_is_counted():
    """An overflowing step changes no weight and halves the scale, as Keras' LossScaleOptimizer
    does, and counts as a step (as tf.keras' did): the step is the batches consumed."""
    weights = keras.Variable([1.0, 2.0])
    optimizer = StepCountingLossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=8.0)
    optimizer.build([weights])
    step = tf.function(lambda gradients: optimizer.apply([gradients], [weights]))
    step(tf.constant([np.inf, 1.0]))
    np.testing.assert_array_equal(weights.numpy(), [1.0, 2.0])
    assert float(optimizer.dynamic_scale.numpy()) == 4.0 and int(optimizer.iterations.numpy()) == 1
    step(tf.constant([4.0, -8.0]))  # scaled by 4: the true gradients are [1, -2]
    np.testing.assert_array_equal(weights.numpy(), [1.0 - 0.5 * 1.0, 2.0 + 0.5 * 2.0])
    assert int(optimizer.iterations.numpy()) == 2 and int(optimizer.inner_optimizer.iterations.numpy()) == 2


def test_unknown_precision_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_cli.main(
            ["--config", "tiny_lm", "--run-dir", str(tmp_path / "run"), "--set", "training.precision=bfloat16"]
        )
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "training.precision='bfloat16'" in error and "mixed_bfloat16" in error
    assert "Traceback" not in error and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_served_model_of_a_mixed_bfloat16_run_is_float32(tmp_path):
    """A run directory as a mixed_bfloat16 run leaves it (written through `training.run.runs`),
    exported: float32 variables, float32 outputs, no bfloat16 anywhere in the served graphs."""
    from concise_attention.models.bert import BertPretrainer
    from concise_attention.training.run import runs

    config = configs.load_config("tiny_bert_fixed", ["training.precision=mixed_bfloat16"])
    pretrainer = BertPretrainer(config.build_model(dtype=keras.DTypePolicy("mixed_bfloat16")))
    assert _policies(pretrainer.encoder) == {"mixed_bfloat16"}
    run = runs.RunDirectory(tmp_path / "run")
    run.start(config.to_dict() | {"name": config.name})
    run.write_vocabulary(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "mixed", "run", "served"])
    run.save_models(pretrainer.encoder, pretrainer)
    assert export_cli.main(["--run", run.path, "--out", str(tmp_path / "out")]) == 0
    serving = tf.saved_model.load(str(tmp_path / "out" / "serving" / "1"))
    encoder = tf.saved_model.load(str(tmp_path / "out" / "hub" / "1" / "encoder"))
    for path in ("serving/1", "hub/1/encoder"):
        dtypes = tf.train.load_checkpoint(
            str(tmp_path / "out" / path / "variables" / "variables")
        ).get_variable_to_dtype_map()
        assert {dtype for dtype in dtypes.values() if dtype.is_floating} == {tf.float32}, path
    signature = serving.signatures["serving_default"]
    outputs = signature(text=tf.constant(["a mixed run", "served"]))
    assert set(outputs) == {"embedding"} and all(value.dtype == tf.float32 for value in outputs.values())
    ids = {name: tf.ones((2, 8), tf.int32) for name in ("input_word_ids", "input_mask", "input_type_ids")}
    assert all(value.dtype == tf.float32 for value in tf.nest.flatten(encoder(ids, training=False)))
    for graph in (signature.graph, encoder.signatures["serving_default"].graph):
        assert "DT_BFLOAT16" not in str(graph.as_graph_def())
