"""benchmarks/interpolation.py: encoders between two in weight space, and the run directory --save writes."""

import json

import numpy as np
import pytest
from loading import load

from concise_attention.models.bert import BertEncoder
from concise_attention.training import artifacts
from concise_attention.training import files
from concise_attention.training.run import configs

VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz"]


def run_directory(path, seed):
    """A run directory of the tiny BERT at `seed`: config.json, vocab.txt, backbone.weights.h5."""
    config = configs.load_config("tiny_bert_fixed", [f"model.vocab_size={len(VOCABULARY)}"])
    backbone = BertEncoder(**config.to_dict()["model"], seed=seed)
    path.mkdir()
    files.write_json_atomically(path / files.CONFIG, config.to_dict() | {"model_type": "bert"})
    (path / files.VOCABULARY).write_text("\n".join(VOCABULARY) + "\n")
    files.save_weights(backbone, path / files.BACKBONE_WEIGHTS)
    return [weight.numpy() for weight in backbone.weights]


def test_saved_encoder_is_the_weighted_mean_of_the_two_and_records_how(tmp_path):
    interpolation = load("benchmarks/interpolation.py")
    start = run_directory(tmp_path / "start", seed=1)
    end = run_directory(tmp_path / "end", seed=2)
    encoder, move_to = interpolation.interpolator(str(tmp_path / "start"), str(tmp_path / "end"))
    move_to(0.25)
    record = {"start": "start", "end": "end", "share": 0.25, "selected_on": "dev"}
    interpolation.save(encoder, str(tmp_path / "end"), str(tmp_path / "mixed"), record)

    saved = artifacts.load(str(tmp_path / "mixed"), kind="run").backbone
    for variable, a, b in zip(saved.weights, start, end, strict=True):
        np.testing.assert_allclose(variable.numpy(), 0.75 * a + 0.25 * b, rtol=1e-6, atol=1e-7)
    assert json.loads((tmp_path / "mixed" / files.CONFIG).read_text())["interpolation"] == record
    assert (tmp_path / "mixed" / files.VOCABULARY).read_text() == (tmp_path / "end" / files.VOCABULARY).read_text()
    from concise_attention.export import ship  # the model card of a shipped interpolated run says how it was made

    card_line = ship._interpolation(record)
    assert "0.75 x its start's + 0.25 x the distilled weights" in card_line and "--split dev" in card_line


def test_encoders_of_two_architectures_are_refused(tmp_path):
    interpolation = load("benchmarks/interpolation.py")
    run_directory(tmp_path / "start", seed=1)
    config = configs.load_config("tiny_bert_fixed", [f"model.vocab_size={len(VOCABULARY)}", "model.num_layers=1"])
    other = tmp_path / "end"
    other.mkdir()
    files.write_json_atomically(other / files.CONFIG, config.to_dict() | {"model_type": "bert"})
    (other / files.VOCABULARY).write_text("\n".join(VOCABULARY) + "\n")
    files.save_weights(BertEncoder(**config.to_dict()["model"]), other / files.BACKBONE_WEIGHTS)
    with pytest.raises(ValueError, match="not of one architecture"):
        interpolation.interpolator(str(tmp_path / "start"), str(other))
