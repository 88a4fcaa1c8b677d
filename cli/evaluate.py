"""`concise-evaluate`: sentence encoders scored with MTEB's protocols, or the task metrics of a finished run.

    concise-evaluate --encoder concise-minilm-d192 --teacher TEACHER_DIR --fit-texts CORPUS
    concise-evaluate --encoder my_export runs/student --tasks STSBenchmark --output scores.json
    concise-evaluate --run runs/topics
    concise-evaluate --run runs/mine --data-dir ~/data/mine

--encoder: each encoder (a shipped preset, a Keras preset folder, a run directory, a Hugging Face folder, or a
`concise-export` folder, whose TF Serving model is used as served) is scored on MTEB's STSBenchmark (test
Spearman of cosine similarities) and Banking77Classification (mean accuracy of 10 logistic regressions on 8
training texts per label, seed 42), exactly as the `mteb` package scores them (`training.inference.mteb_protocol`;
the data ships with the package). With --teacher, the baselines a user already has are scored beside them: the
teacher, its PCA projection to each narrower encoder's width (fitted on --fit-texts: a text corpus folder, never on
an evaluation text) and the teacher with every other layer dropped. Prints a Markdown table; --output writes JSON.
--split dev scores the selection protocol instead (STSBenchmark's dev split; Banking77's experiments drawn from its
train split, scored on the train texts none draws): for choices such as a checkpoint or an interpolation weight,
which the test splits must not make.

--run:
evaluates RUN/model.weights.h5 (the task model of a finished run, or of a `concise-collaborative`
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
from concise_attention.training.trainers.trainer import cached_eval
from concise_attention.training.data.pipeline import corpus_splits
from concise_attention.training.inference import encoders
from concise_attention.training.inference import mteb_protocol
from concise_attention.training.preprocessing.tokenizer import tokenizer_settings
from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer
from concise_attention.training.run import configs
from concise_attention.training.run import runs
from concise_attention.training.tasks import make_task
from concise_attention.training.tasks.distill import draw_texts

FIT_COUNT = 20_000  # texts the teacher's PCA baseline is fitted on


def evaluate_run(path, data_dir=None):
    """The metrics of the task model saved in run directory `path` (a dict: the task's name and
    its evaluation, e.g. eval_loss, eval_accuracy, majority_class_accuracy); `data_dir` (a list of folders, one for
    most tasks) replaces the run's `task.data_dir`."""
    config = _with_data_dir(runs.read_run_config(path), path, data_dir)
    _check_data_dir(config, path, data_dir is not None)  # before the weights load
    if not runs.RunDirectory(path).has(files.MODEL_WEIGHTS):
        raise ValueError(f"{path} has no {files.MODEL_WEIGHTS}: no task model to evaluate.")
    loaded = runs.load(path, kind="run")
    model, vocabulary = loaded.task_model, loaded.source.vocabulary
    if config.training is None:
        raise ValueError(
            f"{files.join(path, files.CONFIG)} has no `training` section: it does not say how to evaluate "
            "(sequence length, batch size)."
        )
    task = make_task(config)
    task.check()
    task.read()
    model.compile(jit_compile=config.training.jit_compile, **task.compile_arguments())
    data = task.data(wordpiece_tokenizer(vocabulary, **tokenizer_settings(config)))
    return {"task": config.task.name, **task.final_metrics(model, data, cached_eval(data.eval, config.training)[0])}


def _with_data_dir(config, path, data_dir):
    """`config` reading its data from `data_dir` (the --data-dir folders, a list) instead, as many as it recorded;
    `config` itself without them."""
    if data_dir is None:
        return config
    recorded = getattr(config.task, "data_dir", None)
    if recorded is None:
        raise ValueError(
            f"--data-dir {' '.join(data_dir)}: the run in {path!r} (task {config.task.name!r}, task.dataset="
            f"{getattr(config.task, 'dataset', None)!r}) reads no data folder."
        )
    folders = recorded if isinstance(recorded, list) else [recorded]
    if len(data_dir) != len(folders):
        raise ValueError(
            f"--data-dir {' '.join(data_dir)}: the run in {path!r} read task.data_dir={recorded!r}; give as many folders."
        )
    return dataclasses.replace(
        config, task=dataclasses.replace(config.task, data_dir=data_dir if isinstance(recorded, list) else data_dir[0])
    )


def _check_data_dir(config, path, given):
    """Each relative folder of task.data_dir exists from here (where a run started elsewhere does not find it); else one
    line says where it was looked for. Absolute, ~ and gs:// folders, and the shipped `sample`, are left to the task."""
    folders = getattr(config.task, "data_dir", None)
    if getattr(config.task, "dataset", None) == "sample":
        return
    for folder in folders if isinstance(folders, list) else [folders]:
        if (
            folder is not None
            and not os.path.isabs(os.path.expanduser(folder))
            and "://" not in folder
            and not os.path.isdir(folder)
        ):
            where = (
                "--data-dir"
                if given
                else f"the task.data_dir the run in {path!r} recorded (give --data-dir: where it is from here)"
            )
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


def evaluate_encoders(
    specs,
    teacher=None,
    fit_texts=None,
    fit_count=FIT_COUNT,
    tasks=mteb_protocol.TASKS,
    pca_widths=(),
    sequence_length=None,
    report=print,
    split="test",
):
    """MTEB-protocol scores of the encoders named by `specs`: {"tasks", "rows": {encoder name: {width,
    each task's score, mean}}, "teacher"}. With `teacher`, also the teacher, its PCA (centred and not)
    to each narrower width and each of `pca_widths` (fitted on `fit_count` texts of the corpus folder
    `fit_texts`) and the teacher with half its layers. `sequence_length`: where every loaded encoder
    cuts texts (None: its own default). `split`: "test", or "dev" for choices, never a reported score.
    """
    mteb_protocol.check_tasks(tasks)  # before any encoder loads
    loaded = [encoders.load_encoder(spec, sequence_length) for spec in specs]
    if teacher is None:
        return {
            "tasks": list(tasks),
            "rows": mteb_protocol.score_rows(loaded, tasks, report=report, split=split),
            "teacher": None,
        }
    teacher_encoder = encoders.load_encoder(teacher, sequence_length)
    widths = sorted(
        {encoder.width for encoder in loaded if encoder.width < teacher_encoder.width} | set(pca_widths), reverse=True
    )
    baselines = [teacher_encoder]
    if widths:
        texts = draw_fit_texts(fit_texts, fit_count)
        for width in widths:
            pca = encoders.TeacherPca(teacher_encoder, texts, width)
            baselines += [pca, pca.uncentred()]
    baselines.append(encoders.half_layers(teacher, sequence_length))
    rows = mteb_protocol.score_rows(baselines + loaded, tasks, report=report, split=split)
    return {"tasks": list(tasks), "rows": rows, "teacher": teacher_encoder.name}


def draw_fit_texts(folder, count):
    """`count` texts drawn from the training split of the corpus `folder`, less any evaluation text."""
    train_lines, _ = corpus_splits("text_files", folder, field="--fit-texts")
    return draw_texts(train_lines(), count, 0.5, seed=1, excluded=mteb_protocol.excluded_hashes())


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="concise-evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--encoder", nargs="+", help="sentence encoders to score with MTEB's protocols (names or folders)"
    )
    what.add_argument("--run", help="a finished run directory, or a concise-collaborative output of one")
    parser.add_argument("--output", help="also write the scores or metrics to this JSON file")
    parser.add_argument("--teacher", help="with --encoder: score the teacher and its baselines beside them")
    parser.add_argument(
        "--fit-texts",
        help="with --teacher: the texts the teacher's PCA is fitted on (a folder of .txt files or one .txt file)",
    )
    parser.add_argument(
        "--pca-width", type=int, nargs="+", default=[], help="with --teacher: more widths of its PCA baseline"
    )
    parser.add_argument(
        "--fit-count", type=int, default=FIT_COUNT, help=f"texts the PCA is fitted on (default {FIT_COUNT})"
    )
    parser.add_argument(
        "--sequence-length",
        type=int,
        help="with --encoder: the cut every encoder reads texts at (default: "
        "each its own: a preset's serving length, a run's training length)",
    )
    parser.add_argument(
        "--tasks", nargs="+", default=list(mteb_protocol.TASKS), help="default: " + " ".join(mteb_protocol.TASKS)
    )
    parser.add_argument(
        "--split",
        choices=mteb_protocol.SPLITS,
        default="test",
        help="with --encoder: test (MTEB's scores), or dev: the selection protocol (STSBenchmark's dev split, "
        "Banking77's train texts no experiment draws), for choices the test sets must not make",
    )
    parser.add_argument(
        "--data-dir",
        nargs="+",
        help="with --run: the run's data folder(s) as seen from here, replacing the "
        "task.data_dir it recorded (which may be relative to where it started)",
    )
    args = parser.parse_args(argv)
    with configs.one_line_errors(parser, "concise-evaluate"):
        _check_output(args.output)  # before the evaluation: a bad --output must not cost one
        _check_flags(args)
        if args.encoder:
            result = evaluate_encoders(
                args.encoder,
                args.teacher,
                args.fit_texts,
                args.fit_count,
                args.tasks,
                args.pca_width,
                args.sequence_length,
                report=lambda line: print(line, file=sys.stderr, flush=True),
                split=args.split,
            )
        else:
            result = evaluate_run(args.run, args.data_dir)
        if args.output:
            files.write_json_atomically(args.output, result)
    print(
        mteb_protocol.table(result["rows"], result["tasks"], result["teacher"])
        if args.encoder
        else json.dumps(result, indent=1)
    )
    return 0


def _check_flags(args):
    if args.run and (args.teacher or args.fit_texts):
        raise ValueError("--teacher and --fit-texts go with --encoder, not --run")
    if args.teacher and not args.fit_texts:
        raise ValueError("--teacher needs --fit-texts: the text corpus folder its PCA baselines are fitted on")
    if args.run and args.split != "test":
        raise ValueError("--split goes with --encoder; --run evaluates the run's own task")
    if args.encoder and args.data_dir:
        raise ValueError("--data-dir goes with --run; --encoder reads the package's MTEB data")
    if args.fit_count < 1:
        raise ValueError(f"--fit-count must be a positive integer. Received: {args.fit_count}")
    for width in args.pca_width:
        if width < 1:
            raise ValueError(f"--pca-width must be positive integers. Received: {width}")


if __name__ == "__main__":
    sys.exit(main())
