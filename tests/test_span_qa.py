"""The `span_qa` task (SQuAD v1.1) through the CLI's code path: tfds `squad/v1.1` (mocked)
and the original JSON files, a tiny BERT trained a few steps; the reported exact match and F1
equal the official SQuAD v1.1 evaluation (re-implemented here) of the answers the trainer decoded
(recorded), whose logits equal, within float tolerance, the reloaded model's on windows built with Hugging
Face `tokenizers`. (An untrained model's span logits are nearly tied: answers decoded again from the
reloaded model could differ on float noise alone.)"""

import collections
import json
import re
import string

import numpy as np
import pytest
import scipy.special
from test_finetuning import TINY_BERT

from concise_attention.cli import train as cli
from concise_attention.training.data import squad
from concise_attention.training.run import configs
from concise_attention.training.run import runs

SHORT = [
    "training.sequence_length=32",
    "training.batch_size=4",
    "training.train_steps=4",
    "training.train_epochs=null",
    "training.steps_per_epoch=2",
    "training.steps_per_execution=2",
    "training.jit_compile=false",
    "training.learning_rate=1e-3",
    "training.warmup_fraction=null",
    "training.warmup_steps=1",
    "task.max_query_length=8",
    "task.doc_stride=8",
    "task.max_answer_length=6",
]
WORDS = (
    "the river flows past old mills while farmers grow wheat and barley near quiet villages where "
    "children play football after school every single day"
).split()


@pytest.fixture()
def vocabulary(minilm_dir):
    return str(minilm_dir / "vocab.txt")


def _train(capsys, run_dir, vocabulary, *overrides):
    argv = ["--config", "squad_v1", "--run-dir", str(run_dir), "--quiet"]
    for override in (*TINY_BERT, *SHORT, f"tokenizer.vocabulary={vocabulary}", *overrides):
        argv += ["--set", override]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    return json.loads(out[out.index("{") :])


@pytest.fixture()
def evaluated(monkeypatch):
    """The final evaluation's (start_logits, end_logits) and decoded answers, as the trainer computed them."""
    from concise_attention.training.tasks.span_qa import SpanQATask

    recorded = {}
    dev_logits, predict_answers = SpanQATask.dev_logits, SpanQATask.predict_answers

    def recording_logits(self, model, dev, dev_features):
        recorded["logits"] = dev_logits(self, model, dev, dev_features)
        return recorded["logits"]

    def recording_answers(self, start_logits, end_logits, dev_features):
        recorded["answers"] = predict_answers(self, start_logits, end_logits, dev_features)
        return recorded["answers"]

    monkeypatch.setattr(SpanQATask, "dev_logits", recording_logits)
    monkeypatch.setattr(SpanQATask, "predict_answers", recording_answers)
    return recorded


# The official SQuAD v1.1 evaluation (evaluate-v1.1.py), written out independently of training.tasks.metrics.
def _normalize(text):
    text = "".join(character for character in text.lower() if character not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def _f1(prediction, truth):
    prediction_tokens, truth_tokens = _normalize(prediction).split(), _normalize(truth).split()
    common = sum((collections.Counter(prediction_tokens) & collections.Counter(truth_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(prediction_tokens), common / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def _official_scores(predictions, questions):
    exact = [
        max(float(_normalize(predictions[qid]) == _normalize(truth)) for truth in truths) for qid, truths in questions
    ]
    f1 = [max(_f1(predictions[qid], truth) for truth in truths) for qid, truths in questions]
    return 100.0 * np.mean(exact), 100.0 * np.mean(f1)


def _reloaded_answers(run_dir, examples):
    """Answers decoded from the reloaded run's logits, the windows tokenised by HF `tokenizers`."""
    import tokenizers

    loaded = runs.load(run_dir)
    config, model, vocabulary = loaded.config, loaded.task_model, loaded.source.vocabulary
    tokenizer = tokenizers.BertWordPieceTokenizer(vocabulary, lowercase=True)

    def tokenize_words(words):
        return [tokenizer.encode(word, add_special_tokens=False).ids if word else [] for word in words]

    special_ids = {name: tokenizer.token_to_id(f"[{name.upper()}]") for name in squad.SPECIAL_TOKENS}
    task = config.task
    answers, losses, window_logits = {}, [], []
    for example in examples:
        features = squad.make_features(
            example,
            tokenize_words,
            special_ids,
            config.training.sequence_length,
            task.doc_stride,
            task.max_query_length,
        )
        outputs = model.predict(features.model_inputs(), verbose=0)
        answers[example.id] = squad.best_answer(
            example, features, outputs["start_logits"], outputs["end_logits"], task.n_best_size, task.max_answer_length
        )
        window_logits.append((np.asarray(outputs["start_logits"]), np.asarray(outputs["end_logits"])))
        for logits, positions in (
            (outputs["start_logits"], features.start_positions),
            (outputs["end_logits"], features.end_positions),
        ):
            losses.append(
                scipy.special.log_softmax(np.asarray(logits, np.float64), axis=-1)[np.arange(len(features)), positions]
            )
    # run_squad.py's loss: the mean of the start and end cross-entropies over all windows.
    loss = -0.5 * (np.concatenate(losses[0::2]).mean() + np.concatenate(losses[1::2]).mean())
    return answers, loss, len(features), [np.concatenate(side) for side in zip(*window_logits)]


def _assert_scored_as_reloaded(metrics, evaluated, logits, dev):
    """The trainer's logits are the reloaded model's; its scores are the official ones of its answers."""
    for recorded, reloaded in zip(evaluated["logits"], logits):
        np.testing.assert_allclose(recorded, reloaded, atol=1e-4)
    answers = evaluated["answers"]
    assert all(answer == "" or answer in example.context for example, answer in zip(dev, answers.values()))
    exact_match, f1 = _official_scores(
        answers, [(example.id, [text for text, _ in example.answers]) for example in dev]
    )
    assert metrics["eval_exact_match"] == pytest.approx(exact_match, abs=1e-9)
    assert metrics["eval_f1"] == pytest.approx(f1, abs=1e-9)
    return f1


def _write_squad(directory):
    """train-v1.1.json and dev-v1.1.json: long contexts (several windows each), answers at their offsets."""
    rng = np.random.default_rng(0)
    directory.mkdir()
    for split, count in (("train", 12), ("dev", 5)):
        paragraphs = []
        for index in range(count):
            context = " ".join(rng.choice(WORDS, 40)) + f". The secret is number{index}, said the miller."
            answer, middle = f"number{index}", " ".join(context.split()[10:30])
            # The long second answer gives an untrained model's spans a non-zero F1.
            qas = [
                {
                    "id": f"{split}-{index}",
                    "question": "what is the secret?",
                    "answers": [
                        {"text": answer, "answer_start": context.index(answer)},
                        {"text": middle, "answer_start": context.index(middle)},
                    ],
                }
            ]
            paragraphs.append({"context": context, "qas": qas})
        (directory / f"{split}-v1.1.json").write_text(
            json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]})
        )
    return squad.read_squad_json(directory / "dev-v1.1.json")


@pytest.mark.slow
def test_squad_json_trains_and_reports_the_official_scores_of_the_reloaded_model(
    tmp_path, capsys, vocabulary, evaluated
):
    dev = _write_squad(tmp_path / "squad")
    metrics = _train(
        capsys, tmp_path / "run", vocabulary, "task.dataset=squad_json", f"task.data_dir={tmp_path / 'squad'}"
    )
    assert metrics["task"] == "span_qa" and metrics["step"] == 4 and np.isfinite(metrics["eval_loss"])
    _, loss, windows, logits = _reloaded_answers(tmp_path / "run", dev)
    assert windows > 2  # the context is longer than one window
    assert metrics["eval_loss"] == pytest.approx(loss, rel=1e-5)
    assert _assert_scored_as_reloaded(metrics, evaluated, logits, dev) > 0


def _mock_squad_records(num_examples):
    """SQuAD-shaped records (tfds' automatic mock draws answer starts outside the context)."""
    records = []
    for index in range(num_examples):
        context = " ".join(WORDS[index:] + WORDS[:index])
        answer = WORDS[(index + 5) % len(WORDS)]
        records.append(
            {
                "id": f"mock{index}",
                "title": "mock",
                "question": f"which word is number {index}?",
                "context": context,
                "answers": {"text": [answer], "answer_start": np.array([context.index(answer)], np.int32)},
            }
        )
    return records


@pytest.mark.slow
def test_squad_from_tfds_mock_data(tmp_path, capsys, vocabulary, evaluated):
    import tensorflow as tf
    import tensorflow_datasets as tfds

    records = _mock_squad_records(10)

    def as_dataset(self, *args, **kwargs):
        return tf.data.Dataset.from_generator(
            lambda: iter(records),
            output_signature={
                "id": tf.TensorSpec([], tf.string),
                "title": tf.TensorSpec([], tf.string),
                "question": tf.TensorSpec([], tf.string),
                "context": tf.TensorSpec([], tf.string),
                "answers": {"text": tf.TensorSpec([None], tf.string), "answer_start": tf.TensorSpec([None], tf.int32)},
            },
        )

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        metrics = _train(capsys, tmp_path / "run", vocabulary)
        dev = squad.squad_examples("dev", None, "tfds")
    assert metrics["task"] == "span_qa" and len(dev) == 10
    _, loss, _, logits = _reloaded_answers(tmp_path / "run", dev)
    assert metrics["eval_loss"] == pytest.approx(loss, rel=1e-5)
    _assert_scored_as_reloaded(metrics, evaluated, logits, dev)


def test_settings_errors_name_the_field_and_value():
    with pytest.raises(ValueError, match="task.dataset='squad/v2.0'"):
        configs.load_config("squad_v1", overrides=["task.dataset=squad/v2.0"])
    with pytest.raises(ValueError, match="task.data_dir"):
        configs.load_config("squad_v1", overrides=["task.dataset=squad_json"])
    with pytest.raises(ValueError, match="task.doc_stride=0"):
        configs.load_config("squad_v1", overrides=["task.doc_stride=0"])


def test_preset_is_berts_squad_recipe():
    config = configs.load_config("squad_v1")
    assert config.task.name == "span_qa" and config.task.dataset == "squad/v1.1"
    assert (config.training.sequence_length, config.training.learning_rate, config.training.train_epochs) == (
        384,
        3e-5,
        2,
    )
    assert (config.task.doc_stride, config.task.max_query_length, config.task.max_answer_length) == (128, 64, 30)
