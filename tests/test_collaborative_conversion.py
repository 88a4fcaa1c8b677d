"""Conversion of trained attention layers to collaborative attention (CP decomposition)."""

import numpy as np
import pytest

from concise_attention.models import CollaborativeAttention
from concise_attention.models import FixedHeadSizeAttention
from concise_attention.models import StandardAttention
from concise_attention.models.collaborative import convert_attention
from concise_attention.models.collaborative import query_key_tensor

WIDTH, LENGTH, BATCH = 24, 7, 2


def _trained(layer, seed=3):
    layer.build((BATCH, LENGTH, WIDTH))
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.normal(scale=0.4, size=w.shape).astype("float32") for w in layer.get_weights()])
    return layer


def _tokens(seed=0):
    return np.random.default_rng(seed).normal(size=(BATCH, LENGTH, WIDTH)).astype("float32")


def _mask():
    return np.array([[1] * LENGTH, [1] * (LENGTH - 2) + [0, 0]], bool)


@pytest.mark.parametrize("factory", [lambda: StandardAttention(4), lambda: FixedHeadSizeAttention(3, head_size=10)])
def test_full_rank_conversion_is_exact(factory):
    layer = _trained(factory())
    full = layer.num_heads * layer.query_dense.kernel.shape[-1]
    converted, report = convert_attention(layer, full)
    assert isinstance(converted, CollaborativeAttention) and report["relative_error"] < 1e-6
    for kwargs in ({}, {"attention_mask": _mask()}, {"use_causal_mask": True}):
        expected, expected_probs = layer(_tokens(), return_attention_scores=True, **kwargs)
        outputs, probs = converted(_tokens(), return_attention_scores=True, **kwargs)
        np.testing.assert_allclose(np.asarray(outputs), np.asarray(expected), atol=1e-4)
        np.testing.assert_allclose(np.asarray(probs), np.asarray(expected_probs), atol=1e-5)


def test_cp_conversion_keeps_the_heads_temperature():
    """Heads built from 4 shared directions have an exact rank-4 CP: converting at D~k = 4
    (through ALS, not the closed form) must then give the original probabilities. A
    conversion scaling the softmax by 1/sqrt(D~k) instead of 1/sqrt(head_size) would be
    off by a factor sqrt(6/4) in the logits, far beyond the tolerance."""
    layer = _trained(FixedHeadSizeAttention(3, head_size=6))
    rng = np.random.default_rng(11)
    shared_query, shared_key, mixing = rng.normal(size=(WIDTH, 4)), rng.normal(size=(WIDTH, 4)), rng.normal(size=(3, 4))
    query = np.zeros((WIDTH, 3, 6))
    key = np.zeros((WIDTH, 3, 6))
    for head in range(3):
        query[:, head, :4] = shared_query * mixing[head]
        key[:, head, :4] = shared_key
    layer.query_dense.kernel.assign(0.5 * query)
    layer.key_dense.kernel.assign(0.5 * key)
    converted, report = convert_attention(layer, 4, seed=0, n_iter_max=2000, tol=1e-14)
    assert report["relative_error"] < 1e-4
    probs = np.asarray(converted(_tokens(), return_attention_scores=True)[1])
    expected = np.asarray(layer(_tokens(), return_attention_scores=True)[1])
    np.testing.assert_allclose(probs, expected, atol=1e-3)
    wrong = np.asarray(_rescaled(layer, np.sqrt(6 / 4))(_tokens(), return_attention_scores=True)[1])
    assert np.abs(wrong - expected).max() > 0.05  # the check above could tell a wrong temperature apart


def _rescaled(layer, factor):
    """The same layer with its logits multiplied by `factor` (a wrong temperature)."""
    copy = FixedHeadSizeAttention.from_config(layer.get_config())
    copy.build((BATCH, LENGTH, WIDTH))
    copy.set_weights(layer.get_weights())
    copy.query_dense.kernel.assign(np.asarray(layer.query_dense.kernel) * factor)
    copy.query_dense.bias.assign(np.asarray(layer.query_dense.bias) * factor)
    return copy


def test_reconstruction_error_falls_with_rank_and_is_deterministic():
    layer = _trained(StandardAttention(4))
    errors = [convert_attention(layer, rank, seed=1)[1]["relative_error"] for rank in (4, 12, 20)]
    assert errors[0] > errors[1] > errors[2]
    again = convert_attention(layer, 12, seed=1)[0]
    first = convert_attention(layer, 12, seed=1)[0]
    for a, b in zip(first.get_weights(), again.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_query_key_tensor_is_the_stack_of_head_products():
    layer = _trained(StandardAttention(4))
    q, k = np.asarray(layer.query_dense.kernel), np.asarray(layer.key_dense.kernel)
    np.testing.assert_allclose(query_key_tensor(layer)[2], q[:, 2, :] @ k[:, 2, :].T, atol=1e-6)


def test_report_counts_query_key_parameters():
    layer = _trained(StandardAttention(4))
    converted, report = convert_attention(layer, 12)
    assert report["query_key_parameters_before"] == 2 * WIDTH * WIDTH + 2 * WIDTH
    assert report["query_key_parameters_after"] == (2 * WIDTH + 4) * 12 + WIDTH * 4
    # FLOP counts are the layers' own (checked against XLA's cost analysis in test_attention).
    assert report["query_key_flops_before"] == layer.query_key_flops(128)
    assert report["query_key_flops_after"] == converted.query_key_flops(128)
    # Width 24 is narrow against length 128: the logits (N * T * S * D~k) outweigh the saved projections.
    assert report["query_key_flops_after"] > report["query_key_flops_before"]


@pytest.mark.parametrize("shared_key_dim", [0, 25, 2.5])
def test_bad_ranks_are_refused(shared_key_dim):
    with pytest.raises(ValueError, match=f"shared_key_dim={shared_key_dim!r}"):
        convert_attention(_trained(StandardAttention(4)), shared_key_dim)


def test_only_attention_layers_convert():
    import keras

    dense = keras.layers.Dense(4)
    with pytest.raises(ValueError, match="Only standard or fixed-head-size attention.*Dense"):
        convert_attention(dense, 4)
    with pytest.raises(ValueError, match="CollaborativeAttention"):
        convert_attention(_trained(CollaborativeAttention(4, 8, 6)), 4)
    with pytest.raises(ValueError, match="not built"):
        convert_attention(StandardAttention(4), 4)


def test_minilm_layer_converts_exactly(minilm_dir):
    from concise_attention.models.hf_import import load_hf_bert

    encoder = load_hf_bert(minilm_dir)
    attention = encoder.blocks[0].attention
    converted, report = convert_attention(attention, 384)
    tokens = np.random.default_rng(0).normal(size=(2, 9, 384)).astype("float32")
    np.testing.assert_allclose(np.asarray(converted(tokens)), np.asarray(attention(tokens)), atol=1e-4)
    assert report["relative_error"] < 1e-6


def test_encoder_conversion_at_full_rank_is_exact():
    from concise_attention.models.collaborative import convert_model
    from concise_attention.training.run import configs

    encoder = configs.load_config("tiny_bert_standard").build_model()
    for variable in encoder.weights:  # "trained": no zero biases hiding a mistake
        variable.assign(np.random.default_rng(len(variable.path)).normal(scale=0.2, size=variable.shape))
    converted, reports = convert_model(encoder, 32, progress=False)
    assert converted.attention["type"] == "collaborative" and len(reports) == 2
    ids = np.array([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]], "int32")
    inputs = {"input_word_ids": ids, "input_mask": (ids > 0).astype("int32"), "input_type_ids": 0 * ids}
    expected, outputs = encoder(inputs), converted(inputs)
    np.testing.assert_allclose(
        np.asarray(outputs["sequence_output"]), np.asarray(expected["sequence_output"]), atol=1e-4
    )
    np.testing.assert_allclose(np.asarray(outputs["pooled_output"]), np.asarray(expected["pooled_output"]), atol=1e-4)


def _run_dir(tmp_path):
    """A run directory holding a 'trained' tiny BERT, written through the run-directory module."""
    from concise_attention.training.run import configs

    from concise_attention.models.bert import BertPretrainer
    from concise_attention.training.run import runs

    config = configs.load_config("tiny_bert_standard")
    model = BertPretrainer(config.build_model())  # a BERT run saves the encoder with its MLM head
    for variable in model.weights:
        variable.assign(np.random.default_rng(len(variable.path)).normal(scale=0.2, size=variable.shape))
    run = runs.RunDirectory(tmp_path / "run")
    run.start(config.to_dict())
    run.write_vocabulary(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(20)])
    run.save_models(model.encoder, model)
    return tmp_path / "run", model.encoder


def _cli(*arguments, process=False):
    """`concise-collaborative` with `arguments`: (returncode, stdout, stderr) in this process, or in a
    process of its own (`process=True`: the command as a user runs it, tested once)."""
    import subprocess
    import sys

    from in_process import run_main

    from concise_attention.cli import collaborative

    if process:
        argv = [str(argument) for argument in arguments]
        return subprocess.run(
            [sys.executable, "-m", "concise_attention.cli.collaborative", *argv],
            capture_output=True,
            text=True,
            timeout=300,
        )
    return run_main(collaborative.main, arguments)


def test_command_converts_a_run_and_the_result_reloads(tmp_path):
    import json

    from concise_attention.models import BUILDERS

    run, model = _run_dir(tmp_path)
    result = _cli("--run", run, "--ratio", 1.0, "--out", tmp_path / "out", process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "transformer_layer_1: D~k=32" in result.stdout
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    converted = BUILDERS[saved["model_type"]](**saved["model"])
    converted.load_weights(tmp_path / "out" / "backbone.weights.h5")
    ids = np.array([[5, 6, 7, 0], [8, 9, 10, 11]], "int32")
    inputs = {"input_word_ids": ids, "input_mask": (ids > 0).astype("int32"), "input_type_ids": 0 * ids}
    np.testing.assert_allclose(
        np.asarray(converted(inputs)["sequence_output"]), np.asarray(model(inputs)["sequence_output"]), atol=1e-4
    )
    assert len(json.loads((tmp_path / "out" / "conversion_report.json").read_text())) == 2


@pytest.mark.parametrize(
    "arguments, message",
    [(["--shared-key-dim", 0], "shared_key_dim=0"), (["--shared-key-dim", 33], "num_heads \\* head_size = 32")],
)
def test_bad_requests_fail_clearly_and_write_nothing(tmp_path, arguments, message):
    import re

    run, _ = _run_dir(tmp_path)
    result = _cli("--run", run, *arguments, "--out", tmp_path / "out")
    assert result.returncode == 2 and re.search(message, result.stderr) and result.stderr.strip().count("\n") == 0, (
        result.stderr[-2000:]
    )
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["run"]


def test_wrong_checkpoint_and_existing_output_are_refused(tmp_path):
    import json

    run, _ = _run_dir(tmp_path)
    config = json.loads((run / "config.json").read_text())
    config["model"]["hidden_size"] = 64
    config["model"]["intermediate_size"] = 64
    (run / "config.json").write_text(json.dumps(config))
    result = _cli("--run", run, "--ratio", 0.5, "--out", tmp_path / "out")
    assert result.returncode == 2 and "cannot be loaded" in result.stderr and not (tmp_path / "out").exists()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    result = _cli("--run", run, "--ratio", 0.5, "--out", tmp_path / "out")
    assert result.returncode == 2 and "--overwrite" in result.stderr
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


@pytest.mark.slow
def test_converted_language_model_fine_tunes_through_the_trainer(tmp_path, capsys):
    """Train a tiny LM, convert it at half the key dimension, fine-tune the result with the normal trainer
    (both CLIs in this process: their own processes are tested elsewhere)."""
    import json

    from concise_attention.cli import train as train_cli

    def train(run, config, *overrides):
        argv = ["--config", str(config), "--run-dir", str(run), "--quiet"]
        for override in (
            *(("model.dropout=0", "model.attention_dropout=0") if config == "tiny_lm" else ()),
            *overrides,
        ):
            argv += ["--set", override]
        capsys.readouterr()
        assert train_cli.main(argv) == 0
        out = capsys.readouterr().out
        return json.loads(out[out.index("{") :])

    trained = train(tmp_path / "base", "tiny_lm", "training.train_steps=40")
    result = _cli("--run", tmp_path / "base", "--ratio", 0.5, "--out", tmp_path / "converted", "--iterations", 50)
    assert result.returncode == 0, result.stderr[-3000:]
    # The converted run directory is task.init; its architecture, vocabulary and tokenizer come with it.
    recipe = tmp_path / "fine_tune.yaml"
    recipe.write_text(
        f"task:\n  name: causal_lm\n  init: {tmp_path / 'converted'}\ntraining:\n  sequence_length: 64\n  batch_size: 8\n"
        "  eval_batches: 4\n  steps_per_execution: 5\n  jit_compile: false\n"
    )
    start = train(
        tmp_path / "zero",
        recipe,
        "training.train_steps=1",
        "training.steps_per_epoch=1",
        "training.steps_per_execution=1",
        "training.learning_rate=1e-9",
    )
    tuned = train(
        tmp_path / "tuned",
        recipe,
        "training.train_steps=40",
        "training.steps_per_epoch=20",
        "training.learning_rate=0.002",
        "training.warmup_steps=5",
    )
    saved = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert saved["model"]["attention"]["type"] == "collaborative" and saved["tokenizer"]["lowercase"] is True
    assert (tmp_path / "tuned" / "vocab.txt").read_bytes() == (tmp_path / "base" / "vocab.txt").read_bytes()
    assert start["eval_loss"] < trained["eval_loss"] + 1.0  # the conversion kept most of what was learned
    assert tuned["eval_loss"] < start["eval_loss"]  # and fine-tuning recovers


def test_overwrite_keeps_the_old_output_until_the_new_one_is_in_and_out_is_an_ordinary_folder(tmp_path, monkeypatch):
    """OUT gets the mode a folder made by hand gets (not mkdtemp's 0700); --overwrite moves the old OUT aside
    before the new one is renamed in, so a failure (a kill) between the two renames leaves the old one on disk."""
    import os
    import pathlib

    from concise_attention.training import files

    run, _ = _run_dir(tmp_path)
    out = tmp_path / "out"
    result = _cli("--run", run, "--ratio", 0.5, "--out", out)
    assert result.returncode == 0, result.stderr[-2000:]
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask
    (out / "old.txt").write_text("the old output")
    renames, real_rename = [], os.rename

    def killed_after_the_first(source, target):
        if renames:
            raise KeyboardInterrupt  # as a kill between the two renames
        renames.append(target)
        real_rename(source, target)

    monkeypatch.setattr(os, "rename", killed_after_the_first)
    staging = tmp_path / ".new"
    staging.mkdir()
    with pytest.raises(KeyboardInterrupt):
        files.move_folder_in(staging, out)
    assert (pathlib.Path(renames[0]) / "old.txt").read_text() == "the old output" and staging.is_dir()
    monkeypatch.setattr(os, "rename", real_rename)
    files.move_folder_in(staging, out)
    assert out.is_dir() and not (out / "old.txt").exists() and not staging.exists()
