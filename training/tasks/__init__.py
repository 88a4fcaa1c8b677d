"""Tasks: what an objective needs, in one object each, listed in one explicit registry.

A task owns its settings (the config's `task:` section: a frozen dataclass of its own), the
head it puts around the backbone, its datasets, loss, metrics, final evaluation and what its
exported TF Serving model serves (`serving_signature`). The
trainer knows no task by name: it calls `make_task(config)` and the methods of `Task`.
A new task is one class plus one call (see tests/test_extension_points.py):

    @dataclasses.dataclass(frozen=True)
    class MySettings(TaskSettings):
        my_field: int = 3

    class MyTask(Task):
        name, Config, backbone_type = "my_task", MySettings, "bert"
        ...

    register_task(MyTask)      # then `task: {name: my_task, my_field: 4}` in a config

Built-in: `causal_lm` (next-token prediction on packed rows), `masked_lm` (BERT's masked
LM), `classification` (a sentence or a pair -> N classes: GLUE), `regression` (a pair ->
a score: STS-B), `span_qa` (SQuAD v1.1) and `distill` (a teacher's sentence embeddings).
"""

import dataclasses
import importlib

from concise_attention.training.tasks.base import ServingSignature
from concise_attention.training.tasks.base import Task
from concise_attention.training.tasks.base import TaskData
from concise_attention.training.tasks.base import TaskSettings

# Built-in tasks by module: a task's module is imported when the task is first named, so a
# process without TensorFlow (the JAX shard trainer) reads a causal_lm config.
BUILT_IN = {
    "causal_lm": "concise_attention.training.tasks.language_model:CausalLMTask",
    "masked_lm": "concise_attention.training.tasks.language_model:MaskedLMTask",
    "classification": "concise_attention.training.tasks.sentence:ClassificationTask",
    "regression": "concise_attention.training.tasks.sentence:RegressionTask",
    "span_qa": "concise_attention.training.tasks.span_qa:SpanQATask",
    "distill": "concise_attention.training.tasks.distill:DistillTask",
}
# The task classes looked up or registered so far, by name.
TASKS = {}


def task_names():
    return sorted(set(BUILT_IN) | set(TASKS))


def task_class(name):
    """The task class registered under `name` (a built-in one is imported now)."""
    if name not in TASKS:
        if name not in BUILT_IN:
            raise ValueError(f"`task.name` must be one of {task_names()}. Received: task.name={name!r}")
        module, attribute = BUILT_IN[name].split(":")
        TASKS[name] = getattr(importlib.import_module(module), attribute)
    return TASKS[name]


def register_task(task_class):
    """Adds a task class to the registry under `task_class.name`."""
    if not (isinstance(task_class, type) and issubclass(task_class, Task)) or not task_class.name:
        raise ValueError(f"A task must be a Task subclass with a `name`. Received: {task_class!r}")
    if not (dataclasses.is_dataclass(task_class.Config) and issubclass(task_class.Config, TaskSettings)):
        raise ValueError(f"{task_class.__name__}.Config must be a dataclass deriving from TaskSettings.")
    TASKS[task_class.name] = task_class
    return task_class


def make_task(config):
    """The task object of a resolved `ExperimentConfig`."""
    return task_class(config.task.name)(config)


def default_task_name(model_type):
    """The task of a config without a `task:` section: the backbone's pretraining objective."""
    return {"causal_lm": "causal_lm", "bert": "masked_lm"}[model_type]


__all__ = [
    "BUILT_IN",
    "TASKS",
    "ServingSignature",
    "Task",
    "TaskData",
    "TaskSettings",
    "default_task_name",
    "make_task",
    "register_task",
    "task_class",
    "task_names",
]
