"""Fine-tuning tasks through the CLI's code path: GLUE classification (tfds mock data and the
original TSV files), STS-B regression. The final metrics are checked against scikit-learn and SciPy on
the predictions the trainer evaluated (recorded), and those predictions against the reloaded model's
(within float tolerance). A model trained for six steps gives nearly tied outputs, so ranks and argmaxes
recomputed from the reloaded model could flip on float noise; the recorded ones cannot."""

import json
import pathlib

import numpy as np
import pytest
import scipy.special
import scipy.stats
import sklearn.metrics

from concise_attention.cli import export as export_cli
from concise_attention.cli import evaluate as evaluate_cli
from concise_attention.cli import train as cli
from concise_attention.training.run import runs

TINY_BERT = [
    "model_type=bert",
    "model.vocab_size=30522",
    "model.hidden_size=32",
    "model.num_layers=2",
    "model.num_heads=4",
    "model.intermediate_size=64",
    "model.max_sequence_length=64",
    "model.attention={type: fixed, head_size: 16}",
]
SHORT = [
    "training.sequence_length=32",
    "training.batch_size=8",
    "training.train_steps=6",
    "training.train_epochs=null",
    "training.steps_per_epoch=3",
    "training.steps_per_execution=3",
    "training.jit_compile=false",
    "training.learning_rate=1e-3",
    "training.warmup_fraction=null",
    "training.warmup_steps=1",
]


@pytest.fixture()
def vocabulary(minilm_dir):
    return str(minilm_dir / "vocab.txt")


@pytest.fixture()
def evaluated(monkeypatch):
    """The outputs the task's final evaluation computed its metrics from, one array per evaluation."""
    from concise_attention.training.tasks.sentence import ClassificationTask

    recorded = []
    original = ClassificationTask.predictions

    def recording(self, model, eval_data):
        recorded.append(np.asarray(original(self, model, eval_data)))
        return recorded[-1]

    monkeypatch.setattr(ClassificationTask, "predictions", recording)
    return recorded


def _train(capsys, run_dir, preset, vocabulary, *overrides):
    argv = ["--config", preset, "--run-dir", str(run_dir), "--quiet"]
    for override in (*TINY_BERT, *SHORT, f"tokenizer.vocabulary={vocabulary}", *overrides):
        argv += ["--set", override]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    return json.loads(out[out.index("{") :])


def _dev_predictions(run_dir, dev_texts):
    """The reloaded run's outputs on the dev texts, tokenised as BERT by HF `tokenizers`."""
    import tokenizers

    loaded = runs.load(run_dir)
    config, model, vocabulary = loaded.config, loaded.task_model, loaded.source.vocabulary
    tokenizer = tokenizers.BertWordPieceTokenizer(vocabulary, lowercase=True)
    tokenizer.enable_truncation(config.training.sequence_length)
    tokenizer.enable_padding(length=config.training.sequence_length)
    encodings = [tokenizer.encode(*texts) for texts in dev_texts]
    inputs = {
        "input_word_ids": np.array([e.ids for e in encodings], "int32"),
        "input_mask": np.array([e.attention_mask for e in encodings], "int32"),
        "input_type_ids": np.array([e.type_ids for e in encodings], "int32"),
    }
    return config, np.asarray(model.predict(inputs, verbose=0)["logits"])


@pytest.mark.slow
def test_sst2_on_mock_data_trains_evaluates_and_reloads(tmp_path, capsys, vocabulary, evaluated):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=20):
        metrics = _train(capsys, tmp_path / "run", "glue_sst2", vocabulary)
        dev = sorted(tfds.as_numpy(tfds.load("glue/sst2", split="validation")), key=lambda example: example["idx"])
    assert metrics["task"] == "classification" and metrics["step"] == 6
    config, logits = _dev_predictions(tmp_path / "run", [(example["sentence"].decode(),) for example in dev])
    assert config.task.labels == ["negative", "positive"]  # read from the data's ClassLabel names
    labels = [example["label"] for example in dev]
    np.testing.assert_allclose(evaluated[-1], logits, atol=1e-4)  # the trainer evaluated what the reloaded run predicts
    assert metrics["eval_accuracy"] == pytest.approx(
        sklearn.metrics.accuracy_score(labels, evaluated[-1].argmax(-1)), abs=1e-9
    )


def _write_mrpc(directory):
    """MRPC's original layout: header, Quality, #1 ID, #2 ID, #1 String, #2 String."""
    rng = np.random.default_rng(0)
    words = "the cat sat on a mat while dogs ran far away from home".split()
    directory.mkdir()
    for split, rows in (("train", 41), ("dev", 13)):  # 21 of 41 training pairs are paraphrases
        lines = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        for index in range(rows):
            first = " ".join(rng.choice(words, 6))
            same = index % 2 == 0
            second = first if same else " ".join(rng.choice(words, 6))
            lines.append(f'{int(same)}\t{index}\t{index + 1000}\t{first}\t"{second}"')
        (directory / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return [line.split("\t") for line in (directory / "dev.tsv").read_text().splitlines()[1:]]


@pytest.mark.slow
def test_mrpc_from_the_original_tsv_files_reports_accuracy_and_f1(tmp_path, capsys, vocabulary, evaluated, monkeypatch):
    rows = _write_mrpc(tmp_path / "MRPC")
    monkeypatch.chdir(tmp_path)  # the data folder given relative to here, as users type it
    metrics = _train(
        capsys, tmp_path / "run", "glue_mrpc", vocabulary, "task.dataset=glue_tsv/mrpc", "task.data_dir=MRPC"
    )
    _, logits = _dev_predictions(tmp_path / "run", [(row[3], row[4]) for row in rows])
    np.testing.assert_allclose(evaluated[-1], logits, atol=1e-4)
    labels, predicted = [int(row[0]) for row in rows], evaluated[-1].argmax(-1)
    assert metrics["eval_accuracy"] == pytest.approx(sklearn.metrics.accuracy_score(labels, predicted), abs=1e-9)
    assert metrics["eval_f1"] == pytest.approx(sklearn.metrics.f1_score(labels, predicted), abs=1e-9)
    assert metrics["majority_class_accuracy"] == pytest.approx(7 / 13, abs=1e-9)
    # the mean over the 13 dev pairs alone: the 3 empty rows that fill the second batch of 8 count for nothing
    probabilities = scipy.special.softmax(evaluated[-1].astype("float64"), axis=-1)
    assert metrics["eval_loss"] == pytest.approx(
        sklearn.metrics.log_loss(labels, probabilities, labels=[0, 1]), rel=1e-5
    )
    # concise-evaluate from another folder: the recorded relative folder is not found there, --data-dir names it
    monkeypatch.chdir(tmp_path / "run")
    with pytest.raises(SystemExit) as exit_info:
        evaluate_cli.main(["--run", "."])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "'MRPC'" in error and "--data-dir" in error and "Traceback" not in error
    assert evaluate_cli.main(["--run", ".", "--data-dir", "../MRPC"]) == 0
    out = capsys.readouterr().out
    evaluated_again = json.loads(out[out.index("{") :])
    assert (
        evaluated_again["eval_accuracy"] == metrics["eval_accuracy"]
        and evaluated_again["eval_f1"] == metrics["eval_f1"]
    )


@pytest.mark.slow
def test_stsb_regression_reports_pearson_and_spearman(tmp_path, capsys, vocabulary, evaluated):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=20):
        metrics = _train(capsys, tmp_path / "run", "glue_stsb", vocabulary)
        dev = sorted(tfds.as_numpy(tfds.load("glue/stsb", split="validation")), key=lambda example: example["idx"])
    _, scores = _dev_predictions(tmp_path / "run", [(e["sentence1"].decode(), e["sentence2"].decode()) for e in dev])
    labels, recorded = [example["label"] for example in dev], evaluated[-1][:, 0]
    np.testing.assert_allclose(recorded, scores[:, 0], atol=1e-4)
    assert metrics["eval_pearson"] == pytest.approx(scipy.stats.pearsonr(labels, recorded)[0], abs=1e-5)
    assert metrics["eval_spearman"] == pytest.approx(scipy.stats.spearmanr(labels, recorded)[0], abs=1e-5)
    assert len(labels) % 8 and metrics["eval_loss"] == pytest.approx(
        np.mean((np.asarray(labels) - recorded) ** 2), rel=1e-5
    )


def test_a_label_the_task_does_not_know_names_the_file_and_line(tmp_path, capsys, vocabulary):
    _write_mrpc(tmp_path / "MRPC")
    dev = tmp_path / "MRPC" / "dev.tsv"
    dev.write_text(dev.read_text() + "maybe\t1\t2\tone\ttwo\n")
    with pytest.raises(SystemExit) as exit_info:
        _train(
            capsys,
            tmp_path / "run",
            "glue_mrpc",
            vocabulary,
            "task.dataset=glue_tsv/mrpc",
            f"task.data_dir={tmp_path / 'MRPC'}",
        )
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "dev.tsv line 15" in error and "'maybe'" in error and "Traceback" not in error
    assert not (tmp_path / "run").exists()


_SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
served = tf.saved_model.load(sys.argv[1])
pairs = json.loads(sys.argv[2])
outputs = served.signatures["serving_default"](text=tf.constant([a for a, _ in pairs]), text_b=tf.constant([b for _, b in pairs]))
assert "tensorflow_text" not in sys.modules
try:
    served.signatures["serving_default"](text=tf.constant(["a", "b"]), text_b=tf.constant(["c"]))
    mismatch = None
except tf.errors.InvalidArgumentError as error:
    mismatch = error.message
print(json.dumps({"probabilities": outputs["probabilities"].numpy().tolist(), "label": [x.decode() for x in outputs["label"].numpy()],
                  "mismatch": mismatch}))
"""


@pytest.mark.slow
def test_a_fine_tuned_pair_classifier_exports_and_serves_its_probabilities(tmp_path, capsys, vocabulary):
    import subprocess
    import sys

    from concise_attention.export.savedmodels import export_run

    rows = _write_mrpc(tmp_path / "MRPC")
    _train(
        capsys,
        tmp_path / "run",
        "glue_mrpc",
        vocabulary,
        "task.dataset=glue_tsv/mrpc",
        f"task.data_dir={tmp_path / 'MRPC'}",
    )
    written = export_run(tmp_path / "run", tmp_path / "out")
    for marker in (
        pathlib.Path(written["serving"]) / "assets.extra" / "export.json",
        pathlib.Path(written["encoder"]).parent / "export.json",
    ):
        assert str(tmp_path) not in marker.read_text(), marker  # task.data_dir by its name only
    pairs = [(row[3], row[4].strip('"')) for row in rows[:6]]
    result = subprocess.run(
        [sys.executable, "-c", _SERVE, written["serving"], json.dumps(pairs)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    config, logits = _dev_predictions(tmp_path / "run", pairs)
    live = np.exp(logits - logits.max(-1, keepdims=True))
    live /= live.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.array(served["probabilities"]), live, atol=1e-5)
    # the label is the served probabilities' own argmax (the live model's could differ on a near tie)
    assert served["label"] == [config.task.labels[i] for i in np.array(served["probabilities"]).argmax(-1)]
    assert "text and text_b must hold as many strings" in served["mismatch"]  # one clear line, not a graph error
    # --xla compiles an encoder's serving model only: refused for this task model before anything is written
    with pytest.raises(SystemExit) as exit_info:
        export_cli.main(["--run", str(tmp_path / "run"), "--out", str(tmp_path / "xla"), "--xla"])
    error = capsys.readouterr().err
    assert (
        exit_info.value.code == 2
        and "The XLA export (xla=True, --xla) compiles an encoder's serving model" in error
        and "Traceback" not in error
    )
    assert not (tmp_path / "xla").exists()


@pytest.mark.parametrize(
    "preset, texts", [("glue_mrpc", ("text", "text_b")), ("glue_sst2", ("text",)), ("glue_stsb", ("text", "text_b"))]
)
def test_each_sentence_task_says_what_its_serving_model_serves(preset, texts):
    """`Task.serving_signature` (what the exporter serves) against numpy on the live model's logits."""
    from concise_attention.training.run import configs
    from concise_attention.training.tasks import make_task

    regression = preset == "glue_stsb"
    labels = [] if regression else ["task.labels=[neg, pos, odd]"]
    config = configs.load_config(preset, [*TINY_BERT, f"task.text_pairs={len(texts) == 2}", *labels])
    task = make_task(config)
    model = task.build_model(config.build_model())
    rng = np.random.default_rng(0)
    inputs = {
        "input_word_ids": rng.integers(1, 1000, (4, 8)).astype("int32"),
        "input_mask": np.ones((4, 8), "int32"),
        "input_type_ids": np.zeros((4, 8), "int32"),
    }
    signature = task.serving_signature(model)
    outputs = {name: np.asarray(value) for name, value in signature.outputs(inputs).items()}
    logits = np.asarray(model(inputs, training=False)["logits"], "float64")
    assert signature.texts == texts
    if regression:
        assert set(outputs) == {"score"}
        np.testing.assert_allclose(outputs["score"], logits[:, 0], rtol=1e-6)
    else:
        expected = np.exp(logits - logits.max(-1, keepdims=True))
        expected /= expected.sum(-1, keepdims=True)
        assert set(outputs) == {"probabilities", "label"}
        np.testing.assert_allclose(outputs["probabilities"], expected, rtol=1e-5, atol=1e-7)
        assert [label.decode() for label in outputs["label"]] == [
            ["neg", "pos", "odd"][i] for i in outputs["probabilities"].argmax(-1)
        ]


def test_a_task_without_a_serving_model_of_its_own_serves_the_encoder():
    from concise_attention.training.run import configs
    from concise_attention.training.tasks import make_task

    config = configs.load_config("tiny_bert_fixed")
    assert make_task(config).serving_signature(config.build_model()) is None


@pytest.mark.parametrize(
    "labels, message",
    [
        ("[neg, pos, pos]", "at least 2 distinct labels"),
        ("[pos]", "at least 2 distinct labels"),
        ("[true, false]", "strings or integers"),
        ("pos", "task.labels"),
    ],
)
def test_task_labels_are_at_least_two_distinct_names(labels, message):
    from concise_attention.training.run import configs

    # as the TSV files hold them
    assert configs.load_config("glue_base", ["task.labels=[0, 1]"]).task.labels == ["0", "1"]
    with pytest.raises(ValueError, match=message):
        configs.load_config("glue_base", [f"task.labels={labels}"])


@pytest.mark.slow
def test_a_head_on_the_shipped_sentence_encoder_reads_its_mean_and_exports_it_as_the_pooled_output(tmp_path, capsys):
    """task.init a sentence encoder: the head reads its mean token vector (its [CLS] pooler was never trained), the run
    records it, and the fine-tuned TF-Hub encoder's pooled_output is that vector (what a tf_keras head would read)."""
    import tensorflow as tf

    from concise_attention.export.savedmodels import export_run

    argv = [
        "--config",
        "wordnet_topics",
        "--run-dir",
        str(tmp_path / "run"),
        "--quiet",
        "--set",
        "task.init=concise-minilm-d192",
        *(item for override in SHORT for item in ("--set", override)),
    ]
    assert cli.main(argv) == 0
    loaded = runs.load(tmp_path / "run")
    config, model, backbone = loaded.config, loaded.task_model, loaded.backbone
    assert config.task.pooling == "mean" and model.pooling == "mean"
    written = export_run(tmp_path / "run", tmp_path / "out")
    assert json.loads((tmp_path / "out" / "hub" / "1" / "export.json").read_text())["pooling"] == "mean"
    ids = np.array([[101, 2023, 2003, 1037, 3231, 102, 0, 0]], "int32")
    inputs = {"input_word_ids": ids, "input_mask": (ids > 0).astype("int32"), "input_type_ids": np.zeros_like(ids)}
    hub = tf.saved_model.load(written["encoder"])(inputs, training=False)
    mean = np.asarray(backbone(inputs)["sequence_output"])[0, :6].mean(0)  # numpy: over the real tokens
    np.testing.assert_allclose(np.asarray(hub["pooled_output"])[0], mean, rtol=1e-4, atol=1e-5)
    from concise_attention.training.trainers.trainer import resolve_config
    from concise_attention.training.run import configs

    for chosen, resolved in ((None, "mean"), ("cls", "cls")):  # task.pooling chosen stays as chosen
        overrides = ["task.init=concise-minilm-d192"] + ([f"task.pooling={chosen}"] if chosen else [])
        assert resolve_config(configs.load_config("wordnet_topics", overrides))[0].task.pooling == resolved


def test_evaluate_data_dir_is_checked_against_the_run_before_its_weights_load(tmp_path, capsys, monkeypatch):
    """--data-dir gives as many folders as the run recorded (a list of one too), only to a run that read folders; a
    recorded relative folder missing from here is named. Each is refused before the (absent) weights are read."""
    from concise_attention.training.run import configs

    def refused(config, *flags):
        run = tmp_path / "run"
        run.mkdir(exist_ok=True)
        (run / "config.json").write_text(json.dumps(config.to_dict()))
        with pytest.raises(SystemExit) as exit_info:
            evaluate_cli.main(["--run", str(run), *flags])
        error = capsys.readouterr().err
        assert exit_info.value.code == 2 and "Traceback" not in error
        return error

    monkeypatch.chdir(tmp_path)
    (tmp_path / "here").mkdir()
    two = configs.load_config("distill_minilm_d192_fixed")  # task.data_dir: [corpus, general]
    assert "give as many folders" in refused(two, "--data-dir", "here")
    assert "'corpus' under" in refused(two) and "--data-dir" in refused(two)
    assert "model.weights.h5" in refused(two, "--data-dir", "here", "here")  # accepted: on to the weights
    one = configs.load_config("distill_minilm_d192_fixed", ["task.data_dir=[corpus]"])
    assert "model.weights.h5" in refused(one, "--data-dir", "here")
    assert "reads no data folder" in refused(configs.load_config("tiny_bert_standard"), "--data-dir", "here")
