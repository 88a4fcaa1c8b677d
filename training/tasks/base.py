"""The task interface: settings every task has, the methods the trainer calls and the order it calls them in.

The protocol (the trainer, `concise-evaluate` and `concise-prepare-data` follow it; `Task.read` and `Task.data` keep
its order): `check` (settings alone, before anything is read) -> `read` (`load_data`, once) -> `data(tokenizer,
skip_batches)` (`datasets`: a `TaskData`) -> `build_model`, `compile_arguments`, `initialize` -> training ->
`evaluate(model, final)`, where `final` is `TaskData.final`, or the held-out batches the run kept when that is None.
"""

import dataclasses
import typing


@dataclasses.dataclass(frozen=True)
class TaskSettings:
    """Fields every task has: its registry name and the trained model it starts from.

    init: a run directory of this project (pretraining, fine-tuning or a `concise-collaborative`
        output) or a Hugging Face BERT folder; its backbone weights, vocabulary and tokenizer
        settings start the run (its architecture fills a missing model section), and its whole task
        model too when trained for the same task and labels. Ignored once the run has a checkpoint.
    """

    name: str
    init: typing.Optional[str] = None


@dataclasses.dataclass(frozen=True)
class ServingSignature:
    """A task model's TF Serving `serving_default`: string inputs named `texts` (one text segment
    each, e.g. ("text", "text_b")), tokenised and packed as in training, then
    `outputs(encoder_inputs)` -> a dict of output tensors (traced into the served graph)."""

    texts: tuple
    outputs: typing.Callable


class TaskData(typing.NamedTuple):
    """What `Task.datasets` returns. train: the training batches from `skip_batches` on, repeated, of static shapes
    ((inputs, labels, weights)); eval: held-out batches for the per-epoch val_loss (the trainer keeps
    `training.eval_batches` of them); final: what `Task.evaluate` reads (None: those kept batches)."""

    train: typing.Any
    eval: typing.Any
    final: typing.Any = None


class Task:
    """The interface the trainer calls, in the module docstring's order. Subclasses set `name`, `Config`,
    `backbone_type`."""

    name = None
    Config = TaskSettings
    backbone_type = "bert"  # the config's model_type this task trains
    reports_perplexity = False  # the epoch logs add the perplexity of val_loss

    def __init__(self, config):
        self.config, self.settings, self.training = config, config.task, config.training

    def check(self):
        """Fails fast (before data is read or a model built) on settings that cannot work."""
        if self.config.model_type != self.backbone_type:
            raise ValueError(
                f"Task {self.name!r} trains {self.backbone_type} models. Received: model_type={self.config.model_type!r} ({self.config.name})"
            )

    def check_start(self):
        """Fails fast on what only a new run reads (the sources of its starting weights): the trainer calls it before
        anything is written for a run without progress; a resumed run, an evaluation or data preparation does not.
        This default: nothing."""

    def vocabulary_text(self):
        """Lines to learn a vocabulary from when neither the config nor `init` gives one."""
        raise ValueError(f"Task {self.name!r} needs a vocabulary: set task.init or tokenizer.vocabulary.")

    def input_files(self):
        """{name: path} of data files a resumed run must find unchanged (verified by sha256 against the
        run's inputs.json); this default: none beyond the vocabulary, which the trainer checks."""
        return {}

    def vocabulary_file(self):
        """The vocabulary the task's data must be read with (e.g. a teacher's), or None (this default):
        the config's, task.init's, or one trained on `vocabulary_text`."""
        return None

    def initialize(self, model, backbone, tokenizer, started=None):
        """Sets the starting weights of a new run (`tokenizer`: the run's). started: what task.init gave, "model" (head
        included), "backbone" or None. This default keeps the seeded random initialisation or task.init's
        weights; the distill task starts a student from its teacher, or fits its projection to a trained one."""

    def read(self):
        """`load_data`, the first time only: what `num_train_examples`, `vocabulary_text` and `datasets` read."""
        if not getattr(self, "_read", False):
            self.load_data()
            self._read = True

    def data(self, tokenizer, skip_batches=0):
        """The task's `TaskData` (`datasets`, after `read`); a task whose datasets gives (train, eval) has no final
        data of its own."""
        self.read()
        return TaskData(*self.datasets(tokenizer, skip_batches))

    def final_metrics(self, model, data, kept_eval):
        """`evaluate` on `data.final`, or on `kept_eval` (the held-out batches the run kept) when it is None."""
        return self.evaluate(model, kept_eval if data.final is None else data.final)

    def load_data(self):
        """Reads the task's examples (checked at once). Called by `read`."""

    def num_train_examples(self):
        return None

    def build_model(self, backbone):
        raise NotImplementedError

    def compile_arguments(self):
        """loss, metrics (and weighted_metrics) for `model.compile`."""
        raise NotImplementedError

    def datasets(self, tokenizer, skip_batches):
        """A `TaskData` (or (train, eval)): tf.data datasets of (inputs, labels, weights), static shapes. Called by `data`."""
        raise NotImplementedError

    def evaluate(self, model, final):
        """The final metrics of the run (a dict of floats), computed from `final` (see `TaskData`)."""
        raise NotImplementedError

    def serving_signature(self, model):
        """What the exported TF Serving model of the trained task `model` serves: a
        `ServingSignature`, or None (this default) when the task has no serving model of its own
        and the exporter serves the encoder's embeddings instead."""
        return None

    def profiling_inputs(self, batch_inputs):
        """The backbone inputs of a training batch (Admin's profiling pass)."""
        return {name: batch_inputs[name] for name in ("input_word_ids", "input_mask", "input_type_ids")}
