"""`concise-evaluate`: the task metrics of a finished run directory, without training.

    concise-evaluate --run runs/topics
    concise-evaluate --run converted/ --output converted_metrics.json
    concise-evaluate --run runs/mine --data-dir ~/data/mine

Evaluates RUN/model.weights.h5 (the task model of a finished run, or of a `concise-collaborative`
conversion of one) on its task's evaluation split with the run's own settings (sequence length,
batch size, evaluation batches), exactly as the trainer's final evaluation does, and prints the
metrics as JSON (--output also writes them to a file). The run directory is only read. A run records
`task.data_dir` as it was given: a relative folder is found from where the run started, and `--data-dir`
names it from here (or another copy of the same data).
"""

import argparse
import dataclasses
import json
import os
import pathlib
import sys

from concise_attention.training import files
from concise_attention.training.backends.trainer import cached_eval
from concise_attention.training.preprocessing.tokenizer import tokenizer_settings
from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer
from concise_attention.training.run import configs
from concise_attention.training.run import runs
from concise_attention.training.tasks import make_task


def evaluate_run(path, data_dir=None):
    """The metrics of the task model saved in run directory `path` (a dict: the task's name and
    its evaluation, e.g. eval_loss, eval_accuracy, majority_class_accuracy); `data_dir` (a list of folders, one for
    most tasks) replaces the run's `task.data_dir`."""
    config = _with_data_dir(runs.read_run_config(path), path, data_dir)
    _check_data_dir(config, path, data_dir is not None)  # before the weights load
    _, model, _, vocabulary = runs.load_model(path)
    if config.training is None:
        raise ValueError(f"{files.join(path, files.CONFIG)} has no `training` section: it does not say how to evaluate "
                         "(sequence length, batch size).")
    task = make_task(config)
    task.check()
    task.load_data()
    model.compile(jit_compile=config.training.jit_compile, **task.compile_arguments())
    _, eval_data = task.datasets(wordpiece_tokenizer(vocabulary, **tokenizer_settings(config)), skip_batches=0)
    eval_data, eval_steps = cached_eval(eval_data, config.training)
    return {"task": config.task.name, **task.evaluate(model, eval_data, eval_steps)}


def _with_data_dir(config, path, data_dir):
    """`config` reading its data from `data_dir` (the --data-dir folders, a list) instead, as many as it recorded;
    `config` itself without them."""
    if data_dir is None:
        return config
    recorded = getattr(config.task, "data_dir", None)
    if recorded is None:
        raise ValueError(f"--data-dir {' '.join(data_dir)}: the run in {path!r} (task {config.task.name!r}, task.dataset="
                         f"{getattr(config.task, 'dataset', None)!r}) reads no data folder.")
    folders = recorded if isinstance(recorded, list) else [recorded]
    if len(data_dir) != len(folders):
        raise ValueError(f"--data-dir {' '.join(data_dir)}: the run in {path!r} read task.data_dir={recorded!r}; give as many folders.")
    return dataclasses.replace(config, task=dataclasses.replace(config.task, data_dir=data_dir if isinstance(recorded, list) else data_dir[0]))


def _check_data_dir(config, path, given):
    """Each relative folder of task.data_dir exists from here (where a run started elsewhere does not find it); else one
    line says where it was looked for. Absolute, ~ and gs:// folders, and the shipped `sample`, are left to the task."""
    folders = getattr(config.task, "data_dir", None)
    if getattr(config.task, "dataset", None) == "sample":
        return
    for folder in folders if isinstance(folders, list) else [folders]:
        if folder is not None and not os.path.isabs(os.path.expanduser(folder)) and "://" not in folder and not os.path.isdir(folder):
            where = "--data-dir" if given else f"the task.data_dir the run in {path!r} recorded (give --data-dir: where it is from here)"
            raise ValueError(f"{where}: no folder {folder!r} under {os.getcwd()!r}.")


def _check_output(output):
    """--output must be a file in an existing folder (local paths; gs:// is checked when written)."""
    if output is None or "://" in output:
        return
    path = pathlib.Path(output)
    if path.is_dir():
        raise ValueError(f"--output {output!r} is a directory: give a file name, e.g. {path / 'metrics.json'}")
    if not path.parent.is_dir():
        raise ValueError(f"--output {output!r}: its folder {str(path.parent)!r} does not exist (it is not created)")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="concise-evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a finished run directory, or a concise-collaborative output of one")
    parser.add_argument("--output", help="also write the metrics to this JSON file")
    parser.add_argument("--data-dir", nargs="+", help="the run's data folder(s) as seen from here, replacing the task.data_dir it "
                        "recorded (which may be relative to where it started)")
    args = parser.parse_args(argv)
    with configs.one_line_errors(parser, "concise-evaluate"):
        _check_output(args.output)  # before the evaluation: a bad --output must not cost one
        metrics = evaluate_run(args.run, args.data_dir)
        if args.output:
            files.write_json_atomically(args.output, metrics)
    print(json.dumps(metrics, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
