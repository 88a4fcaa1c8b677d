"""Deep single-head vs shallow multi-head LMs on the shipped corpus, with and without Admin.

Liu et al. (2021) rebuild an L-layer, h-head transformer as an h*L-layer single-head one
and need Admin (Liu et al., 2020) to train it. This script trains, on the same data and
seed, the shallow multi-head baseline and the deep single-head model with and without
Admin (post-LN everywhere), and writes the loss curves as JSON and a PNG.

    python benchmarks/admin_study.py                       # 6x8 heads vs 48x1 head, width 128
    python benchmarks/admin_study.py --steps 600 --learning-rate 2e-3
"""

import argparse
import os
import platform
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from concise_attention.training.trainers.lm import fit_language_model  # noqa: E402
from concise_attention.training.data.packing import pack_sentences  # noqa: E402
from concise_attention.training.data.packing import read_lines  # noqa: E402
from concise_attention.training.files import write_json_atomically  # noqa: E402
from concise_attention.training.preprocessing.tokenizer import train_wordpiece  # noqa: E402
from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer  # noqa: E402
from concise_attention.training.run import configs  # noqa: E402

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def _fit(args, preset, overrides, packed, label):
    """Trains `preset` with `overrides` for the study's steps: its loss curve, size and time."""
    keras.utils.set_random_seed(args.seed)
    config = configs.load_config(preset, overrides)
    model = config.build_model()
    if config.model.residual_scaling == "admin":
        model.initialize_admin({name: value[: args.batch_size] for name, value in packed.items()})
    start = time.perf_counter()
    losses = fit_language_model(
        model,
        packed,
        args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        warmup_steps=args.warmup_steps,
        seed=args.seed,
        jit_compile=False,
    )
    curve = {
        "preset": preset,
        "overrides": overrides,
        "parameters": model.count_params(),
        "seconds": time.perf_counter() - start,
        "loss": losses,
    }
    print(
        f"{label:36s} params={model.count_params():,} loss {losses[0]:.3f} -> {losses[-1]:.3f} "
        f"({curve['seconds']:.0f} s)",
        flush=True,
    )
    return curve


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--warmup-steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    lines = read_lines()
    vocabulary = train_wordpiece(lines, 2000, os.path.join(RESULTS, "cache", "sample_corpus_vocab.txt"))
    tokenizer = wordpiece_tokenizer(vocabulary)
    packed = pack_sentences([np.asarray(ids).tolist() for ids in tokenizer(lines)], args.sequence_length)
    head_size = args.width // 8
    common = [
        f"model.vocab_size={tokenizer.vocabulary_size()}",
        f"model.hidden_size={args.width}",
        f"model.max_sequence_length={args.sequence_length}",
        "model.dropout=0",
        "model.attention_dropout=0",
    ]
    runs = {
        "shallow 6 layers x 8 heads": ("lm1b_shallow_multi_head", [f"model.intermediate_size={4 * args.width}"]),
        "deep 48 layers x 1 head, no Admin": (
            "lm1b_deep_single_head",
            [f"model.attention.head_size={head_size}", f"model.intermediate_size={args.width // 2}"],
        ),
        "deep 48 layers x 1 head, Admin": (
            "lm1b_deep_single_head_admin",
            [f"model.attention.head_size={head_size}", f"model.intermediate_size={args.width // 2}"],
        ),
    }
    curves = {
        label: _fit(args, preset, common + overrides, packed, label) for label, (preset, overrides) in runs.items()
    }

    record = {
        "args": vars(args),
        "date": time.strftime("%Y-%m-%d"),
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "corpus": "training/data/python_reference.txt",
        "tokens": int((packed["segment_ids"] > 0).sum()),
        "steps_per_point": 10,
        "curves": curves,
    }
    os.makedirs(RESULTS, exist_ok=True)
    write_json_atomically(os.path.join(RESULTS, "admin_study.json"), record)
    _plot(record, os.path.join(RESULTS, "admin_study.png"))


def _plot(record, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2))
    for label, curve in record["curves"].items():
        steps = np.arange(1, len(curve["loss"]) + 1) * record["steps_per_point"]
        axes.plot(steps, curve["loss"], label=f"{label} ({curve['parameters'] / 1e6:.2f}M)")
    axes.set_xlabel("training step")
    axes.set_ylabel("training loss (nats / token)")
    axes.set_title(
        f"Deep single-head vs shallow multi-head, shipped corpus\n"
        f"{record['cpu_count']}-core CPU, {record['date']}, lr {record['args']['learning_rate']}",
        fontsize=10,
    )
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    temporary = path + ".tmp.png"
    figure.savefig(temporary, dpi=110)
    os.replace(temporary, path)


if __name__ == "__main__":
    main()
