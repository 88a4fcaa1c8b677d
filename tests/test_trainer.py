"""The LM trainer: tfds LM1B, MirroredStrategy, multi-worker, TPU errors, kill-and-resume, bad inputs."""

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

from concise_attention.training.trainers.trainer import train
from concise_attention.training.run import configs
from concise_attention.training.run import runs
from concise_attention.training.run.strategy import choose_strategy
from concise_attention.training.tasks.objectives import WarmupDecaySchedule, make_optimizer
from tensorboard_logs import logged

TINY = ["model.dropout=0", "model.attention_dropout=0"]


def _weights(path):
    """Every model variable of a weights file (optimizer state aside), by name."""
    arrays = {}
    with h5py.File(path, "r") as f:
        f["layers"].visititems(
            lambda name, item: arrays.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None
        )
    assert arrays
    return arrays


def _cli(run_dir, *overrides, env=None, config="tiny_lm"):
    command = [
        sys.executable,
        "-m",
        "concise_attention.cli.train",
        "--config",
        config,
        "--run-dir",
        str(run_dir),
        "--quiet",
    ]
    for override in (*TINY, *overrides):
        command += ["--set", override]
    return command


def test_schedule_linear_decay_reaches_zero_at_the_last_step():
    schedule = WarmupDecaySchedule(1e-4, warmup_steps=10, decay="linear", total_steps=110)
    rates = [float(schedule(step)) for step in (0, 9, 59, 108, 109, 200)]
    np.testing.assert_allclose(rates, [1e-5, 1e-4, 5e-5, 1e-6, 0.0, 0.0], rtol=1e-5, atol=1e-12)
    with pytest.raises(ValueError, match="total_steps > warmup_steps"):
        WarmupDecaySchedule(1e-4, warmup_steps=10, decay="linear", total_steps=10)


def test_schedule_is_linear_warmup_then_rsqrt():
    schedule = WarmupDecaySchedule(1e-3, warmup_steps=100)
    rates = [float(schedule(step)) for step in (0, 49, 99, 399, 9999)]
    np.testing.assert_allclose(rates, [1e-5, 5e-4, 1e-3, 5e-4, 1e-4], rtol=1e-5)


def _adam_first_step(weights, gradient, learning_rate=0.1, beta_2=0.98, epsilon=1.0):
    """numpy: the weights after one step of Keras' Adam from zero moments (no weight decay)."""
    alpha = learning_rate * np.sqrt(1 - beta_2) / (1 - 0.9)
    return weights - alpha * (0.1 * gradient) / (np.sqrt((1 - beta_2) * gradient**2) + epsilon)


CLIPPED = configs.TrainingConfig(
    learning_rate=0.1, warmup_steps=0, decay="constant", weight_decay=0.0, adam_epsilon=1.0, clip_norm=1.0
)


def _apply(optimizer, gradients, values):
    variables = [keras.Variable(np.array(value, "float32")) for value in values]
    optimizer.build(variables)
    optimizer.apply(gradients, variables)
    return [variable.numpy() for variable in variables]


def _keras_adamw():
    """Keras' AdamW with CLIPPED's settings, unclipped."""
    return keras.optimizers.AdamW(0.1, weight_decay=0.0, beta_2=0.98, epsilon=1.0)


def _duplicate_row(value):
    """An embedding's gradient as Keras gives it (tf.IndexedSlices) naming row 1 of a 3 x 2 table twice."""
    return tf.IndexedSlices(tf.constant([[value, 0.0], [value, 0.0]]), tf.constant([1, 1]), tf.constant([3, 2]))


def test_clip_norm_scales_the_whole_gradient_to_that_global_norm():
    """training.clip_norm: the gradient of all variables together is scaled to norm 1 (numpy Adam on the
    clipped dense gradient), an embedding row named twice counted once with its summed gradient ([2, 0]: the
    norm is sqrt(3^2 + 4^2 + 2^2)); the embedding's gradient is scaled as it is, sparse; under the norm, the
    step is Keras' AdamW's without clipping, bit for bit."""
    start = [np.ones(2), np.zeros((3, 2))]
    dense, table = _apply(make_optimizer(CLIPPED), [tf.constant([3.0, 4.0]), _duplicate_row(1.0)], start)
    scale = 1.0 / np.sqrt(3.0**2 + 4.0**2 + 2.0**2)
    np.testing.assert_allclose(dense, _adam_first_step(np.ones(2), scale * np.array([3.0, 4.0])), rtol=1e-6)
    np.testing.assert_allclose(table, _apply(_keras_adamw(), [_duplicate_row(scale)], start[1:])[0], rtol=1e-6)

    small = [tf.constant([0.3, 0.4]), _duplicate_row(0.1)]
    for got, expected in zip(_apply(make_optimizer(CLIPPED), small, start), _apply(_keras_adamw(), small, start)):
        np.testing.assert_array_equal(got, expected)


def test_clip_norm_clips_the_sum_of_the_replicas_gradients(tmp_path):
    """Two replicas under MirroredStrategy: clipped is their summed gradient ([3, 0] + [-2.5, 0] is under the
    norm and stays [0.5, 0]; [3, 0] + [3, 0] becomes [1, 0]), not each replica's as Keras' global_clipnorm
    does (which would give [0, 0] and [2, 0])."""
    script = textwrap.dedent(
        f"""
        import keras
        import numpy as np
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        from concise_attention.training.run import configs
        from concise_attention.training.tasks.objectives import make_optimizer
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        for second in (-2.5, 3.0):
            with strategy.scope():
                weights = keras.Variable([1.0, 1.0])
                optimizer = make_optimizer(configs.TrainingConfig(**{CLIPPED.__dict__!r}))
                optimizer.build([weights])
            gradients = strategy.experimental_distribute_values_from_function(
                lambda context: tf.constant([(3.0, second)[context.replica_id_in_sync_group], 0.0]))
            strategy.run(tf.function(lambda gradient: optimizer.apply([gradient], [weights])), args=(gradients,))
            print(second, repr(weights.numpy().tolist()))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    printed = dict(line.split(" ", 1) for line in result.stdout.splitlines()[-2:])
    for second, summed in (("-2.5", 0.5), ("3.0", 1.0)):
        expected = _adam_first_step(np.ones(2), np.array([summed, 0.0]))
        np.testing.assert_allclose(json.loads(printed[second]), expected, rtol=1e-6)


def test_clip_norm_clips_under_jax_without_tensorflow():
    """The JAX backend (the shard trainer's) clips the same gradient, with TensorFlow never imported."""
    script = textwrap.dedent(
        f"""
        import json, sys
        import keras
        import numpy as np
        from concise_attention.training.run import configs
        from concise_attention.training.tasks.objectives import make_optimizer
        weights = keras.Variable([1.0, 1.0])
        optimizer = make_optimizer(configs.TrainingConfig(**{CLIPPED.__dict__!r}))
        optimizer.build([weights])
        optimizer.apply([np.array([3.0, 4.0], "float32")], [weights])
        print(json.dumps([np.asarray(weights.value).tolist(), "tensorflow" in sys.modules]))
        """
    )
    environment = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=environment
    )
    assert result.returncode == 0, result.stderr[-4000:]
    weights, tensorflow_imported = json.loads(result.stdout.splitlines()[-1])
    np.testing.assert_allclose(weights, _adam_first_step(np.ones(2), np.array([0.6, 0.8])), rtol=1e-6)
    assert not tensorflow_imported


def test_one_step_on_mock_lm1b_with_one_trace_of_the_train_step(tmp_path, monkeypatch):
    """One step on tfds' mock LM1B, its train step traced once: without a tf.distribute strategy Keras 3 builds the
    optimizer inside the first trace, and a tf.function that creates variables is traced twice (seconds of Python
    per trace), so the trainer builds it first."""
    import tensorflow_datasets as tfds
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    traces, original = [], TensorFlowTrainer.train_step
    monkeypatch.setattr(TensorFlowTrainer, "train_step", lambda self, data: traces.append(1) or original(self, data))
    config = configs.load_config(
        "tiny_lm",
        [
            *TINY,
            "task.dataset=lm1b",
            "training.train_steps=1",
            "training.steps_per_epoch=1",
            "training.eval_batches=1",
            "training.steps_per_execution=1",
            "training.sequence_length=16",
            "training.batch_size=2",
        ],
    )
    with tfds.testing.mock_data(num_examples=64):
        metrics = train(config, tmp_path / "run", verbose=0)
    assert metrics["step"] == 1 and np.isfinite(metrics["eval_loss"])
    assert (tmp_path / "run" / "model.weights.h5").is_file() and (tmp_path / "run" / "vocab.txt").is_file()
    assert len(traces) == 1


def _main(command):
    """`concise-train` in this process (the process boundary is tested in test_reproducibility): its JSON."""
    from in_process import run_main

    from concise_attention.cli import train as train_cli

    out = run_main(train_cli.main, command[3:], check=True).stdout
    return json.loads(out[out.index("{") :])


def test_training_lowers_the_loss_and_logs(tmp_path):
    metrics = _main(_cli(tmp_path / "run", "training.train_steps=60"))
    assert metrics["step"] == 60 and metrics["eval_subword_perplexity"] < 600
    assert metrics["eval_word_perplexity"] == pytest.approx(
        np.exp(metrics["eval_loss"] * metrics["tokens_per_word"]), rel=1e-4
    )
    assert list((tmp_path / "run" / "logs" / "validation").glob("events.out.tfevents.*"))
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["model"]["hidden_size"] == 32 and saved["training"]["train_steps"] == 60
    # The final weights files hold the model's variables alone, not Adam's two moments beside each (h5py's count).
    model = runs.load(tmp_path / "run").task_model
    with h5py.File(tmp_path / "run" / "model.weights.h5", "r") as file:
        assert "optimizer" not in file
        stored = []
        file.visititems(lambda name, item: stored.append(item.size) if isinstance(item, h5py.Dataset) else None)
    assert sum(stored) == model.count_params() > 0


def test_every_evaluation_reads_the_eval_batches_once_with_several_steps_per_execution(tmp_path):
    """2 held-out batches, 5 steps per execution: each epoch's validation loss is that of the 2 batches (the
    final evaluation's, by Keras' own evaluate, at the last epoch), not of 5 batches cycling over them."""
    metrics = _main(
        _cli(
            tmp_path / "run",
            "training.train_steps=10",
            "training.steps_per_epoch=5",
            "training.steps_per_execution=5",
            "training.eval_batches=2",
        )
    )
    losses = dict(logged(tmp_path / "run" / "logs" / "validation", "epoch_loss"))
    assert sorted(losses) == [0, 1]
    assert losses[1] == pytest.approx(metrics["eval_loss"], rel=1e-6)


def test_two_steps_under_mirrored_strategy_on_two_cpus(tmp_path):
    """Two replicas: the LM trains with steps_per_execution=2 in its config (Keras 3 fails with several steps
    per execution under MirroredStrategy, keras-team/keras#19246: the trainer runs them one by one, saying
    so); the distill task's similarity-matrix loss compares each replica's rows with the global batch:
    its mean over the replicas and its gradients equal the single-device loss of the whole batch (numpy)."""
    script = textwrap.dedent(
        f"""
        import sys
        import warnings
        import numpy as np
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        from concise_attention.training.trainers.trainer import train
        from concise_attention.training.run import configs
        from concise_attention.training.run.strategy import choose_strategy
        from concise_attention.training.tasks.distill import SimilarityMatrixLoss
        strategy = choose_strategy("mirrored")
        assert strategy.num_replicas_in_sync == 2
        config = configs.load_config("tiny_lm", {TINY!r} + ["training.strategy=mirrored", "training.train_steps=4",
            "training.steps_per_epoch=2", "training.steps_per_execution=2", "training.jit_compile=true", "training.eval_batches=1"])
        if sys.argv[1] == "train":  # (a process of its own: two MirroredStrategy objects' collectives collide)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                print(train(config, {str(tmp_path / "run")!r}, verbose=0))
            assert any("1 and false under MirroredStrategy" in str(w.message) for w in caught)
            sys.exit(0)

        rng = np.random.default_rng(0)
        unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
        teacher, student = unit(rng.normal(size=(8, 6))).astype("float32"), unit(rng.normal(size=(8, 3))).astype("float32")
        expected = np.mean((student @ student.T - teacher @ teacher.T) ** 2)
        gradient = 4 * (student @ student.T - teacher @ teacher.T) @ student / 64  # d mean / d student (symmetric)
        halves = strategy.experimental_distribute_values_from_function(
            lambda context: (teacher[4 * context.replica_id_in_sync_group:][:4], student[4 * context.replica_id_in_sync_group:][:4]))
        def replica(pair):
            rows = tf.identity(pair[1])
            with tf.GradientTape() as tape:
                tape.watch(rows)
                loss = SimilarityMatrixLoss()(pair[0], rows)  # Keras divides it by the replica count
            return loss, tape.gradient(loss, rows)
        with strategy.scope():
            losses, gradients = strategy.run(tf.function(replica), args=(halves,))
        total = float(strategy.reduce("SUM", losses, axis=None))
        np.testing.assert_allclose(total, expected, rtol=1e-5)
        got = np.concatenate([g.numpy() for g in strategy.experimental_local_results(gradients)])
        np.testing.assert_allclose(got, gradient, rtol=1e-4, atol=1e-7)
        print("global batch ok")
        """
    )
    results = [
        subprocess.run([sys.executable, "-c", script, part], capture_output=True, text=True, timeout=600)
        for part in ("train", "loss")
    ]
    for result in results:
        assert result.returncode == 0, result.stderr[-4000:]
    assert "'step': 4" in results[0].stdout and "global batch ok" in results[1].stdout


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.slow
def test_multi_worker_mirrored_two_processes_end_with_identical_weights(tmp_path):
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    processes = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = dict(os.environ, TF_CONFIG=json.dumps(tf_config))
        command = _cli(
            tmp_path / f"run{index}",
            "training.strategy=multi_worker",
            "training.train_steps=4",
            "training.steps_per_epoch=2",
            "training.steps_per_execution=1",
            "training.eval_batches=1",
        )
        processes.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [process.communicate(timeout=600) for process in processes]
    for process, (_, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-4000:]
    chief = _weights(tmp_path / "run0" / "model.weights.h5")
    other = _weights(tmp_path / "run1" / "worker_1" / "model.weights.h5")
    assert chief.keys() == other.keys()
    for name in chief:
        np.testing.assert_array_equal(chief[name], other[name], err_msg=name)
    assert json.loads((tmp_path / "run0" / "metrics.json").read_text())["step"] == 4
    assert json.loads((tmp_path / "run1" / "worker_1" / "metrics.json").read_text())["step"] == 4
    # ... and they trained: the weights moved away from the (seeded, shared) initialisation.
    keras.utils.set_random_seed(0)
    initial = configs.load_config("tiny_lm", TINY).build_model()
    initial.save_weights(tmp_path / "initial.weights.h5")
    start = _weights(tmp_path / "initial.weights.h5")
    assert start.keys() == chief.keys()
    assert max(np.abs(chief[name] - start[name]).max() for name in chief) > 1e-4


# A tiny BERT classifier on the shipped WordNet topics, 4 steps with dropout on.
CLASSIFIER = [
    "model_type=bert",
    "model.vocab_size=30522",
    "model.hidden_size=32",
    "model.num_layers=2",
    "model.num_heads=4",
    "model.intermediate_size=64",
    "model.max_sequence_length=64",
    "model.attention={type: fixed, head_size: 16}",
    "model.dropout=0.1",
    "training.sequence_length=32",
    "training.batch_size=8",
    "training.train_steps=4",
    "training.train_epochs=null",
    "training.steps_per_epoch=2",
    "training.steps_per_execution=1",
    "training.jit_compile=false",
    "training.learning_rate=1e-3",
    "training.warmup_fraction=null",
    "training.warmup_steps=1",
    "training.eval_batches=2",
]


@pytest.mark.slow
def test_a_classifier_trains_under_multi_worker_as_under_the_default_strategy(tmp_path, minilm_dir):
    """The multi-worker loop trains with the task's own loss (it once read the masked LM's logits, so any other
    task failed there): a one-worker cluster's classifier ends with the default strategy's weights, bit for bit.
    The multi-worker run has a process of its own (its cluster); the default one runs here."""
    runs_ = {strategy: tmp_path / strategy for strategy in ("cpu", "multi_worker")}
    commands = {
        strategy: _cli(
            run,
            *CLASSIFIER,
            f"tokenizer.vocabulary={minilm_dir / 'vocab.txt'}",
            f"training.strategy={strategy}",
            config="wordnet_topics",
        )
        for strategy, run in runs_.items()
    }
    cluster = {"cluster": {"worker": [f"127.0.0.1:{_free_ports(1)[0]}"]}, "task": {"type": "worker", "index": 0}}
    process = subprocess.Popen(
        commands["multi_worker"],
        env=dict(os.environ, TF_CONFIG=json.dumps(cluster)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _main(commands["cpu"])
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-4000:]
    single, multi = (_weights(runs_[name] / "model.weights.h5") for name in ("cpu", "multi_worker"))
    # the head too
    assert single.keys() == multi.keys() and any(not name.startswith("bert_encoder/") for name in single)
    for name in single:
        np.testing.assert_array_equal(multi[name], single[name], err_msg=name)
    metrics = json.loads((runs_["multi_worker"] / "metrics.json").read_text())
    assert metrics["task"] == "classification" and metrics["step"] == 4 and np.isfinite(metrics["eval_loss"])


def test_tpu_strategy_without_a_tpu_fails_at_once_naming_it():
    start = time.time()
    with pytest.raises(ValueError, match="TPU 'my-tpu-v4'"):
        choose_strategy("tpu", tpu="my-tpu-v4")
    assert time.time() - start < 60
    with pytest.raises(ValueError, match="--tpu"):
        choose_strategy("tpu")


def test_cli_reports_bad_strategy_input_without_traceback(tmp_path, capsys):
    from concise_attention.cli import train as train_cli

    with pytest.raises(SystemExit) as exit_info:
        train_cli.main((_cli(tmp_path / "run") + ["--strategy", "tpu", "--tpu", "no-such-tpu"])[3:])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "no-such-tpu" in error and error.strip().count("\n") == 0, error
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["task.dataset=text_files", "task.data_dir=/nonexistent/corpus"], "Corpus folder or .txt file not found"),
        (["training.sequence_length=128"], "sequence_length=128 is above the model's max_sequence_length=64"),
        (["tokenizer.vocabulary=/nonexistent/vocab.txt"], "Vocabulary file not found"),
    ],
)
def test_bad_inputs_fail_before_training(tmp_path, overrides, message):
    config = configs.load_config("tiny_lm", [*TINY, *overrides])
    with pytest.raises(ValueError, match=message):
        train(config, tmp_path / "run", verbose=0)
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_vocabulary_larger_than_the_model_fails_before_training(tmp_path):
    vocabulary = tmp_path / "vocab.txt"
    vocabulary.write_text(
        "\n".join(["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"] + [f"word{i}" for i in range(95)]) + "\n"
    )
    config = configs.load_config("tiny_lm", [*TINY, f"tokenizer.vocabulary={vocabulary}", "model.vocab_size=50"])
    with pytest.raises(ValueError, match="has 100 tokens but model.vocab_size=50"):
        train(config, tmp_path / "run", verbose=0)
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_empty_corpus_fails_before_training(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("\n \n")
    config = configs.load_config("tiny_lm", [*TINY, "task.dataset=text_files", f"task.data_dir={tmp_path / 'corpus'}"])
    with pytest.raises(ValueError, match="empty"):
        train(config, tmp_path / "run", verbose=0)


def test_trainer_refuses_configs_without_a_task(tmp_path):
    with pytest.raises(ValueError, match="no `training` section"):
        tiny = configs.load_config("tiny_bert_fixed")
        train(configs.ExperimentConfig("untrained", "bert", tiny.model, tiny.task), tmp_path / "run")


def test_cli_help_lists_the_options(capsys):
    from concise_attention.cli import train as train_cli

    with pytest.raises(SystemExit) as exit_info:
        train_cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--config", "--set", "--run-dir", "--strategy", "--tpu"):
        assert option in out
