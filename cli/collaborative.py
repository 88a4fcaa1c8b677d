"""`concise-collaborative`: convert a trained model's attention to collaborative attention.

    concise-collaborative --hf-dir path/to/bert --shared-key-dim 192 --out converted/
    concise-collaborative --run runs/tiny --ratio 0.5 --out converted/

Writes OUT as a run directory (`training.run.runs`): config.json (the converted architecture,
the source's task and tokenizer settings), vocab.txt, backbone.weights.h5, plus
conversion_report.json, all into a temporary folder renamed at the end: a failed or refused
conversion leaves nothing behind, and an existing OUT is kept unless --overwrite. OUT then
starts a fine-tuning run (`--set task.init=OUT`) like any run directory.

A run with a task model (a fine-tuned classifier, regressor, span labeler, or a pretraining
run) is converted head included: OUT also holds model.weights.h5 (the task model with the
converted attention, the head's weights copied) and the source's training section, so
`concise-evaluate --run OUT` measures it at once and fine-tuning it for the same task goes on
from its head (Cordonnier et al.'s fine-tune -> convert -> fine-tune again).
"""

import argparse
import dataclasses
import pathlib
import sys

from concise_attention.models.collaborative import convert_model
from concise_attention.models.transformer import head_size_of
from concise_attention.training import files
from concise_attention.training.preprocessing.text import read_vocabulary
from concise_attention.training.run import configs
from concise_attention.training.run import runs
from concise_attention.training.tasks import make_task


def _load(path):
    """The source's `artifacts.Source`, its backbone (the BERT encoder or the causal LM) and, for a run
    with a task model (a fine-tuned classifier, ...), its config and task model; weights loaded."""
    loaded = runs.load(path)
    return loaded.source, loaded.backbone, (loaded.config, loaded.task_model) if loaded.config is not None else None


def _converted_task_model(task_source, backbone, converted):
    """The source's task model rebuilt around the converted backbone, its head weights copied.

    Returns:
        (config, task model): the source's config with the converted architecture.
    """
    config, task_model = task_source
    config = dataclasses.replace(config, model=configs.MODEL_CONFIGS[config.model_type](**_arguments(converted)))
    result = make_task(config).build_model(converted)
    source_head, result_head = _head_weights(task_model, backbone), _head_weights(result, converted)
    for variable, value in zip(result_head, source_head, strict=True):
        variable.assign(value)
    return config, result


def _arguments(backbone):
    """The builder arguments of a backbone (its config without Keras' own keys)."""
    return {k: v for k, v in backbone.get_config().items() if k not in ("name", "trainable", "dtype")}


def _head_weights(model, backbone):
    """The task model's weights outside its backbone (the head), in model order."""
    inside = {id(variable) for variable in backbone.weights}
    return [variable for variable in model.weights if id(variable) not in inside]


def _write_run(directory, source, converted, reports, task=None):
    """OUT: config.json, vocab.txt, backbone.weights.h5, conversion_report.json and, for a source
    with a task model, model.weights.h5 (the converted task model) and the source's training
    section (what `concise-evaluate` evaluates with)."""
    run = runs.RunDirectory(directory)
    arguments = _arguments(converted)
    shared_key_dim = arguments["attention"]["shared_key_dim"]
    config = {
        "name": f"{pathlib.Path(source.path).name}_collaborative_k{shared_key_dim}",
        "model_type": source.model_type,
        "model": arguments,
        "task": source.task,
        "tokenizer": source.tokenizer,
        "description": f"{source.path} converted to collaborative attention (D~k={shared_key_dim})",
    }
    if task is not None and task[0].training is not None:
        config["training"] = dataclasses.asdict(task[0].training)
    files.write_json_atomically(run.file(files.CONFIG), config)
    run.write_vocabulary(read_vocabulary(source.vocabulary))
    files.save_weights(converted, run.file(files.BACKBONE_WEIGHTS))
    if task is not None:
        files.save_weights(task[1], run.file(files.MODEL_WEIGHTS))
    files.write_json_atomically(run.file("conversion_report.json"), reports)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="concise-collaborative", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--hf-dir", help="Hugging Face BERT directory (config.json + model.safetensors)")
    source.add_argument("--run", help="a run directory of this project (config.json + backbone.weights.h5)")
    rank = parser.add_mutually_exclusive_group(required=True)
    rank.add_argument("--shared-key-dim", type=int, help="D~k, the shared query/key width")
    rank.add_argument("--ratio", type=float, help="D~k as a fraction of num_heads * head_size")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=200, help="ALS iterations per layer")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    with configs.one_line_errors(parser, "concise-collaborative"):
        if out.exists() and not args.overwrite:
            raise ValueError(f"{out} exists; pass --overwrite to replace it.")
        if args.iterations < 1:
            raise ValueError(f"--iterations must be a positive integer. Received: --iterations={args.iterations}")
        source, model, task_source = _load(args.hf_dir or args.run)
        head_size = head_size_of(model)
        full = model.num_heads * head_size
        shared_key_dim = args.shared_key_dim if args.shared_key_dim is not None else round(args.ratio * full)
        converted, reports = convert_model(model, shared_key_dim, seed=args.seed, n_iter_max=args.iterations)
        task = None if task_source is None else _converted_task_model(task_source, model, converted)
    with files.staged_folder(out) as staging:
        _write_run(staging, source, converted, reports, task)
    for report in reports:
        print(
            f"{report['layer']}: D~k={report['shared_key_dim']} relative error {report['relative_error']:.4f}, "
            f"query/key parameters {report['query_key_parameters_before']:,} -> {report['query_key_parameters_after']:,}, "
            f"FLOPs at length {report['flops_length']} {report['query_key_flops_before']:,} -> {report['query_key_flops_after']:,}, "
            f"{report['seconds']:.1f} s"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
