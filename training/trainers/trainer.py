"""The trainer: any task of the registry on tf.distribute, with `model.fit`, resumable.

The trainer knows no task by name: `training.tasks.make_task(config)` gives the head, the
data, the loss, the metrics and the final evaluation. It owns what every run shares: the
run directory (`training.run.runs`), the vocabulary, initialisation from a trained model
(`task.init`: a run directory, a `concise-collaborative` output or a Hugging Face BERT
folder), the optimizer and schedule, checkpoints, TensorBoard and the strategy.

Checkpoints (`training.run.checkpoints`: `tf.train.Checkpoint`s, committed by their pointer
file) are written at epoch ends (every `steps_per_epoch` steps; the last epoch is shorter
when that does not divide `train_steps`) and, on SIGTERM, at the step reached. They hold the
weights, the optimizer state (its step), the dropout seed states and the data position. A
restarted run restores the newest readable one, skips the batches already consumed (the
seeded pipeline replays the same order and the same masks) and continues from that step,
even inside an epoch: no step is lost or counted twice, and the result is bit-identical to
an uninterrupted run's.
"""

import dataclasses
import hashlib
import json
import math
import os
import warnings

import keras
import tensorflow as tf

from concise_attention.models import presets
from concise_attention.training import files
from concise_attention.training import artifacts
from concise_attention.training.preprocessing.text import read_vocabulary
from concise_attention.training.preprocessing.tokenizer import bert_settings
from concise_attention.training.preprocessing.tokenizer import tokenizer_settings
from concise_attention.training.preprocessing.tokenizer import train_wordpiece
from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer
from concise_attention.training.run import configs
from concise_attention.training.run import runs
from concise_attention.training.run.checkpoints import CheckpointCallback
from concise_attention.training.run.checkpoints import TrainingCheckpoints
from concise_attention.training.run.checkpoints import handle_preemption
from concise_attention.training.run.strategy import choose_strategy
from concise_attention.training.tasks import make_task
from concise_attention.training.tasks.objectives import make_optimizer

# Lines of a streaming corpus (LM1B) read to learn the vocabulary.
VOCABULARY_TRAINING_LINES = 200_000


class DivergenceCheck(keras.callbacks.Callback):
    """Stops a run whose training loss is no longer a finite number, before that step's checkpoint or weights are
    saved (one line naming the step, exit 2): a diverged run does not end as if it had trained."""

    def on_train_batch_end(self, batch, logs=None):
        check_finite({"loss": (logs or {}).get("loss")}, lambda: f"step {int(self.model.optimizer.iterations.numpy())}")


def check_finite(metrics, where):
    """Refuses a numeric metric (a Python, numpy or tensor scalar) that is not a finite number; `where`: the place it
    names, or a function giving it (read only on a refusal)."""
    for name, value in metrics.items():
        try:
            value = float(value) if not isinstance(value, str) else None
        except (TypeError, ValueError):
            value = None
        if value is not None and not math.isfinite(value):
            where = where() if callable(where) else where
            raise ValueError(
                f"Training diverged: {name} is {value} at {where}. Lower training.learning_rate or check "
                "the model settings; the run keeps its last finite checkpoint, if any."
            )


class PerplexityLogger(keras.callbacks.Callback):
    """Adds the per-subword perplexity of the evaluation loss to the epoch logs (LM tasks), and
    the per-word one when the task knows its subwords per word (`task.tokens_per_word`)."""

    def __init__(self, task):
        super().__init__()
        self.task = task

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and "val_loss" in logs:
            logs["val_subword_perplexity"] = math.exp(min(logs["val_loss"], 50.0))
            ratio = getattr(self.task, "tokens_per_word", None)
            if ratio is not None:
                logs["val_word_perplexity"] = math.exp(min(logs["val_loss"] * ratio, 50.0))


def resolve_config(config):
    """The config with what `task.init` supplies filled in: the architecture when the model
    section is left out (checked against it otherwise) and the tokenizer settings.

    Returns:
        (config, source): `source` is the `artifacts.Source` of task.init, or None.
    """
    if config.training is None:
        raise ValueError(f"Config {config.name!r} has no `training` section.")
    if not config.task.init:
        if config.model is None:
            raise ValueError(f"Config {config.name!r} has no model section and no task.init.")
        return config, None
    try:
        source = artifacts.read(config.task.init)
    except ValueError as error:
        raise ValueError(f"task.init={config.task.init!r}: {error}") from None
    if config.model is None:
        model = configs.MODEL_CONFIGS[source.model_type](**source.model)
        config = dataclasses.replace(config, model_type=source.model_type, model=model)
    _check_same_architecture(config, source)
    inherited = {
        "lowercase": source.tokenizer.get("lowercase", True),
        "strip_accents": source.tokenizer.get("strip_accents"),
    }
    chosen = {"lowercase": config.tokenizer.lowercase, "strip_accents": config.tokenizer.strip_accents}
    mine = bert_settings({field: inherited[field] if value is None else value for field, value in chosen.items()})
    theirs = bert_settings(inherited)
    for field, value in chosen.items():
        if value is not None and mine[field] != theirs[field]:
            raise ValueError(
                f"tokenizer.{field}={value!r} disagrees with the model of task.init={config.task.init!r}, "
                f"which was trained with {field}={theirs[field]!r}."
            )
    tokenizer = dataclasses.replace(config.tokenizer, **inherited)
    task = config.task
    if (
        getattr(task, "pooling", "") is None and source.embedding
    ):  # a head on a sentence encoder reads its mean token vector
        task = dataclasses.replace(task, pooling=presets.head_pooling(source.embedding))
    return dataclasses.replace(config, tokenizer=tokenizer, task=task), source


def _check_same_architecture(config, source):
    ours = dataclasses.asdict(config.model)
    different = {
        key: (ours.get(key), value)
        for key, value in source.model.items()
        if key not in ("dropout", "attention_dropout") and ours.get(key) != value
    }
    if config.model_type != source.model_type or different:
        details = ", ".join(
            f"{key}: config {mine!r} vs init {theirs!r}" for key, (mine, theirs) in sorted(different.items())
        )
        raise ValueError(
            f"The model section does not describe the model of task.init={config.task.init!r} "
            f"(model_type {config.model_type!r} vs {source.model_type!r}; {details}). Leave the model section out to take the init's."
        )


def prepare_vocabulary(config, run, task, source):
    """The run's vocab.txt: tokenizer.vocabulary, else task.init's, else the task's own (a teacher's),
    else WordPiece trained on the task's text (cached in the run directory)."""
    path = run.file(files.VOCABULARY)
    chosen = config.tokenizer.vocabulary or (source.vocabulary if source else None) or task.vocabulary_file()
    if chosen:
        if not tf.io.gfile.exists(chosen):
            raise ValueError(f"Vocabulary file not found. Received: tokenizer.vocabulary={str(chosen)!r}")
        tokens = read_vocabulary(chosen)
        text = "\n".join(tokens) + "\n"  # as write_vocabulary writes it: checked before the run's copy is replaced
        run.check_inputs({"vocabulary": hashlib.sha256(text.encode("utf-8")).hexdigest()}, {"vocabulary": chosen})
        run.write_vocabulary(tokens)
    else:
        lines = [line for _, line in zip(range(VOCABULARY_TRAINING_LINES), task.vocabulary_text())]
        settings = tokenizer_settings(config)
        train_wordpiece(lines, config.model.vocab_size, path, **settings)
    size = len(read_vocabulary(path))
    if size > config.model.vocab_size:
        raise ValueError(
            f"The vocabulary {path} has {size} tokens but model.vocab_size={config.model.vocab_size}: "
            "set model.vocab_size to at least the vocabulary size."
        )
    return path


def initialize_model(model, backbone, source, task_settings):
    """Starts from task.init: the whole task model (head included) when `source` was trained
    for the same task with the same labels (a fine-tuned run, or its `concise-collaborative`
    conversion: fine-tuning goes on with its head), else the backbone alone. Returns "model" or "backbone"."""
    head_fits = (
        source.model_weights is not None
        and (source.task or {}).get("name") == task_settings.name
        and (source.task or {}).get("labels") == getattr(task_settings, "labels", None)
    )
    artifacts.load_weights_into(model if head_fits else backbone, source, head=head_fits)
    return "model" if head_fits else "backbone"


def resolve_steps(training, num_examples):
    """train_steps and warmup_steps from train_epochs and warmup_fraction, when set."""
    steps = training.train_steps
    if training.train_epochs is not None:
        if not num_examples:
            raise ValueError(
                "training.train_epochs needs a task with a known number of training examples; set training.train_steps."
            )
        steps = max(1, math.ceil(training.train_epochs * num_examples / training.batch_size))
    warmup = training.warmup_steps if training.warmup_fraction is None else int(training.warmup_fraction * steps)
    if training.decay == "linear" and steps <= warmup:
        raise ValueError(f"Linear decay needs more training steps ({steps}) than warm-up steps ({warmup}).")
    return dataclasses.replace(training, train_steps=steps, warmup_steps=warmup)


def execution_settings(training, strategy=None):
    """model.compile's steps_per_execution and jit_compile for `training` under `strategy`.

    steps_per_execution is reduced to divide training.steps_per_epoch (Keras runs whole executions),
    so every epoch, and so each checkpoint, ends at its step. Under MirroredStrategy: 1 and no XLA,
    since Keras 3 fails there with several steps per execution (keras-team/keras#19246) and with XLA
    across replicas. The steps and their results are the same either way.
    """
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        if training.steps_per_execution > 1 or training.jit_compile:
            warnings.warn(
                f"training.steps_per_execution={training.steps_per_execution} and training.jit_compile="
                f"{training.jit_compile}: 1 and false under MirroredStrategy (Keras 3 fails there with several "
                "steps per execution, keras-team/keras#19246, and with XLA across replicas, which its "
                "jit_compile='auto' turns off under tf.distribute)."
            )
        return {"steps_per_execution": 1, "jit_compile": False}
    steps = math.gcd(training.steps_per_execution, training.steps_per_epoch)
    if steps != training.steps_per_execution:
        warnings.warn(
            f"training.steps_per_execution={training.steps_per_execution} does not divide "
            f"training.steps_per_epoch={training.steps_per_epoch}: running {steps} steps per execution."
        )
    return {"steps_per_execution": steps, "jit_compile": training.jit_compile}


def _check_sequence_length(config):
    if config.training.sequence_length > config.model.max_sequence_length:
        raise ValueError(
            f"training.sequence_length={config.training.sequence_length} is above the model's "
            f"max_sequence_length={config.model.max_sequence_length}."
        )


def _build(config, task, strategy, run, source, is_chief, tokenizer):
    """The compiled task model under the strategy, restored from the newest readable
    checkpoint or task.init (`tokenizer`: the run's); returns (model, backbone, checkpoints, data position)."""
    training = config.training
    keras.utils.set_random_seed(training.seed)
    with strategy.scope():
        # The precision is the model's dtype policy (no process-wide policy is set).
        backbone = config.build_model(dtype=keras.DTypePolicy(training.precision))
        model = task.build_model(backbone)
        model.compile(
            optimizer=make_optimizer(training), **execution_settings(training, strategy), **task.compile_arguments()
        )
        checkpoints = TrainingCheckpoints(run, model, training.keep_checkpoints, is_chief)
        position = checkpoints.restore()
        if position is None:
            started = initialize_model(model, backbone, source, config.task) if source is not None else None
            task.initialize(model, backbone, tokenizer, started)
    return model, backbone, checkpoints, position or 0


def train(config, run_dir, verbose="auto"):
    """Trains (or resumes training of) the task of `config` in `run_dir`.

    Args:
        config: an `ExperimentConfig` with a training section (the task's model_type).
        run_dir: the run directory, local or gs:// (created; an existing one is resumed).
        verbose: keras progress display ("auto", 0, 1, 2).

    Returns:
        dict of final metrics: the step and the task's evaluation.

    Raises:
        training.run.checkpoints.Preempted: on SIGTERM, once a checkpoint at the step reached is saved.
    """
    run, locked = runs.RunDirectory(run_dir), False
    try:
        if _is_chief_process():  # the lock first: a refused second trainer has seen and written nothing
            before, locked = run.lock(), True
        with handle_preemption() as preemption:
            return _train(config, run_dir, verbose, preemption)
    except (ValueError, *configs.path_errors()) as error:  # refused input, a path TensorFlow refuses included (exit 2):
        if locked:  # nothing is left written, unless the run has trained
            run.roll_back(before)
        if isinstance(error, ValueError):
            raise
        raise ValueError(configs.environment_error(error)) from None
    finally:
        run.unlock()


def _callbacks(task, run, checkpoints, preemption):
    """fit's callbacks, the checkpoint last: an epoch is logged before its checkpoint commits (a kill in between logs
    it twice, never loses it)."""
    callbacks = [
        DivergenceCheck(),
        keras.callbacks.TensorBoard(run.logs_dir, update_freq="epoch"),
        CheckpointCallback(checkpoints, preemption),
    ]
    return [PerplexityLogger(task), *callbacks] if task.reports_perplexity else callbacks


def _train(config, run_dir, verbose, preemption):
    config, source = resolve_config(config)
    task = make_task(config)
    task.check()
    _check_sequence_length(config)
    run = runs.RunDirectory(run_dir)
    run.check_writable()
    if not run.has_progress():
        task.check_start()
    task.read()
    # The task may resolve settings from its data (e.g. the label names): the run keeps them.
    config = dataclasses.replace(
        config, task=task.settings, training=resolve_steps(config.training, task.num_train_examples())
    )
    training = config.training
    strategy = choose_strategy(training.strategy, training.tpu)
    is_chief = _is_chief(strategy)
    recorded = config.to_dict() | {
        "name": config.name,
        "tokenizer": {**config.to_dict()["tokenizer"], **tokenizer_settings(config)},
    }
    if is_chief:
        run.check_start(recorded)
    vocabulary = prepare_vocabulary(config, run, task, source)
    run.verify_inputs({"vocabulary": vocabulary, **task.input_files()}, record=is_chief)
    if is_chief:  # after the inputs are verified: a refused resume leaves config.json as it was
        run.record_config(recorded)
    tokenizer = wordpiece_tokenizer(vocabulary, **tokenizer_settings(config))
    model, backbone, checkpoints, position = _build(config, task, strategy, run, source, is_chief, tokenizer)
    step = checkpoints.step
    data = task.data(tokenizer, skip_batches=position)
    train_data = data.train
    batches_from = lambda skip: task.data(tokenizer, skip_batches=skip).train  # noqa: E731
    if step == 0 and config.model.residual_scaling == "admin" and source is None:
        # Admin's profiling pass on the first training batch sets the residual scalings. A
        # second iterator of one dataset shuffles differently: fit keeps the first one.
        profiling_inputs, _, _ = next(iter(batches_from(0)))
        with strategy.scope():
            backbone.initialize_admin(task.profiling_inputs(profiling_inputs))
    eval_data, eval_steps = cached_eval(data.eval, training)
    callbacks = _callbacks(task, run, checkpoints, preemption)
    multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    loop = _MultiWorkerLoop(model, strategy, train_data, eval_data) if multi_worker else None
    if step < training.train_steps:
        with strategy.scope():
            # Built here, for fit and the multi-worker loop alike, not inside the first trace of the train step:
            # a tf.function that creates variables is traced twice.
            model.optimizer.build(model.trainable_variables)
        with warnings.catch_warnings():
            # Heads a task does not train (the pooler under the masked LM) get no gradients.
            warnings.filterwarnings("ignore", message=r"Gradients do not exist for variables")
            _fit(model, loop, (train_data, batches_from), eval_data, eval_steps, callbacks, training, step, verbose)
    evaluation = {"eval_loss": loop.evaluate()} if loop else task.final_metrics(model, data, eval_data)
    metrics = {"task": config.task.name, "step": checkpoints.step, **evaluation}
    check_finite(metrics, "the final evaluation")
    # Non-chief workers of a multi-worker run write beside, never over, the chief's files.
    output = run if is_chief else runs.RunDirectory(files.join(run.path, f"worker_{strategy.cluster_resolver.task_id}"))
    output.save_models(backbone, model)
    output.write_metrics(metrics)
    return metrics


def cached_eval(eval_data, training):
    # Cached: the evaluation rows (and their masks) are the same at every evaluation.
    eval_data = eval_data.take(training.eval_batches).cache()
    eval_steps = sum(1 for _ in eval_data)
    if eval_steps == 0:
        raise ValueError(
            f"The evaluation split holds less than one batch of {training.batch_size} rows of {training.sequence_length} tokens: "
            "add data, or lower training.batch_size or training.sequence_length."
        )
    return eval_data.apply(tf.data.experimental.assert_cardinality(eval_steps)), eval_steps  # its length known to Keras


def fit_segments(step, train_steps, steps_per_epoch):
    """The `model.fit` calls that train from `step` to exactly `train_steps`.

    Keras' epoch e is steps [e * steps_per_epoch, (e + 1) * steps_per_epoch), the last one
    shorter when steps_per_epoch does not divide train_steps. A run resumed inside an epoch
    first finishes that epoch, as epoch e again, so TensorBoard's epoch numbers stay those
    of an uninterrupted run.

    Returns up to three (first step, initial_epoch, epochs, steps_per_epoch): the rest of a
    started epoch, the whole epochs, the shorter last epoch.
    """
    segments = []
    epoch, offset = divmod(step, steps_per_epoch)
    full_epochs = train_steps // steps_per_epoch
    if offset and step < train_steps:
        end = min((epoch + 1) * steps_per_epoch, train_steps)
        segments.append((step, epoch, epoch + 1, end - step))
        step, epoch = end, epoch + 1
    if epoch < full_epochs:
        segments.append((step, epoch, full_epochs, steps_per_epoch))
        step, epoch = full_epochs * steps_per_epoch, full_epochs
    if step < train_steps:
        segments.append((step, epoch, epoch + 1, train_steps - step))
    return segments


def _fit(model, loop, train_data, eval_data, eval_steps, callbacks, training, step, verbose):
    """Trains from `step` to exactly training.train_steps (`fit_segments`).

    train_data: (the training batches from `step` on, a function of a skip count giving
    them from that batch on).
    """
    batches, batches_from = train_data
    segments = fit_segments(step, training.train_steps, training.steps_per_epoch)
    if loop is not None:
        loop.fit(segments, callbacks, verbose)
        return
    for first, initial_epoch, epochs, steps in segments:
        # A new iterator of the same dataset may shuffle differently: each call reads a fresh pipeline.
        data = batches if first == step else batches_from(first)
        if first + (epochs - initial_epoch) * steps == training.train_steps:
            # Finite: an execution of steps_per_execution steps stops where the data ends.
            data = data.take(training.train_steps - first)
        # Finite, of known length: Keras keeps one iterator of the validation data across epochs and starts it
        # anew once it has read that many batches, so every evaluation reads the eval_steps cached batches once.
        # (Repeated data would make each evaluation run whole executions: 50 batches for 16, cycling.)
        model.fit(
            data,
            epochs=epochs,
            initial_epoch=initial_epoch,
            steps_per_epoch=steps,
            validation_data=eval_data,
            validation_steps=eval_steps,
            callbacks=callbacks,
            shuffle=False,
            verbose=verbose,
        )


class _MultiWorkerLoop:
    """`strategy.run` training and evaluation for MultiWorkerMirroredStrategy.

    Keras 3.15's `model.fit` and `model.evaluate` fail under MultiWorkerMirroredStrategy
    (keras-team/keras#20329). This loop does what fit does for this trainer, with the same model,
    optimizer, data, callbacks and the task's compiled loss (`model.compute_loss`). Each replica's
    loss is divided by the replica count, as Keras' losses do, so the summed gradients are those of
    the mean loss, as under MirroredStrategy's fit.
    """

    def __init__(self, model, strategy, train_data, eval_data):
        self.model, self.strategy = model, strategy
        self.train_iterator = iter(strategy.experimental_distribute_dataset(train_data))
        self.eval_data = strategy.experimental_distribute_dataset(eval_data)  # the optimizer: built by `_train`

    def _loss(self, inputs, labels, weights, training):
        outputs = self.model(inputs, training=training)
        return self.model.compute_loss(inputs, labels, outputs, weights, training=training)

    @tf.function
    def _train_step(self):
        def replica_step(inputs, labels, weights):
            with tf.GradientTape() as tape:
                loss = self._loss(inputs, labels, weights, training=True)
                # Multiplied by the loss scale under mixed_float16 (the optimizer divides it out).
                scaled_loss = self.model.optimizer.scale_loss(loss)
            gradients = tape.gradient(scaled_loss, self.model.trainable_variables)
            self.model.optimizer.apply(gradients, self.model.trainable_variables)
            return loss

        return self.strategy.reduce("SUM", self.strategy.run(replica_step, args=next(self.train_iterator)), axis=None)

    @tf.function
    def _eval_step(self, batch):
        loss = self.strategy.run(lambda i, l, w: self._loss(i, l, w, training=False), args=batch)
        return self.strategy.reduce("SUM", loss, axis=None)

    def evaluate(self):
        """The mean loss of the evaluation batches (Keras' val_loss)."""
        losses = [float(self._eval_step(batch)) for batch in self.eval_data]
        return sum(losses) / max(len(losses), 1)

    def fit(self, segments, callbacks, verbose):
        """Runs the `fit_segments` with one iterator (from the run's first step on)."""
        callbacks = keras.callbacks.CallbackList(callbacks, model=self.model)
        callbacks.on_train_begin()
        last_epoch = segments[-1][2]
        for _, initial_epoch, epochs, steps in segments:
            for epoch in range(initial_epoch, epochs):
                callbacks.on_epoch_begin(epoch)
                losses = []
                for batch in range(steps):
                    losses.append(float(self._train_step()))
                    callbacks.on_train_batch_end(batch)
                logs = {"loss": sum(losses) / len(losses), "val_loss": self.evaluate()}
                callbacks.on_epoch_end(epoch, logs)
                if verbose:
                    print(
                        f"epoch {epoch + 1}/{last_epoch}: " + ", ".join(f"{k}={v:.4f}" for k, v in logs.items()),
                        flush=True,
                    )
        callbacks.on_train_end()


def _is_chief_process():
    """`_is_chief_of` this process, as TF_CONFIG (if any) places it: known before any strategy is built."""
    cluster = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = cluster.get("task") or {}
    return _is_chief_of(task.get("type"), task.get("index"), cluster.get("cluster") or {})


def _is_chief(strategy):
    """`_is_chief_of` this process, as the strategy's cluster resolver places it."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return True
    return _is_chief_of(resolver.task_type, resolver.task_id, resolver.cluster_spec().as_dict())


def _is_chief_of(task_type, task_id, cluster):
    """Whether the process of `task_type` and `task_id` in `cluster` ({job: addresses}, empty without one) is the
    chief, the one that writes the run directory: the chief, or worker 0 of a cluster without a chief."""
    if not cluster:
        return True
    return task_type in ("chief", None) or (task_type == "worker" and task_id == 0 and "chief" not in cluster)
