"""The quickstart: the README's first command runs the main job end to end."""

import pathlib
import re
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_first_command_is_the_quickstart():
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)```", readme, re.S).group(1).strip()
    assert (
        first
        == "python3 -m venv .venv && .venv/bin/pip install -c constraints.txt -e . && .venv/bin/concise-quickstart --out my_export"
    )


def test_quickstart_pretrains_exports_and_shows_masked_word_predictions(tmp_path):
    """The quickstart job as the README runs it (its default config, 120 of its 1,000 steps: past its 100 warm-up
    steps), in a fresh process; its printed predictions are recomputed here from the exported `.mlm` with ids of
    Hugging Face's `tokenizers` (an independent tokenizer), so they show what the export does."""
    import json

    import tensorflow as tf
    from tokenizers import BertWordPieceTokenizer

    from concise_attention.cli.quickstart import PROBES

    result = subprocess.run(
        [
            *(sys.executable, "-m", "concise_attention.cli.quickstart", "--out", str(tmp_path / "my_export")),
            *("--set", "training.train_steps=120"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout
    assert re.search(r"step 120: eval MLM loss (\d+\.\d+)", out) and "[3/3] masked-word predictions" in out
    rows = re.findall(r"    (trained|untrained) +top 5: (.*?)   \| '(\w+)' ranked (\d+) of (\d+)", out)
    assert [(name, word) for name, _, word, _, _ in rows] == [
        (name, word) for _, word in PROBES for name in ("trained", "untrained")
    ]
    for name in ("encoder", "preprocess", "keras", "tarball", "serving", "models_config"):
        path = re.search(rf"  {name}\s+(\S+)", out).group(1)
        assert path.startswith(str(tmp_path / "my_export" / "export")) and pathlib.Path(path).exists(), name

    export = tmp_path / "my_export" / "export" / "hub" / "1"
    encoder = tf.saved_model.load(str(export / "encoder"))
    vocabulary = str(export / "encoder" / "assets" / "vocab.txt")
    tokens = pathlib.Path(vocabulary).read_text().splitlines()
    settings = json.loads((export / "export.json").read_text())
    tokenizer = BertWordPieceTokenizer(
        vocabulary, lowercase=settings["lowercase"], strip_accents=settings["strip_accents"]
    )
    trained = [(top, int(rank)) for name, top, _, rank, _ in rows if name == "trained"]
    for (sentence, word), (top, rank) in zip(PROBES, trained):
        ids = tokenizer.encode(sentence).ids
        position = ids.index(tokens.index(word))
        ids[position] = tokens.index("[MASK]")
        padded = ids + [0] * (settings["seq_length"] - len(ids))  # as the quickstart's preprocessor packs them
        inputs = {
            "input_word_ids": tf.constant([padded]),
            "input_mask": tf.constant([[int(i > 0) for i in padded]]),
            "input_type_ids": tf.zeros([1, len(padded)], tf.int32),
            "masked_lm_positions": tf.constant([[position]]),
        }
        logits = encoder.mlm(inputs, training=False)["mlm_logits"].numpy()[0, 0, : len(tokens)]
        probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        _assert_ranked_as_printed(top, rank, probabilities, tokens, word, sentence)
    _assert_similarities_as_printed(out)
    assert (
        "(its model card, from MTEB's protocols; `concise-evaluate --encoder concise-minilm-d192` scores it again)"
        in out
    )
    assert re.search(r"\| encoder \| width \| STSBenchmark \| Banking77Classification \| mean \|", out)
    assert re.search(r"\| this encoder \| 192 \| 0\.\d{4} \| 0\.\d{4} \|", out)


def _assert_similarities_as_printed(out):
    """The shipped encoder's and the teacher's printed cosines: the teacher's equal a numpy BERT on
    Hugging Face `tokenizers` ids, the shipped encoder's its Keras encoder with numpy pooling on the
    same ids; under both every paraphrase scores above every unrelated pair."""
    from test_hf_export import hugging_face_ids
    from test_hf_export import keras_mean_pooled
    from test_hf_export import reference_embeddings

    from concise_attention.models import presets
    from concise_attention.models.bert import BertEncoder
    from concise_attention.cli.quickstart import PARAPHRASES
    from concise_attention.cli.quickstart import SIMILARITY_PAIRS
    from concise_attention.training.tasks.distill import default_teacher

    [name] = presets.shipped_presets()[:1]
    rows = re.findall(r"    (paraphrase|unrelated ) +(-?\d\.\d{3}) +(-?\d\.\d{3})   (.*) / (.*)", out)
    assert [(a, b) for *_, a, b in rows] == list(SIMILARITY_PAIRS) and f"{name} (" in out
    teacher = pathlib.Path(default_teacher())
    texts = [text for pair in SIMILARITY_PAIRS for text in pair]
    ids = hugging_face_ids(teacher / "vocab.txt", texts, 128, strip_accents=True)
    student = keras_mean_pooled(BertEncoder.from_preset(name), ids)
    for column, embeddings in ((1, student), (2, reference_embeddings(teacher, ids))):
        unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
        expected = (unit[0::2] * unit[1::2]).sum(1)
        printed = np.array([float(row[column]) for row in rows])
        np.testing.assert_allclose(printed, expected, atol=0.0015)
        assert printed[:PARAPHRASES].min() > printed[PARAPHRASES:].max(), (column, printed)


def _assert_ranked_as_printed(top, rank, probabilities, tokens, word, sentence, tie=1e-6):
    """The printed top 5 and rank are those of `probabilities` up to ties within `tie`: a briefly
    trained model gives many tokens nearly equal probabilities, whose order float noise may swap."""
    printed = re.findall(r"(\S+) (\d\.\d\d)(?:, |$)", top)  # a token may be "," itself
    assert len(printed) == 5, top
    for token, shown in printed:
        assert abs(probabilities[tokens.index(token)] - float(shown)) <= 0.005 + tie, (sentence, token, shown)
    fifth = min(probabilities[tokens.index(token)] for token, _ in printed)
    above = {tokens[i] for i in np.flatnonzero(probabilities > fifth + tie)}
    assert above <= {token for token, _ in printed}, (sentence, top, above)
    target = probabilities[tokens.index(word)]
    assert np.sum(probabilities > target + tie) < rank <= np.sum(probabilities >= target - tie), (sentence, word, rank)
