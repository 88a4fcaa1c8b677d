"""Bad input on every CLI: one line naming the field or file and the value, exit code 2, no
traceback, nothing written (in-process `main(argv)`, not subprocesses)."""

import json

import pytest

from concise_attention.cli import collaborative as collaborative_cli
from concise_attention.cli import export as export_cli
from concise_attention.cli import train as train_cli
from concise_attention.training import files
from concise_attention.training.data.packing import SAMPLE_CORPUS
from concise_attention.training.run import configs


def _fails(capsys, main, argv, *expected):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    error = capsys.readouterr().err
    assert exit_info.value.code == 2, error
    assert "Traceback" not in error and error.strip().count("\n") <= 1, error
    for text in expected:
        assert text in error, error
    return error


def test_unknown_preset(capsys):
    _fails(capsys, configs.main, ["nope"], "'nope'", "Presets:")


@pytest.mark.parametrize(
    "override, expected",
    [
        ("training.learning_rate=-1", "training.learning_rate=-1"),
        ("training.warmup_steps=-5", "training.warmup_steps=-5"),
        ("training.batch_size=0", "training.batch_size=0"),
        ("training.keep_checkpoints=0", "training.keep_checkpoints=0"),
        ("task.mask_rate=1.5", "task.mask_rate=1.5"),
        ("training.learning_rate=.nan", "training.learning_rate=nan"),
        ("training.learning_rate=.inf", "training.learning_rate=inf"),
        ("training.weight_decay=.nan", "training.weight_decay=nan"),
        ("training.label_smoothing=2", "training.label_smoothing=2.0"),
        ("training.adam_epsilon=.inf", "training.adam_epsilon=inf"),
        ("training.clip_norm=0", "training.clip_norm=0"),
        ("training.clip_norm=.nan", "training.clip_norm=nan"),
    ],
)
def test_values_that_must_be_refused(tmp_path, capsys, override, expected):
    _fails(
        capsys,
        train_cli.main,
        ["--config", "tiny_bert_fixed", "--run-dir", str(tmp_path / "run"), "--set", override],
        expected,
    )
    assert not (tmp_path / "run").exists()


def test_run_dir_that_is_a_file(tmp_path, capsys):
    (tmp_path / "file").write_text("mine")
    _fails(
        capsys,
        train_cli.main,
        ["--config", "tiny_lm", "--run-dir", str(tmp_path / "file")],
        str(tmp_path / "file"),
        "existing file",
    )
    assert (tmp_path / "file").read_text() == "mine"


def test_truncated_config_of_a_run_names_the_file(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"model_type": "bert", "mod')
    error = _fails(
        capsys, export_cli.main, ["--run", str(run), "--out", str(tmp_path / "out")], str(run / "config.json")
    )
    assert "not valid JSON" in error and not (tmp_path / "out").exists()


def test_truncated_weights_of_a_run_name_the_file(tmp_path, capsys):
    from concise_attention.models.bert import BertPretrainer
    from concise_attention.training.run import runs

    config = configs.load_config("tiny_bert_fixed")
    model = BertPretrainer(config.build_model())
    run = runs.RunDirectory(tmp_path / "run")
    run.start(config.to_dict())
    run.write_vocabulary(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"])
    run.save_models(model.encoder, model)
    weights = tmp_path / "run" / "model.weights.h5"
    weights.write_bytes(weights.read_bytes()[:2000])
    _fails(capsys, export_cli.main, ["--run", str(tmp_path / "run"), "--out", str(tmp_path / "out")], str(weights))
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_conversion_with_zero_iterations(tmp_path, capsys, minilm_dir):
    _fails(
        capsys,
        collaborative_cli.main,
        ["--hf-dir", str(minilm_dir), "--ratio", "0.5", "--out", str(tmp_path / "out"), "--iterations", "0"],
        "--iterations=0",
    )
    assert not (tmp_path / "out").exists()


def _corpus(directory, **files):
    directory.mkdir()
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


def _text_files(corpus):
    return ["--set", "task.dataset=text_files", "--set", f"task.data_dir={corpus}"]


@pytest.mark.parametrize("config", ["tiny_lm", "tiny_bert_fixed"])
def test_invalid_utf8_deep_in_a_corpus_names_the_file_and_line(tmp_path, capsys, config):
    """Checked before anything is trained or written (it crashed at step ~100, and at every restart)."""
    lines = SAMPLE_CORPUS.read_bytes().splitlines(keepends=True)
    bad = b"".join(lines[:700]) + "café in Latin-1\n".encode("latin-1") + b"".join(lines[700:])
    corpus = _corpus(tmp_path / "corpus", **{"a.txt": SAMPLE_CORPUS.read_bytes(), "b.txt": bad})

    def decodes(line):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    line = next(number for number, text in enumerate(bad.split(b"\n"), start=1) if not decodes(text))
    assert line == 701
    _fails(
        capsys,
        train_cli.main,
        ["--config", config, "--run-dir", str(tmp_path / "run"), *_text_files(corpus)],
        f"{corpus / 'b.txt'}, line {line}: not valid UTF-8",
    )
    assert not (tmp_path / "run").exists()


def test_one_line_corpus_names_its_empty_training_split(tmp_path, capsys):
    corpus = _corpus(tmp_path / "corpus", **{"one.txt": b"A single line of text.\n\n"})
    _fails(
        capsys,
        train_cli.main,
        ["--config", "tiny_lm", "--run-dir", str(tmp_path / "run"), *_text_files(corpus)],
        f"training split of task.data_dir={str(corpus)!r} is empty",
        "1 non-empty line",
        "held out for evaluation",
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_corpus_under_one_batch_is_named(tmp_path, capsys):
    """Five lines: the held-out line packs into one row, under a batch of 8: the run stops
    before training, its weights never written."""
    corpus = _corpus(
        tmp_path / "corpus", **{"five.txt": b"".join(SAMPLE_CORPUS.read_bytes().splitlines(keepends=True)[:5])}
    )
    _fails(
        capsys,
        train_cli.main,
        [
            "--config",
            "tiny_lm",
            "--run-dir",
            str(tmp_path / "run"),
            *_text_files(corpus),
            "--set",
            "model.vocab_size=200",
        ],
        "evaluation split holds less than one batch of 8 rows of 64 tokens",
        "training.batch_size",
    )
    assert not (tmp_path / "run" / "checkpoint").exists() and not (tmp_path / "run" / "model.weights.h5").exists()


@pytest.mark.parametrize("name", ['x"; rm -rf /', "../up", "a" * 65, "with space", ".hidden", ""])
def test_unsafe_model_names_are_refused_before_anything_is_written(tmp_path, capsys, minilm_dir, name):
    """The name goes into models.config and paths: letters, digits and _.- only, at most 64."""
    _fails(
        capsys,
        export_cli.main,
        ["--hf-dir", str(minilm_dir), "--out", str(tmp_path / "out"), "--model-name", name],
        "model_name",
    )
    assert not (tmp_path / "out").exists()


def test_a_changed_vocabulary_is_refused_on_resume(tmp_path, capsys):
    """inputs.json keeps the sha256 of the run's vocabulary: a truncated vocab.txt (reused as the
    trained vocabulary's cache) stops the resumed run with one line naming it, not silently."""
    argv = [
        "--config",
        "tiny_lm",
        "--run-dir",
        str(tmp_path / "run"),
        "--quiet",
        "--set",
        "training.train_steps=2",
        "--set",
        "training.steps_per_epoch=1",
        "--set",
        "training.eval_batches=1",
        "--set",
        "training.steps_per_execution=1",
    ]
    assert train_cli.main(argv) == 0
    capsys.readouterr()
    vocabulary = tmp_path / "run" / "vocab.txt"
    recorded, original = (tmp_path / "run" / "inputs.json").read_text(), vocabulary.read_text()
    # another vocabulary named on the command line: refused before the copy is replaced
    other = tmp_path / "other-vocab.txt"
    other.write_text(original.replace("\n", "\nzzz-extra\n", 1))
    _fails(
        capsys,
        train_cli.main,
        [*argv, "--set", f"tokenizer.vocabulary={other}"],
        str(other),
        "differs from the vocabulary",
    )
    assert vocabulary.read_text() == original
    vocabulary.write_text(original[:-40])
    config = (tmp_path / "run" / "config.json").read_text()
    _fails(
        capsys,
        train_cli.main,
        [*argv, "--set", "training.train_steps=3"],
        str(vocabulary),
        "differs from the vocabulary",
    )
    assert (tmp_path / "run" / "inputs.json").read_text() == recorded
    assert (tmp_path / "run" / "config.json").read_text() == config  # the refused resume rewrote nothing


def test_a_second_trainer_on_a_run_directory_is_refused(tmp_path, capsys):
    """Another process (here: another open file, as flock sees one) holding the run's lock stops the
    trainer before it writes anything; once released, the same command trains."""
    import fcntl

    run = tmp_path / "run"
    run.mkdir()
    argv = [
        "--config",
        "tiny_lm",
        "--run-dir",
        str(run),
        "--quiet",
        "--set",
        "training.train_steps=1",
        "--set",
        "training.steps_per_epoch=1",
        "--set",
        "training.eval_batches=1",
        "--set",
        "training.steps_per_execution=1",
    ]
    with open(run / ".lock", "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _fails(capsys, train_cli.main, argv, "Another trainer is running on", str(run))
        assert sorted(path.name for path in run.iterdir()) == [".lock"]
    assert train_cli.main(argv) == 0
    assert train_cli.main(argv) == 0  # the first run released its lock: a resume of the same process works


def test_a_refused_trainer_leaves_the_winners_run_as_it_is(tmp_path, capsys, monkeypatch):
    """The winner (another process: here another open file, as flock sees one) holds the lock and writes its
    files while the second trainer starts: the refused one removes none of them, not even what the winner
    writes during the refused command (its lock comes before any look at the directory)."""
    import fcntl

    from concise_attention.training.trainers import trainer

    run = tmp_path / "run"
    run.mkdir()
    written = ["config.json", "vocab.txt"]
    real_resolve = trainer.resolve_config

    def winner_writes_on(config):  # the first step of the refused command: the winner writes meanwhile
        written.append("inputs.json")
        (run / "inputs.json").write_text("{}")
        return real_resolve(config)

    monkeypatch.setattr(trainer, "resolve_config", winner_writes_on)
    argv = ["--config", "tiny_lm", "--run-dir", str(run), "--quiet", "--set", "training.train_steps=1"]
    with open(run / ".lock", "a") as winner:
        fcntl.flock(winner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for name in written:
            (run / name).write_text("the winner's")
        for _ in range(2):
            _fails(capsys, train_cli.main, argv, "Another trainer is running on", str(run))
        assert sorted(path.name for path in run.iterdir()) == sorted([".lock", *written])


@pytest.mark.parametrize("under", ["run", "run/deeper"])
def test_a_run_directory_under_a_file_is_one_line(tmp_path, capsys, under):
    (tmp_path / "file").write_text("a file")
    run = tmp_path / "file" / under
    _fails(
        capsys,
        train_cli.main,
        ["--config", "tiny_lm", "--run-dir", str(run), "--set", "training.train_steps=1"],
        str(tmp_path / "file"),
        "an existing file",
    )
    assert (tmp_path / "file").read_text() == "a file"


def test_a_bad_yaml_value_in_set_is_one_line(tmp_path, capsys):
    _fails(
        capsys,
        train_cli.main,
        ["--config", "tiny_lm", "--run-dir", str(tmp_path / "run"), "--set", "training.seed=[unclosed"],
        "--set 'training.seed=[unclosed'",
        "not valid YAML",
    )
    assert not (tmp_path / "run").exists()


def test_environment_failures_are_one_line_with_exit_code_3(tmp_path, capsys, monkeypatch):
    """A full disk (or a read-only folder: root ignores permissions, so the failure is injected) gives
    exit code 3, one line naming the file, no traceback, and no temporary file left behind."""
    import errno

    from concise_attention.training.run import configs
    import tensorflow as tf

    from concise_attention.training.run import runs

    class FullDisk(tf.io.gfile.GFile):
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device", self.name)

    with monkeypatch.context() as patched:
        patched.setattr(tf.io.gfile, "GFile", FullDisk)
        with pytest.raises(OSError):
            files.write_bytes_atomically(tmp_path / "kept" / "file.json", "{}")
    assert list((tmp_path / "kept").iterdir()) == []  # the temporary file is removed

    def full(self, config):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "config.json"))

    monkeypatch.setattr(runs.RunDirectory, "record_config", full)
    with pytest.raises(SystemExit) as exit_info:
        train_cli.main(["--config", "tiny_lm", "--run-dir", str(tmp_path / "run")])
    error = capsys.readouterr().err
    assert exit_info.value.code == configs.ENVIRONMENT_EXIT_CODE, error
    assert error == f"concise-train: error: {tmp_path / 'run' / 'config.json'}: No space left on device\n"


@pytest.mark.parametrize(
    "output, expected", [("{dir}", "is a directory"), ("{dir}/missing/metrics.json", "does not exist")]
)
def test_evaluate_output_that_is_a_directory_or_in_a_missing_folder(tmp_path, capsys, output, expected):
    from concise_attention.cli import evaluate as evaluate_cli

    output = output.format(dir=tmp_path)
    _fails(capsys, evaluate_cli.main, ["--run", str(tmp_path / "no-run"), "--output", output], "--output", expected)
    assert not (tmp_path / "missing").exists()


def test_quickstart_out_that_is_a_file(tmp_path, capsys):
    from concise_attention.cli import quickstart

    (tmp_path / "taken").write_text("mine")
    _fails(capsys, quickstart.main, ["--out", str(tmp_path / "taken")], "--out", "is a file")
    assert (tmp_path / "taken").read_text() == "mine"


def test_a_model_error_leaves_nothing_written_and_the_corrected_command_trains(tmp_path, capsys):
    """A model the builder refuses (5 standard heads in a 32-wide model; a dropout of 1.5) is refused with
    one line naming the argument, and the run directory is as before the command: absent when it was, or
    holding only what it held. The corrected command trains; a run that has trained still refuses another
    model and keeps its files."""
    run = tmp_path / "run"
    argv = [
        "--config",
        "tiny_lm",
        "--run-dir",
        str(run),
        "--quiet",
        "--set",
        "training.train_steps=1",
        "--set",
        "training.steps_per_epoch=1",
        "--set",
        "training.eval_batches=1",
        "--set",
        "training.steps_per_execution=1",
    ]
    standard = ["--set", "model.attention={type: standard}"]
    _fails(capsys, train_cli.main, [*argv, *standard, "--set", "model.num_heads=5"], "num_heads=5")
    assert not run.exists()
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    _fails(
        capsys,
        train_cli.main,
        [*argv, "--set", "model.dropout=1.5"],
        "`model.dropout` must be in [0, 1). Received: model.dropout=1.5",
    )
    assert sorted(path.name for path in run.iterdir()) == ["notes.txt"]
    assert train_cli.main([*argv, *standard, "--set", "model.num_heads=4"]) == 0
    capsys.readouterr()
    trained = sorted(path.name for path in run.iterdir())
    _fails(
        capsys,
        train_cli.main,
        [*argv, *standard, "--set", "model.num_heads=8"],
        "holds a run with a different `model` (model.num_heads: 4 -> 8)",
    )
    assert sorted(path.name for path in run.iterdir()) == trained


def test_a_run_saved_before_a_setting_existed_resumes_and_a_changed_one_is_refused(tmp_path):
    """A trained run whose config.json lacks a field added since (task.length_bucket of distill) starts again
    under today's config with that field at its default; the field set otherwise is another task: refused."""
    from concise_attention.training.run import runs

    config = configs.load_config("distill_minilm_d192_fixed", ["task.length_bucket=0"])
    saved = config.to_dict() | {"name": config.name}
    del saved["task"]["length_bucket"]
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(saved))
    (run / files.BACKBONE_WEIGHTS).write_bytes(b"trained")  # has_progress: a config change would be refused
    runs.RunDirectory(run).start(config.to_dict() | {"name": config.name})
    assert json.loads((run / "config.json").read_text())["task"]["length_bucket"] == 0
    changed = configs.load_config("distill_minilm_d192_fixed", ["task.length_bucket=8"])
    with pytest.raises(ValueError, match=r"holds a run with a different `task` \(task.length_bucket: 0 -> 8\)"):
        runs.RunDirectory(run).start(changed.to_dict() | {"name": changed.name})


@pytest.mark.parametrize(
    "setting",
    [
        "model.layer_norm_epsilon=.nan",
        "model.layer_norm_epsilon=-1",
        "model.dropout=1.5",
        "training.learning_rate=.inf",
        "model.vocab_size=100000000000",
    ],
)
def test_a_value_outside_its_domain_is_one_line_before_anything_is_written(tmp_path, capsys, setting):
    name = setting.split("=")[0]
    _fails(
        capsys,
        train_cli.main,
        ["--config", "tiny_lm", "--run-dir", str(tmp_path / "run"), "--set", setting],
        f"`{name}`",
    )
    assert not (tmp_path / "run").exists()


def test_a_diverging_run_stops_with_one_line(tmp_path, capsys):
    """A learning rate that drives the loss to inf or NaN stops the run before it saves weights or metrics."""
    run = tmp_path / "run"
    error = _fails(
        capsys,
        train_cli.main,
        [
            "--config",
            "tiny_lm",
            "--run-dir",
            str(run),
            "--quiet",
            "--set",
            "training.learning_rate=1e30",
            "--set",
            "training.train_steps=4",
            "--set",
            "training.steps_per_epoch=2",
            "--set",
            "training.eval_batches=1",
            "--set",
            "training.steps_per_execution=1",
            "--set",
            "training.warmup_steps=0",
        ],
        "Training diverged",
    )
    assert "step" in error
    assert not (run / "metrics.json").exists() and not (run / "backbone.weights.h5").exists()


def test_a_yaml_syntax_error_is_one_line_with_its_place(tmp_path, capsys):
    config = tmp_path / "mine.yaml"
    config.write_text("base: tiny_lm\ntraining:\n  seed: [1, 2\n  batch_size: 4\n")
    error = _fails(
        capsys,
        train_cli.main,
        ["--config", str(config), "--run-dir", str(tmp_path / "run")],
        str(config),
        "not valid YAML",
        "line ",
    )
    assert not (tmp_path / "run").exists(), error


def test_a_users_yaml_elsewhere_can_start_from_a_shipped_preset(tmp_path):
    """`base:` names a file beside the YAML, else a preset shipped in configs/."""
    config = tmp_path / "mine.yaml"
    config.write_text("base: tiny_lm\ntraining:\n  seed: 7\n")
    loaded = configs.load_config(str(config))
    assert loaded.training.seed == 7 and loaded.model == configs.load_config("tiny_lm").model
    import yaml

    sibling = yaml.safe_load((configs.PRESET_DIRECTORY / "tiny_lm.yaml").read_text())
    sibling["training"]["seed"] = 3
    (tmp_path / "tiny_lm.yaml").write_text(yaml.safe_dump(sibling))  # a sibling of that name wins
    (tmp_path / "other.yaml").write_text("base: tiny_lm\n")
    assert configs.load_config(str(tmp_path / "other.yaml")).training.seed == 3


def test_a_cache_dir_under_a_file_is_one_line_before_the_teacher_runs(tmp_path, capsys):
    (tmp_path / "file").write_text("a file")
    run = tmp_path / "run"
    _fails(
        capsys,
        train_cli.main,
        [
            "--config",
            "distill_minilm_d192_fixed",
            "--run-dir",
            str(run),
            "--set",
            "task.dataset=sample",
            "--set",
            f"task.cache_dir={tmp_path / 'file' / 'cache'}",
        ],
        "task.cache_dir",
        "an existing file",
    )
    assert not run.exists()
