"""`concise-evaluate`: the task metrics of a finished run directory, without training.

    concise-evaluate --run runs/topics
    concise-evaluate --run converted/ --output converted_metrics.json

Evaluates RUN/model.weights.h5 (the task model of a finished run, or of a `concise-collaborative`
conversion of one) on its task's evaluation split with the run's own settings (sequence length,
batch size, evaluation batches), exactly as the trainer's final evaluation does, and prints the
metrics as JSON (--output also writes them to a file). The run directory is only read.
"""

import argparse
import json
import pathlib
import sys

from concise_attention.training import files
from concise_attention.training.backends.trainer import cached_eval
from concise_attention.training.preprocessing.tokenizer import tokenizer_settings
from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer
from concise_attention.training.run import configs
from concise_attention.training.run import runs
from concise_attention.training.tasks import make_task


def evaluate_run(path):
    """The metrics of the task model saved in run directory `path` (a dict: the task's name and
    its evaluation, e.g. eval_loss, eval_accuracy, majority_class_accuracy)."""
    config, model, _, vocabulary = runs.load_model(path)
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
    args = parser.parse_args(argv)
    with configs.one_line_errors(parser, "concise-evaluate"):
        _check_output(args.output)  # before the evaluation: a bad --output must not cost one
        metrics = evaluate_run(args.run)
        if args.output:
            files.write_json_atomically(args.output, metrics)
    print(json.dumps(metrics, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
