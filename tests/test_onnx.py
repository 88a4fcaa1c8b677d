"""`concise-export --onnx`: the ONNX model folder of export/onnx.py, run by onnx's own reference evaluator (numpy, an
implementation independent of TensorFlow and of us) and tokenised by Hugging Face `tokenizers` from its
tokenizer.json, gives the encoder's embeddings; its files are those sentence-transformers reads."""

import json

import numpy as np
import pytest
import tensorflow as tf

from concise_attention.cli.export import main
from concise_attention.training.inference import embeddings
from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer

PRESET = "concise-minilm-d192"
TEXTS = [
    "A man is playing a guitar.",
    "Stocks fell sharply on Monday, the third fall in a row, as traders weighed the central bank's next move.",
    "Café résumé naïve — 東京 emoji 🙂 and MIXED case",
    "short",
    "The cat sat on the mat " * 30,  # cut at the export's length
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("onnx") / "out"
    assert main(["--preset", PRESET, "--out", str(out), "--onnx", "--seq-length", "64"]) == 0
    return out


def _reference_embeddings(folder, texts):
    """Mean pooling at unit length (the folder's modules.json) of what onnx's reference evaluator computes from the
    ids of its tokenizer.json."""
    import onnx
    from onnx.reference import ReferenceEvaluator
    from tokenizers import Tokenizer

    encodings = Tokenizer.from_file(str(folder / "tokenizer.json")).encode_batch(texts)
    length = max(len(encoding.ids) for encoding in encodings)
    ids = np.array([encoding.ids + [0] * (length - len(encoding.ids)) for encoding in encodings], np.int64)
    mask = (np.arange(length)[None] < np.array([[len(encoding.ids)] for encoding in encodings])).astype(np.int64)
    evaluator = ReferenceEvaluator(onnx.load(str(folder / "onnx" / "model.onnx")))
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    (hidden,) = evaluator.run(["last_hidden_state"], inputs)
    mean = (hidden * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
    return mean / np.linalg.norm(mean, axis=1, keepdims=True)


def test_the_onnx_folder_gives_the_served_embeddings(exported):
    folder = exported / "hub" / "1" / "onnx"
    served = tf.saved_model.load(str(exported / "serving" / "1")).signatures["serving_default"]
    expected = served(text=tf.constant(TEXTS))["embedding"].numpy()
    cosines = (_reference_embeddings(folder, TEXTS) * expected).sum(1) / np.linalg.norm(expected, axis=1)
    assert cosines.min() >= 0.99999, cosines
    modules = json.loads((folder / "modules.json").read_text())
    assert [module["type"].rsplit(".", 1)[-1] for module in modules] == ["Transformer", "Pooling", "Normalize"]
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] and pooling["word_embedding_dimension"] == expected.shape[1] == 192
    assert json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"] == 64


def test_the_onnx_model_is_valid_and_the_same_bytes_from_one_conversion_to_the_next(exported, tmp_path):
    """tf2onnx names and orders nodes by object ids; the export's canonical form does not depend on them."""
    import onnx

    from concise_attention.export.onnx import onnx_model
    from concise_attention.training import artifacts

    written = exported / "hub" / "1" / "onnx" / "onnx" / "model.onnx"
    onnx.checker.check_model(str(written))
    onnx_model(artifacts.load(PRESET).backbone, tmp_path / "again.onnx")
    assert (tmp_path / "again.onnx").read_bytes() == written.read_bytes()


def test_the_tokenizer_json_gives_our_ids_on_the_hostile_corpus(exported, cased_vocabulary):
    """tokenizer.json, read by `tokenizers`, gives our tokenizer's [CLS] text [SEP] ids cut at the export's length,
    for the uncased preset and for a cased vocabulary without accent stripping."""
    from test_text import build_corpus
    from tokenizers import Tokenizer

    from concise_attention.export.onnx import hugging_face_tokenizer
    from concise_attention.training import artifacts

    corpus = build_corpus()
    source = artifacts.read(PRESET)
    written = Tokenizer.from_file(str(exported / "hub" / "1" / "onnx" / "tokenizer.json"))
    ours = embeddings.token_ids(wordpiece_tokenizer(source.vocabulary, **source.tokenizer), corpus, 64)
    theirs = [encoding.ids for encoding in written.encode_batch(corpus)]
    assert [line for line, mine, other in zip(corpus, ours, theirs) if mine != other][:5] == []
    cased = hugging_face_tokenizer(str(cased_vocabulary), lowercase=False, strip_accents=False, max_length=40)
    ours = embeddings.token_ids(wordpiece_tokenizer(cased_vocabulary, lowercase=False, strip_accents=False), corpus, 40)
    theirs = [encoding.ids for encoding in cased.encode_batch(corpus)]
    assert [line for line, mine, other in zip(corpus, ours, theirs) if mine != other][:5] == []


def test_an_onnx_export_of_a_cls_pooling_is_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit:
        main(["--preset", PRESET, "--out", str(out), "--onnx", "--pooling", "cls"])
    assert exit.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "pooling='cls'" in error[0] and "mean pooling" in error[0], error
    assert not out.exists() or not any(out.rglob("*.onnx"))
