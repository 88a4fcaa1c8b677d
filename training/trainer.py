"""The trainer of both tasks: tf.distribute, model.fit, resumable.

The task follows the config's model_type: `causal_lm` trains next-token prediction on
tensor2tensor-style packed rows; `bert` trains BERT's masked LM (a `BertPretrainer` on the
encoder) on segment pairs masked by keras-hub's mask generator.

A run directory holds everything a run needs to continue and everything downstream
reads:

    RUN/config.json              the resolved config (the exporter reads only this + weights)
    RUN/vocab.txt                the WordPiece vocabulary (trained once and cached, or copied)
    RUN/checkpoint/              weights + optimizer state + step, written atomically
    RUN/logs/                    TensorBoard
    RUN/model.weights.h5         final weights (the LM, or the BERT encoder + MLM head)
    RUN/metrics.json             final evaluation

Checkpoints are written at epoch ends (every `steps_per_epoch` steps) by writing a
temporary file and renaming it, so a run killed at any moment leaves the previous
checkpoint intact. A restarted run loads it, skips the batches already consumed (the
seeded pipeline replays the same order) and continues from the same step: no step is
counted twice.
"""

import json
import math
import os
import pathlib
import warnings

import keras
import tensorflow as tf

from models.bert import BertPretrainer
from models.hf_import import load_hf_weights
from training.objectives import TokenCrossEntropy
from training.objectives import WarmupDecaySchedule
from training.pipeline import corpus_lines
from training.pipeline import language_model_dataset
from training.pipeline import masked_lm_dataset
from training.pipeline import tokens_per_word
from training.strategy import choose_strategy
from training.tokenizer import train_wordpiece
from training.tokenizer import wordpiece_tokenizer

# Lines of a streaming corpus (LM1B) read to learn the vocabulary.
VOCABULARY_TRAINING_LINES = 200_000


class AtomicCheckpoint(keras.callbacks.Callback):
    """Writes weights + optimizer state (its step included) at each epoch end, atomically."""

    def __init__(self, directory, is_chief=True):
        super().__init__()
        self.directory = pathlib.Path(directory)
        self.is_chief = is_chief

    @property
    def weights_path(self):
        return self.directory / "model.weights.h5"

    def on_epoch_end(self, epoch, logs=None):
        if not self.is_chief:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        save_weights_atomically(self.model, self.weights_path)
        write_json_atomically(self.directory / "state.json", {"step": int(self.model.optimizer.iterations.numpy()), "epoch": epoch + 1})


class PerplexityLogger(keras.callbacks.Callback):
    """Adds per-subword and per-word perplexity of the evaluation loss to the epoch logs."""

    def __init__(self, tokens_per_word=None):
        super().__init__()
        self.tokens_per_word = tokens_per_word

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and "val_loss" in logs:
            logs["val_subword_perplexity"] = math.exp(min(logs["val_loss"], 50.0))
            if self.tokens_per_word is not None:
                logs["val_word_perplexity"] = math.exp(min(logs["val_loss"] * self.tokens_per_word, 50.0))


def save_weights_atomically(model, path):
    """`model.save_weights(path)` through a temporary file and a rename: never half-written."""
    path = pathlib.Path(path)
    temporary = path.with_name(f".{path.stem}.{os.getpid()}.tmp.weights.h5")
    model.save_weights(temporary)
    os.replace(temporary, path)


def write_json_atomically(path, value):
    path = pathlib.Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(value, indent=1, sort_keys=True))
    os.replace(temporary, path)


def _is_hf_checkpoint(path):
    return pathlib.Path(path).is_dir() and (pathlib.Path(path) / "model.safetensors").is_file()


def _check(config):
    """Fails fast, before any data is read or model built, on configs that cannot train."""
    if config.model_type not in ("causal_lm", "bert"):
        raise ValueError(f"The trainer trains causal_lm and bert models. Received: model_type={config.model_type!r} ({config.name})")
    if config.training is None:
        raise ValueError(f"Config {config.name!r} has no `training` section.")
    training, model = config.training, config.model
    if training.init_weights:
        if _is_hf_checkpoint(training.init_weights) and config.model_type != "bert":
            raise ValueError(f"A Hugging Face BERT checkpoint initialises bert models only. Received: training.init_weights={training.init_weights!r}")
        if not (pathlib.Path(training.init_weights).is_file() or _is_hf_checkpoint(training.init_weights)):
            raise ValueError(
                "Initial weights not found (a .weights.h5 file or a folder with model.safetensors). "
                f"Received: training.init_weights={training.init_weights!r}"
            )
    if training.sequence_length > model.max_sequence_length:
        raise ValueError(
            f"training.sequence_length={training.sequence_length} is above the model's "
            f"max_sequence_length={model.max_sequence_length}."
        )
    if config.model_type == "bert" and training.max_predictions > training.sequence_length:
        raise ValueError(
            f"training.max_predictions={training.max_predictions} is above training.sequence_length={training.sequence_length}."
        )


def build_training_model(config):
    """The model a run trains and saves: the causal LM itself, or `BertPretrainer(encoder)`."""
    model = config.build_model()
    return BertPretrainer(model) if config.model_type == "bert" else model


def prepare_vocabulary(config, run_dir, train_lines):
    """The run's vocabulary, RUN/vocab.txt: a copy of `training.vocabulary` (or of the
    vocab.txt beside a Hugging Face checkpoint), else WordPiece trained on the training text."""
    training = config.training
    path = pathlib.Path(run_dir) / "vocab.txt"
    source = training.vocabulary
    if not source and training.init_weights and _is_hf_checkpoint(training.init_weights):
        source = pathlib.Path(training.init_weights) / "vocab.txt"
    if source:
        source = pathlib.Path(source)
        if not source.is_file():
            raise ValueError(f"Vocabulary file not found. Received: training.vocabulary={str(source)!r}")
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_bytes(source.read_bytes())
        os.replace(temporary, path)
    else:
        lines = [line for _, line in zip(range(VOCABULARY_TRAINING_LINES), train_lines())]
        train_wordpiece(lines, config.model.vocab_size, path, strip_accents=training.strip_accents)
    size = sum(1 for _ in path.open(encoding="utf-8"))
    if size > config.model.vocab_size:
        raise ValueError(
            f"The vocabulary {path} has {size} tokens but model.vocab_size={config.model.vocab_size}: "
            "set model.vocab_size to at least the vocabulary size."
        )
    return path


def _datasets(config, tokenizer, train_lines, eval_lines, skip_batches):
    training = config.training
    if config.model_type == "bert":
        def make(lines, is_training, skip=0):
            return masked_lm_dataset(
                lines, tokenizer, training.sequence_length, training.batch_size, training.max_predictions,
                training.mask_rate, training=is_training, seed=training.seed, skip_batches=skip,
            )
    else:
        def make(lines, is_training, skip=0):
            return language_model_dataset(
                lines, tokenizer, training.sequence_length, training.batch_size, training=is_training,
                seed=training.seed, skip_batches=skip,
            )
    return make(train_lines, True, skip_batches), make(eval_lines, False)


def train_language_model(config, run_dir, verbose="auto"):
    """Trains (or resumes training of) the model of `config` in `run_dir`.

    Args:
        config: an `ExperimentConfig` with model_type "causal_lm" (next-token task) or
            "bert" (masked LM) and a training section.
        run_dir: the run directory (created; an existing one is resumed).
        verbose: keras progress display ("auto", 0, 1, 2).

    Returns:
        dict of final metrics: step, eval loss and accuracy, per-subword perplexity (and
        per-word perplexity for causal LMs).
    """
    _check(config)
    training = config.training
    run_dir = pathlib.Path(run_dir)
    train_lines = corpus_lines(training.dataset, training.data_dir, "train")
    eval_lines = corpus_lines(training.dataset, training.data_dir, "eval")
    strategy = choose_strategy(training.strategy, training.tpu)
    is_chief = _is_chief(strategy)
    run_dir.mkdir(parents=True, exist_ok=True)
    saved_config = run_dir / "config.json"
    if saved_config.is_file() and json.loads(saved_config.read_text())["model"] != config.to_dict()["model"]:
        raise ValueError(f"{run_dir} holds a run of a different model; use a new run directory.")
    if is_chief:
        write_json_atomically(saved_config, config.to_dict() | {"name": config.name})
    vocabulary = prepare_vocabulary(config, run_dir, train_lines)
    tokenizer = wordpiece_tokenizer(vocabulary, strip_accents=training.strip_accents)
    ratio = None
    if config.model_type == "causal_lm":
        ratio = tokens_per_word([line for _, line in zip(range(20_000), eval_lines())], tokenizer)

    keras.utils.set_random_seed(training.seed)
    checkpoint = AtomicCheckpoint(run_dir / "checkpoint", is_chief=is_chief)
    with strategy.scope():
        model = build_training_model(config)
        model.compile(
            optimizer=keras.optimizers.AdamW(
                learning_rate=WarmupDecaySchedule(training.learning_rate, training.warmup_steps, training.decay, training.train_steps),
                weight_decay=training.weight_decay,
                beta_1=training.adam_beta_1,
                beta_2=training.adam_beta_2,
                epsilon=training.adam_epsilon,
            ),
            loss=TokenCrossEntropy(training.label_smoothing),
            weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            steps_per_execution=training.steps_per_execution,
            jit_compile=training.jit_compile,
        )
        # LayerNorm scales/offsets, biases and Admin's omegas are not decayed.
        model.optimizer.exclude_from_weight_decay(var_names=["gamma", "beta", "bias", "omega"])
        step = 0
        if training.init_weights and not checkpoint.weights_path.is_file():
            if _is_hf_checkpoint(training.init_weights):
                load_hf_weights(model.encoder, training.init_weights)
            else:
                model.load_weights(training.init_weights)
        if checkpoint.weights_path.is_file():
            model.optimizer.build(model.trainable_variables)
            model.load_weights(checkpoint.weights_path)
            step = int(model.optimizer.iterations.numpy())

    epochs = math.ceil(training.train_steps / training.steps_per_epoch)
    train_data, eval_data = _datasets(config, tokenizer, train_lines, eval_lines, skip_batches=step)
    if step == 0 and config.model.residual_scaling == "admin" and not training.init_weights:
        # Admin's profiling pass on the first training batch sets the residual scalings.
        profiling_inputs, _, _ = next(iter(train_data))
        with strategy.scope():
            if config.model_type == "bert":
                model.encoder.initialize_admin({name: profiling_inputs[name] for name in model.encoder.input})
            else:
                model.initialize_admin(profiling_inputs)
    # Cached: the evaluation rows (and their masks) are the same at every evaluation.
    eval_data = eval_data.take(training.eval_batches).cache()
    eval_steps = sum(1 for _ in eval_data)
    if eval_steps == 0:
        raise ValueError(
            f"The evaluation split holds less than one batch of {training.batch_size} rows of {training.sequence_length} tokens."
        )
    if config.model_type == "bert":
        # The masked LM does not train the pooler (no next-sentence task); fine-tuning does.
        warnings.filterwarnings("ignore", message=r"Gradients do not exist for variables \['pooler/kernel', 'pooler/bias'\]")
    callbacks = [checkpoint, PerplexityLogger(ratio), keras.callbacks.TensorBoard(str(run_dir / "logs"), update_freq="epoch")]
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        loop = _MultiWorkerLoop(model, strategy, train_data, eval_data)
        if step < training.train_steps:
            loop.fit(epochs, step // training.steps_per_epoch, training.steps_per_epoch, callbacks, verbose)
        eval_loss, eval_accuracy = loop.evaluate(), None
    else:
        if step < training.train_steps:
            model.fit(
                train_data,
                epochs=epochs,
                initial_epoch=step // training.steps_per_epoch,
                steps_per_epoch=training.steps_per_epoch,
                validation_data=eval_data,
                validation_steps=eval_steps,
                callbacks=callbacks,
                shuffle=False,
                verbose=verbose,
            )
        evaluation = model.evaluate(eval_data, steps=eval_steps, verbose=0, return_dict=True)
        eval_loss, eval_accuracy = evaluation["loss"], evaluation["accuracy"]
    metrics = {
        "task": "mlm" if config.model_type == "bert" else "lm",
        "step": int(model.optimizer.iterations.numpy()),
        "eval_loss": float(eval_loss),
        "eval_subword_perplexity": math.exp(min(eval_loss, 50.0)),
    }
    if eval_accuracy is not None:
        metrics["eval_accuracy"] = float(eval_accuracy)
    if ratio is not None:
        metrics |= {"eval_word_perplexity": math.exp(min(eval_loss * ratio, 50.0)), "tokens_per_word": ratio}
    # Non-chief workers of a multi-worker run write beside, never over, the chief's files.
    output_dir = run_dir if is_chief else run_dir / f"worker_{strategy.cluster_resolver.task_id}"
    output_dir.mkdir(parents=True, exist_ok=True)
    save_weights_atomically(model, output_dir / "model.weights.h5")
    write_json_atomically(output_dir / "metrics.json", metrics)
    return metrics


class _MultiWorkerLoop:
    """`strategy.run` training and evaluation for MultiWorkerMirroredStrategy.

    Keras 3.15's `model.fit` and `model.evaluate` fail under MultiWorkerMirroredStrategy
    (keras-team/keras#20329: the symbolic build reduces the nested first batch in one
    collective; the step logs are then reduced along axis 0 although they are scalars).
    This loop does what fit does for this trainer, with the same model, optimizer, loss,
    data and callbacks: each replica's weighted token loss is divided by the global
    weight total, so the gradients the Keras optimizer all-reduces (sums) across replicas
    are those of the global mean, as on one device.
    """

    def __init__(self, model, strategy, train_data, eval_data):
        self.model, self.strategy = model, strategy
        self.train_iterator = iter(strategy.experimental_distribute_dataset(train_data))
        self.eval_data = strategy.experimental_distribute_dataset(eval_data)
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)

    def _weighted_loss_sums(self, inputs, labels, weights, training):
        outputs = self.model(inputs, training=training)
        logits = outputs["mlm_logits"] if isinstance(outputs, dict) else outputs
        per_token = self.model.loss.call(labels, logits)
        return tf.reduce_sum(per_token * weights), tf.reduce_sum(weights)

    @tf.function
    def _train_step(self):
        def replica_step(inputs, labels, weights):
            total = tf.distribute.get_replica_context().all_reduce("SUM", tf.reduce_sum(weights))
            with tf.GradientTape() as tape:
                loss_sum, _ = self._weighted_loss_sums(inputs, labels, weights, training=True)
                loss = loss_sum / tf.maximum(total, 1.0)
            gradients = tape.gradient(loss, self.model.trainable_variables)
            self.model.optimizer.apply(gradients, self.model.trainable_variables)
            return loss

        return self.strategy.reduce("SUM", self.strategy.run(replica_step, args=next(self.train_iterator)), axis=None)

    @tf.function
    def _eval_step(self, batch):
        sums = self.strategy.run(lambda i, l, w: self._weighted_loss_sums(i, l, w, training=False), args=batch)
        return [self.strategy.reduce("SUM", value, axis=None) for value in sums]

    def evaluate(self):
        loss_sum, weight_sum = 0.0, 0.0
        for batch in self.eval_data:
            batch_loss, batch_weight = self._eval_step(batch)
            loss_sum, weight_sum = loss_sum + float(batch_loss), weight_sum + float(batch_weight)
        return loss_sum / max(weight_sum, 1.0)

    def fit(self, epochs, initial_epoch, steps_per_epoch, callbacks, verbose):
        callbacks = keras.callbacks.CallbackList(callbacks, model=self.model)
        callbacks.on_train_begin()
        for epoch in range(initial_epoch, epochs):
            callbacks.on_epoch_begin(epoch)
            losses = [float(self._train_step()) for _ in range(steps_per_epoch)]
            logs = {"loss": sum(losses) / len(losses), "val_loss": self.evaluate()}
            callbacks.on_epoch_end(epoch, logs)
            if verbose:
                print(f"epoch {epoch + 1}/{epochs}: " + ", ".join(f"{k}={v:.4f}" for k, v in logs.items()), flush=True)
        callbacks.on_train_end()


def _is_chief(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return True
    return resolver.task_type in ("chief", None) or (resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in resolver.cluster_spec().as_dict())

