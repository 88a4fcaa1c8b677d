"""Causal-LM training from prepared shards without TensorFlow: the route for a JAX-only GPU image.

    KERAS_BACKEND=jax python -m concise_attention.training.trainers.shard_trainer --config tiny_lm --data DIR --run-dir RUN

DIR is what `concise-prepare-data` wrote (on a machine with TensorFlow; copy it to a local
folder). This module imports numpy, keras and the project's TensorFlow-free modules only:
the same model (`models/`), task settings, loss and metrics (`CausalLMTask`), optimizer and
schedule (`training.tasks.objectives.make_optimizer`) and the same batches in the same order
(`training.data.shards.causal_lm_batches`) as the TensorFlow trainer on `task.dataset: prepared`.

RUN (a local folder) receives config.json, vocab.txt, checkpoint/state.npz (every model
variable, dropout seed states included, every optimizer variable, its step among them, and
the epoch logs; written at each epoch end under a temporary name, then renamed), then
backbone.weights.h5, model.weights.h5 and metrics.json: the names of `training.files`, so a
TensorFlow run starts from it with `task.init` and `training.artifacts.load` reads it. The same command again resumes from the checkpoint and
ends bit-identical to an uninterrupted run. `task.init` names a run directory whose
backbone.weights.h5 starts the model.
"""

import argparse
import dataclasses
import json
import os
import random
import sys

import keras
import numpy as np

from concise_attention.training.data import shards
from concise_attention.training.run import configs
from concise_attention.training.tasks import make_task
from concise_attention.training.tasks.objectives import make_optimizer

CHECKPOINT = os.path.join("checkpoint", "state.npz")


def _write_atomically(path, write):
    """Calls write(file) on a temporary file beside `path`, then renames it to `path`."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "wb") as file:
        write(file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


class NumpyCheckpoint(keras.callbacks.Callback):
    """Every model and optimizer variable, by order, and the epoch logs, in one .npz per epoch end."""

    def __init__(self, path):
        super().__init__()
        self.path, self.history = path, []

    def on_epoch_end(self, epoch, logs=None):
        self.history.append(
            {
                "epoch": epoch + 1,
                "step": int(self.model.optimizer.iterations.numpy()),
                **{key: float(value) for key, value in (logs or {}).items()},
            }
        )
        arrays = {f"model_{index}": np.asarray(variable.numpy()) for index, variable in enumerate(self.model.variables)}
        arrays |= {
            f"optimizer_{index}": np.asarray(variable.numpy())
            for index, variable in enumerate(self.model.optimizer.variables)
        }
        arrays["history"] = np.asarray(json.dumps(self.history))
        _write_atomically(self.path, lambda file: np.savez(file, **arrays))

    def restore(self, model):
        """Loads a checkpoint into `model` (its optimizer is built here); returns the step."""
        model.optimizer.build(model.trainable_variables)
        with np.load(self.path, allow_pickle=False) as saved:
            for prefix, variables in (("model", model.variables), ("optimizer", model.optimizer.variables)):
                count = sum(1 for name in saved.files if name.startswith(f"{prefix}_"))
                if count != len(variables):
                    raise ValueError(f"{self.path} holds {count} {prefix} variables; this run has {len(variables)}.")
                for index, variable in enumerate(variables):
                    value = saved[f"{prefix}_{index}"]
                    if value.shape != tuple(variable.shape):
                        raise ValueError(
                            f"{self.path}: {prefix} variable {variable.path} has shape {value.shape}, "
                            f"the run's {tuple(variable.shape)}."
                        )
                    variable.assign(value)
            self.history = json.loads(str(saved["history"]))
        return int(model.optimizer.iterations.numpy())


def _check(config, data_dir):
    if keras.backend.backend() == "tensorflow":
        raise ValueError(
            "The shard trainer is the TensorFlow-free route: run it with KERAS_BACKEND=jax "
            "(with TensorFlow, use concise-train with task.dataset=prepared)."
        )
    if config.task.name != "causal_lm" or config.training is None:
        raise ValueError(
            f"The shard trainer trains causal_lm configs with a training section. Received: {config.name!r} "
            f"(task.name={config.task.name!r})"
        )
    manifest = shards.read_manifest(data_dir)
    shards.check_manifest(manifest, data_dir, "causal_lm", config.training.sequence_length)
    if manifest["vocabulary_size"] > config.model.vocab_size:
        raise ValueError(
            f"The shards' vocabulary has {manifest['vocabulary_size']} tokens but "
            f"model.vocab_size={config.model.vocab_size}."
        )
    return manifest


def _build(config, task, checkpoint):
    """The compiled CausalLM, restored from the checkpoint or task.init; returns (model, step)."""
    training = config.training
    # What keras.utils.set_random_seed seeds for initializers and dropout (they draw their
    # seeds from Python's `random`), without its tf.random.set_seed, which imports TensorFlow.
    random.seed(training.seed)
    np.random.seed(training.seed)
    model = task.build_model(config.build_model(dtype=keras.DTypePolicy(training.precision)))
    model.compile(optimizer=make_optimizer(training), jit_compile=True, **task.compile_arguments())
    if os.path.exists(checkpoint.path):
        return model, checkpoint.restore(model)
    if config.task.init:
        model.load_weights(os.path.join(config.task.init, "backbone.weights.h5"))
    return model, 0


def _evaluation_batches(reader, batch_size, eval_batches):
    batches = list(zip(range(eval_batches), shards.causal_lm_batches(reader, batch_size)))
    if not batches:
        raise ValueError(f"The eval split holds less than one batch of {batch_size} rows.")
    inputs, labels, weights = zip(*(batch for _, batch in batches))
    return (
        {name: np.concatenate([batch[name] for batch in inputs]) for name in inputs[0]},
        np.concatenate(labels),
        np.concatenate(weights),
    )


def _record(config, data_dir, run_dir):
    """Writes the run's config.json and its copy of the shards' vocabulary."""
    os.makedirs(run_dir, exist_ok=True)
    recorded = json.dumps(config.to_dict() | {"name": config.name}, indent=1, sort_keys=True).encode()
    _write_atomically(os.path.join(run_dir, "config.json"), lambda file: file.write(recorded))
    with open(os.path.join(data_dir, shards.VOCABULARY), "rb") as vocabulary:
        tokens = vocabulary.read()
    _write_atomically(os.path.join(run_dir, shards.VOCABULARY), lambda file: file.write(tokens))


def train(config, data_dir, run_dir, verbose="auto"):
    """Trains (or resumes) the causal LM of `config` on the prepared shards in `data_dir`.

    Returns:
        dict of final metrics: the step, the epoch logs and the evaluation of `CausalLMTask`.
    """
    manifest = _check(config, data_dir)
    config = dataclasses.replace(
        config, task=dataclasses.replace(config.task, dataset="prepared", data_dir=str(data_dir))
    )
    training = config.training
    task = make_task(config)
    task.tokens_per_word = manifest["tokens_per_word"]
    _record(config, data_dir, run_dir)
    checkpoint = NumpyCheckpoint(os.path.join(run_dir, CHECKPOINT))
    model, step = _build(config, task, checkpoint)
    train_reader = shards.ShardReader(data_dir, "train", seed=training.seed, manifest=manifest)
    inputs, labels, weights = _evaluation_batches(
        shards.ShardReader(data_dir, "eval", manifest=manifest), training.batch_size, training.eval_batches
    )
    full_epochs, last_epoch_steps = divmod(training.train_steps, training.steps_per_epoch)
    epochs = [(epoch, training.steps_per_epoch) for epoch in range(full_epochs)] + (
        [(full_epochs, last_epoch_steps)] if last_epoch_steps else []
    )
    for epoch, steps in epochs:
        if step >= epoch * training.steps_per_epoch + steps:
            continue
        # One fit per epoch, each reading from its first batch: a resumed run reads what it would have read.
        model.fit(
            shards.causal_lm_batches(train_reader, training.batch_size, epoch * training.steps_per_epoch),
            epochs=epoch + 1,
            initial_epoch=epoch,
            steps_per_epoch=steps,
            validation_data=(inputs, labels, weights),
            validation_batch_size=training.batch_size,
            callbacks=[checkpoint],
            shuffle=False,
            verbose=verbose,
        )
        step = int(model.optimizer.iterations.numpy())
    evaluation = task.evaluate(model, _as_batches(inputs, labels, weights, training.batch_size))
    metrics = {
        "task": "causal_lm",
        "step": int(model.optimizer.iterations.numpy()),
        "history": checkpoint.history,
        **evaluation,
    }
    for name in ("backbone.weights.h5", "model.weights.h5"):  # the causal LM is its own task model
        _save_weights(model, os.path.join(run_dir, name))
    _write_atomically(
        os.path.join(run_dir, "metrics.json"), lambda file: file.write(json.dumps(metrics, indent=1).encode())
    )
    return metrics


def _as_batches(inputs, labels, weights, batch_size):
    for start in range(0, len(labels) - batch_size + 1, batch_size):
        yield (
            {name: value[start : start + batch_size] for name, value in inputs.items()},
            labels[start : start + batch_size],
            weights[start : start + batch_size],
        )


def _save_weights(model, path):
    temporary = f"{path[: -len('.weights.h5')]}.tmp-{os.getpid()}.weights.h5"
    model.save_weights(temporary)
    os.replace(temporary, path)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m concise_attention.training.trainers.shard_trainer",
        description="Train a causal LM from prepared .npy shards under KERAS_BACKEND=jax, without TensorFlow (resumable).",
        epilog="Example: KERAS_BACKEND=jax python -m concise_attention.training.trainers.shard_trainer --config tiny_lm --data prepared/ --run-dir runs/jax",
    )
    configs.add_config_arguments(parser)
    parser.add_argument("--data", required=True, help="the folder concise-prepare-data wrote (local)")
    parser.add_argument(
        "--run-dir",
        required=True,
        help="local run directory: config, checkpoint, weights, metrics (resumed if present)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        config = configs.load_config(args.config, args.set)
        metrics = train(config, args.data, args.run_dir, verbose=0 if args.quiet else "auto")
    except ValueError as error:
        parser.exit(2, f"python -m concise_attention.training.trainers.shard_trainer: error: {error}\n")
    print(json.dumps({key: value for key, value in metrics.items() if key != "history"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
