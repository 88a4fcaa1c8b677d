"""What a distillation run's batches hold at given steps: their padded length, mean real length and the teacher's
in-batch cosine similarity (the in-batch similarity term's target), batch by batch as the trainer reads them.

    python benchmarks/batch_stats.py --config distill_mpnet_d384_fixed --set task.cache_dir=PREPARED --steps 1000 3850 --count 60

Each window starts at batch `step` (`task.data(tokenizer, skip_batches=step)`, the trainer's resume position) and is
summarised on one line per window. Reads the cached teacher outputs; computes nothing new.
"""

import argparse

import numpy as np

from concise_attention.training.run import configs
from concise_attention.training.tasks import make_task


def window(task, step, count):
    """(padded lengths, mean real lengths, mean off-diagonal teacher cosines) of `count` batches from `step`."""
    batches = iter(task.data(task.tokenizer, skip_batches=step).train)
    padded, real, cosines = [], [], []
    for _ in range(count):
        inputs, targets, _ = next(batches)
        mask, unit = inputs["input_mask"].numpy(), targets["teacher_space"].numpy()
        similarity = unit @ unit.T
        padded.append(mask.shape[1])
        real.append(mask.sum(1).mean())
        cosines.append(similarity[~np.eye(len(unit), dtype=bool)].mean())
    return np.array(padded), np.array(real), np.array(cosines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, nargs="+", required=True)
    parser.add_argument("--count", type=int, default=60)
    args = parser.parse_args(argv)
    task = make_task(configs.load_config(args.config, args.overrides))
    task.check()
    task.read()
    for step in args.steps:
        padded, real, cosines = window(task, step, args.count)
        print(
            f"steps {step}-{step + args.count - 1}: padded {padded.min()}-{padded.max()} tokens, mean real length "
            f"{real.mean():.1f}, teacher's mean in-batch cosine median {np.median(cosines):.3f}, max {cosines.max():.3f}"
        )


if __name__ == "__main__":
    main()
