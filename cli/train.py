"""`concise-train` (also installed as `concise-train-lm`): train or resume any task's model from a preset or YAML config."""

import argparse
import json
import os
import sys

from concise_attention.training.trainers.trainer import train
from concise_attention.training.run import configs
from concise_attention.training.run.checkpoints import PREEMPTED_EXIT_CODE
from concise_attention.training.run.checkpoints import Preempted


def main(argv=None):
    name = (
        os.path.basename(sys.argv[0]) if os.path.basename(sys.argv[0]).startswith("concise-train") else "concise-train"
    )
    parser = argparse.ArgumentParser(
        prog=name,
        description="Train (or resume) a model for any task (language models, BERT, fine-tuning, distillation): "
        "tf.distribute, resumable checkpoints, TensorBoard.",
        epilog=f"Example: {name} --config tiny_lm --run-dir runs/tiny --set training.train_steps=200",
    )
    configs.add_config_arguments(parser)
    parser.add_argument(
        "--run-dir", required=True, help="run directory: config.json, vocab, checkpoints, logs (resumed if present)"
    )
    parser.add_argument("--strategy", choices=configs.STRATEGIES, help="overrides training.strategy")
    parser.add_argument("--tpu", help="TPU name or address (with --strategy tpu); overrides training.tpu")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    overrides = list(args.set)
    if args.strategy:
        overrides.append(f"training.strategy={args.strategy}")
    if args.tpu:
        overrides.append(f"training.tpu={args.tpu}")
    try:
        with configs.one_line_errors(parser, name):
            config = configs.load_config(args.config, overrides)
            metrics = train(config, args.run_dir, verbose=0 if args.quiet else "auto")
    except Preempted as preempted:
        parser.exit(PREEMPTED_EXIT_CODE, f"{name}: {preempted}\n")
    print(json.dumps(metrics, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
