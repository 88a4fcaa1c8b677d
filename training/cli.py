"""`concise-train-lm`: train a causal language model from a preset or YAML config."""

import argparse
import json
import sys

import configs


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="concise-train-lm",
        description="Train (or resume) a causal language model: tf.distribute, resumable checkpoints, TensorBoard.",
        epilog="Example: concise-train-lm --config tiny_lm --run-dir runs/tiny --set training.train_steps=200",
    )
    configs.add_config_arguments(parser)
    parser.add_argument("--run-dir", required=True, help="run directory: config.json, vocab, checkpoints, logs (resumed if present)")
    parser.add_argument("--strategy", choices=configs.STRATEGIES, help="overrides training.strategy")
    parser.add_argument("--tpu", help="TPU name or address (with --strategy tpu); overrides training.tpu")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    overrides = list(args.set)
    if args.strategy:
        overrides.append(f"training.strategy={args.strategy}")
    if args.tpu:
        overrides.append(f"training.tpu={args.tpu}")
    from training.checkpoints import PREEMPTED_EXIT_CODE
    from training.checkpoints import Preempted

    try:
        config = configs.load_config(args.config, overrides)
        from training.trainer import train

        metrics = train(config, args.run_dir, verbose=0 if args.quiet else "auto")
    except ValueError as error:
        parser.exit(2, f"concise-train-lm: error: {error}\n")
    except Preempted as preempted:
        parser.exit(PREEMPTED_EXIT_CODE, f"concise-train-lm: {preempted}\n")
    print(json.dumps(metrics, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
