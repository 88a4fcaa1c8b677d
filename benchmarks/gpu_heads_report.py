"""The LM1B-shape heads study run on a GPU (scripts/gpu_heads_study.sh): its table, CSV and plot.

    python benchmarks/gpu_heads_report.py                      # benchmarks/results/gpu_heads/
    python benchmarks/gpu_heads_report.py --results DIR        # another collected study

DIR holds what the GPU run gave back: study.json (`gpu_heads_study.sh collect`: each run's config
and epoch logs, the held-out loss every `steps_per_epoch` steps), device.txt (the machine),
prepared_manifest.json (the shards' manifest: tokens per row, subwords per word) and provenance.json
(the commit the runs trained from). The runs trained at once on one GPU under a common time cap, so
they reached different steps; the table compares
them at the last step all reached (equal data and schedule) and at each run's own last step.
Writes DIR/gpu_heads_study.csv (one row per run and evaluation) and DIR/gpu_heads_study.png.
"""

import argparse
import csv
import json
import math
import pathlib

from concise_attention.training.run import configs

RESULTS = pathlib.Path(__file__).parent / "results" / "gpu_heads"


def parameters(preset):
    """Parameters of a preset's model (the study's overrides change training settings only)."""
    return configs.count_parameters(configs.load_config(preset))


def rows(study, manifest):
    """(run, parameters, step, tokens, subword perplexity, word perplexity) of every evaluation."""
    train = manifest["splits"]["train"]
    tokens_per_row = train["tokens"] / train["rows"]  # real tokens in a packed row (the rest is padding)
    table = []
    for name, run in sorted(study.items()):
        history = run.get("history") or run["metrics"]["history"]
        count = parameters(run["config"]["name"])
        for epoch in history:
            tokens = epoch["step"] * run["config"]["training"]["batch_size"] * tokens_per_row
            table.append(
                {
                    "run": name,
                    "parameters": count,
                    "step": epoch["step"],
                    "tokens": round(tokens),
                    "passes": round(tokens / train["tokens"], 3),
                    "val_loss": epoch["val_loss"],
                    "subword_perplexity": math.exp(epoch["val_loss"]),
                    "word_perplexity": math.exp(epoch["val_loss"] * manifest["tokens_per_word"]),
                }
            )
    return table


def markdown(table):
    """The comparison at the last step every run reached, and each run's own last evaluation."""
    runs = sorted(
        {row["run"] for row in table}, key=lambda name: next(r["parameters"] for r in table if r["run"] == name)
    )
    common = min(max(row["step"] for row in table if row["run"] == name) for name in runs)
    lines = [
        f"| run | parameters | perplexity at step {common} (subword / word) | last step | perplexity there (subword) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name in runs:
        mine = [row for row in table if row["run"] == name]
        at_common = next(row for row in mine if row["step"] == common)
        last = mine[-1]
        lines.append(
            f"| {name} | {at_common['parameters'] / 1e6:.1f}M | {at_common['subword_perplexity']:.1f} / "
            f"{at_common['word_perplexity']:.1f} | {last['step']} | {last['subword_perplexity']:.1f} |"
        )
    return "\n".join(lines), common


def plot(table, common, path, machine):
    import matplotlib  # only to draw: the table needs no plotting library

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, (curves, against) = pyplot.subplots(1, 2, figsize=(12, 4.5))
    for name in sorted({row["run"] for row in table}):
        mine = [row for row in table if row["run"] == name]
        style = "-" if "standard" in name else "--"
        curves.plot(
            [row["tokens"] / 1e6 for row in mine],
            [row["subword_perplexity"] for row in mine],
            style,
            marker="o",
            markersize=3,
            label=name.removeprefix("lm1b_"),
        )
        at = next(row for row in mine if row["step"] == common)
        against.scatter(
            at["parameters"] / 1e6,
            at["subword_perplexity"],
            marker="o" if "standard" in name else "^",
            color="tab:blue" if "standard" in name else "tab:orange",
        )
        against.annotate(name.removeprefix("lm1b_"), (at["parameters"] / 1e6, at["subword_perplexity"]), fontsize=7)
    curves.set(
        xscale="log",
        yscale="log",
        xlabel="training tokens (millions)",
        ylabel="held-out perplexity per subword",
        title="learning curves",
    )
    curves.legend(fontsize=7)
    against.set(
        xlabel="parameters (millions)",
        ylabel="held-out perplexity per subword",
        title=f"at step {common} (every run reached it): standard o, fixed head size ^",
    )
    figure.suptitle(f"LM1B-shape heads study, 6 layers, sequence 256, batch 64 ({machine})", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--results", type=pathlib.Path, default=RESULTS, help="folder of study.json, device.txt, prepared_manifest.json"
    )
    args = parser.parse_args()
    study = json.loads((args.results / "study.json").read_text())
    manifest = json.loads((args.results / "prepared_manifest.json").read_text())
    machine = " ".join(line.split(" (UUID")[0] for line in (args.results / "device.txt").read_text().splitlines()[:2])
    table = rows(study, manifest)
    with open(args.results / "gpu_heads_study.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    text, common = markdown(table)
    plot(table, common, args.results / "gpu_heads_study.png", machine)
    print(text)
    print(provenance_line(args.results))


def provenance_line(results):
    """Which code trained the runs (RESULTS/provenance.json, `gpu_heads_study.sh train` and `collect`)."""
    path = results / "provenance.json"
    if not path.exists():
        return "Trained from: not recorded."
    record = json.loads(path.read_text())
    note = f"; {record['recorded']}" if "recorded" in record else ""
    later = "".join(f"; resumed from {entry['commit'][:7]} on {entry['date']}" for entry in record.get("later", []))
    return f"Trained from commit {record['commit'][:7]} (tree clean: {record['clean']}), {record['date']}, {record['device']}{note}{later}."


if __name__ == "__main__":
    main()
