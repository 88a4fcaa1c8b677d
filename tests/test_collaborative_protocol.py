"""Cordonnier et al.'s protocol on a tiny model: fine-tune -> `concise-collaborative` (head carried)
-> `concise-evaluate` at once -> fine-tune again, through the CLIs' code paths, on the shipped
WordNet topics. Predictions are recomputed in the test from the reloaded models on inputs
tokenised by Hugging Face `tokenizers`; accuracies are checked against scikit-learn."""

import json
import pathlib

import numpy as np
import pytest
import sklearn.metrics

from concise_attention.models import CollaborativeAttention
from test_finetuning import SHORT
from test_finetuning import _dev_predictions
from test_finetuning import evaluated  # noqa: F401  (a fixture)
from test_finetuning import TINY_BERT
from concise_attention.cli import collaborative as collaborative_cli
from concise_attention.cli import evaluate as evaluate_cli
from concise_attention.cli import train as cli
from concise_attention.training.run import runs

DEV = pathlib.Path(__file__).resolve().parents[1] / "training" / "data" / "wordnet_topics" / "dev.tsv"
FULL_RANK = 64  # 4 heads of 16


@pytest.fixture(scope="module")
def dev_rows():
    return [line.split("\t") for line in DEV.read_text().splitlines()[1:]][:96]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, minilm_dir):
    """A tiny BERT fine-tuned on wordnet_topics for 60 steps (dev accuracy ~0.33, against 1/6
    for the majority class): a classifier whose logits depend on its input."""
    run = tmp_path_factory.mktemp("protocol") / "tuned"
    _train(
        run,
        f"tokenizer.vocabulary={minilm_dir / 'vocab.txt'}",
        "training.train_steps=60",
        "training.steps_per_epoch=60",
        "training.steps_per_execution=20",
        "training.batch_size=32",
        "training.learning_rate=5e-3",
        "training.warmup_steps=6",
        "model.dropout=0",
    )
    return run


@pytest.fixture(scope="module")
def low_rank(tuned):
    """The tuned classifier converted at D~k = 2 (of 64), head carried."""
    return _convert(tuned, tuned.parent / "k2", 2)


def _train(run, *overrides):
    argv = ["--config", "wordnet_topics", "--run-dir", str(run), "--quiet"]
    for override in (*SHORT, *overrides):
        argv += ["--set", override]
    if not any(override.startswith("task.init=") for override in overrides):
        argv += [item for override in TINY_BERT for item in ("--set", override)]
    assert cli.main(argv) == 0
    return runs.RunDirectory(run).read_metrics()


def _convert(run, out, shared_key_dim):
    argv = ["--run", str(run), "--shared-key-dim", str(shared_key_dim), "--out", str(out), "--iterations", "30"]
    assert collaborative_cli.main(argv) == 0
    return out


def _evaluate(run, capsys):
    capsys.readouterr()
    assert evaluate_cli.main(["--run", str(run)]) == 0
    out = capsys.readouterr().out
    return json.loads(out[out.index("{") :])


def _logits(run, rows):
    """The reloaded task model's logits on the texts of `rows`, tokenised by HF `tokenizers`."""
    return _dev_predictions(run, [(row[0],) for row in rows])


@pytest.mark.slow
def test_full_rank_conversion_keeps_the_fine_tuned_predictions(tuned, tmp_path, capsys, dev_rows):
    converted = _convert(tuned, tmp_path / "k64", FULL_RANK)
    assert (converted / "model.weights.h5").is_file() and (converted / "backbone.weights.h5").is_file()
    config, before = _logits(tuned, dev_rows)
    converted_config, after = _logits(converted, dev_rows)
    attention = runs.load(converted).backbone.blocks[0].attention
    assert isinstance(attention, CollaborativeAttention) and attention.shared_key_dim == FULL_RANK
    assert converted_config.task.labels == config.task.labels and converted_config.training == config.training
    assert before.std(0).mean() > 0.1  # the logits vary with the input
    np.testing.assert_allclose(after, before, atol=1e-4)
    # concise-evaluate measures the whole dev split as the trainer's final evaluation did.
    evaluated = _evaluate(converted, capsys)
    trained = runs.RunDirectory(tuned).read_metrics()
    assert evaluated["eval_accuracy"] == trained["eval_accuracy"]
    assert evaluated["eval_loss"] == pytest.approx(trained["eval_loss"], abs=1e-4)
    assert evaluated["majority_class_accuracy"] == pytest.approx(1 / 6, abs=1e-9)


@pytest.mark.slow
def test_low_rank_conversion_changes_the_predictions_and_evaluates_at_once(
    tuned, low_rank, capsys, dev_rows, evaluated
):
    converted = low_rank
    config, before = _logits(tuned, dev_rows)
    _, after = _logits(converted, dev_rows)
    assert np.abs(after - before).max() > 1e-2
    all_rows = [line.split("\t") for line in DEV.read_text().splitlines()[1:]]
    _, logits = _logits(converted, all_rows)
    labels = [config.task.labels.index(row[1]) for row in all_rows]
    metrics = _evaluate(converted, capsys)
    # what concise-evaluate scored is what the model predicts
    np.testing.assert_allclose(evaluated[-1], logits, atol=1e-4)
    assert metrics["eval_accuracy"] == pytest.approx(
        sklearn.metrics.accuracy_score(labels, evaluated[-1].argmax(-1)), abs=1e-9
    )


@pytest.mark.slow
def test_fine_tuning_the_conversion_again_starts_from_its_head(tuned, low_rank, tmp_path, capsys):
    """A run with task.init = the converted classifier trains the head it carries, not a new one:
    with learning rate 0 its first step leaves the converted model's weights and metrics as they are.
    Its per-epoch validation keeps one batch (eval_batches=1); the final metrics cover the whole dev split."""
    converted = low_rank
    metrics = _train(
        tmp_path / "again",
        f"task.init={converted}",
        "training.learning_rate=0",
        "training.train_steps=1",
        "training.warmup_steps=0",
        "training.steps_per_epoch=1",
        "training.steps_per_execution=1",
        "training.eval_batches=1",
    )
    loaded = runs.load(tuned)
    original = loaded.task_model
    loaded = runs.load(tmp_path / "again")
    again, backbone = loaded.task_model, loaded.backbone
    assert isinstance(backbone.blocks[0].attention, CollaborativeAttention)
    np.testing.assert_array_equal(np.asarray(again.classifier.kernel), np.asarray(original.classifier.kernel))
    evaluated = _evaluate(converted, capsys)
    assert metrics["eval_accuracy"] == evaluated["eval_accuracy"]


def test_evaluating_a_directory_without_a_task_model_fails_clearly(tmp_path, capsys):
    from concise_attention.training.run import configs

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps(configs.load_config("tiny_bert_standard").to_dict()))
    with pytest.raises(SystemExit) as exit_info:
        evaluate_cli.main(["--run", str(tmp_path / "run")])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "model.weights.h5" in error and "Traceback" not in error
