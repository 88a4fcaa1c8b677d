"""The benchmark suite in one command: every ratio measured against its reference in the same run.

Runs, each in its own process (so each backend starts clean), then prints one summary:

  attention  our attention variants vs keras.layers.MultiHeadAttention, forward+backward
             under XLA, TensorFlow and JAX backends (attention_benchmark.py)
  training   tokens/s and model FLOPs utilisation of our LM vs keras-hub's GPT2Backbone of
             the same size, TensorFlow and JAX backends (train_benchmark.py)
  serving    exported serving model: text in vs the bare encoder on ids (serving_benchmark.py)
  retrieval  exact top-10 over 100k embeddings at 512 vs 1024 dimensions (retrieval_benchmark.py)

    python benchmarks/run_all.py            # the full suite (~25 min on 2 cores)
    python benchmarks/run_all.py --quick    # fewer rounds (~10 min), noisier ratios
    python benchmarks/run_all.py --summary  # only print the summary of the results on disk
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).parent
RESULTS = HERE / "results"


def _steps(quick):
    rounds = lambda full, fast: str(fast if quick else full)  # noqa: E731
    return [
        (
            "attention (tensorflow)",
            "attention_benchmark.py",
            {"KERAS_BACKEND": "tensorflow"},
            ["--rounds", rounds(15, 5)],
        ),
        ("attention (jax)", "attention_benchmark.py", {"KERAS_BACKEND": "jax"}, ["--rounds", rounds(15, 5)]),
        ("training (tensorflow)", "train_benchmark.py", {"KERAS_BACKEND": "tensorflow"}, ["--rounds", rounds(7, 3)]),
        ("training (jax)", "train_benchmark.py", {"KERAS_BACKEND": "jax"}, ["--rounds", rounds(7, 3)]),
        ("serving (tensorflow)", "serving_benchmark.py", {"KERAS_BACKEND": "tensorflow"}, ["--rounds", rounds(30, 10)]),
        ("retrieval (numpy)", "retrieval_benchmark.py", {}, ["--rounds", rounds(20, 5)]),
    ]


def _load(name):
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else None


def summary():
    lines = []
    for backend in ("tensorflow", "jax"):
        record = _load(f"attention_{backend}.json")
        if record:
            lines.append(f"attention, {backend} ({record.get('date', '?')}; > 1 = ours faster than the reference):")
            lines += [f"  {row['case']:48s} {row['speed_ratio']:.2f}" for row in record["rows"]]
    for backend in ("tensorflow", "jax"):
        record = _load(f"train_{backend}.json")
        if record:
            lines.append(
                f"training, {backend} ({record.get('date', '?')}; vs keras-hub GPT2Backbone of the same size):"
            )
            lines += [
                f"  {row['model']:48s} {row['tokens_per_second']:8.0f} tokens/s  speed ratio {row.get('speed_vs_gpt2', 1.0):.2f}"
                f"  MFU {100 * row['mfu']:.1f}%"
                for row in record["rows"]
            ]
    record = _load("serving_benchmark.json")
    if record:
        lines.append("serving, tensorflow (text in vs ids in, p50; overhead of in-graph tokenisation):")
        lines += [
            f"  {row['model']:48s} batch {row['batch']:2d}  {row['text_p50_ms']:7.1f} vs {row['ids_p50_ms']:7.1f} ms"
            f"  overhead {100 * row['tokenisation_overhead']:+.1f}%"
            for row in record["rows"]
        ]
    record = _load("retrieval_benchmark.json")
    if record and len(record["rows"]) >= 2:
        small, large = record["rows"][0], record["rows"][-1]
        lines.append(f"retrieval, {record['vectors']:,} vectors, top-10 of {record['queries_per_batch']} queries:")
        lines += [
            f"  dim {row['dim']:5d}  {row['index_mb']:7.1f} MiB  {row['p50_ms']:7.1f} ms  {row['queries_per_s']:8.0f} queries/s"
            for row in record["rows"]
        ]
        lines.append(
            f"  dim {large['dim']} costs {large['p50_ms'] / small['p50_ms']:.2f}x the time and "
            f"{large['index_mb'] / small['index_mb']:.2f}x the memory of dim {small['dim']}"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--summary", action="store_true", help="print the summary of the results on disk, run nothing")
    args = parser.parse_args()
    if not args.summary:
        for label, script, environment, arguments in _steps(args.quick):
            print(f"=== {label}", flush=True)
            result = subprocess.run([sys.executable, str(HERE / script), *arguments], env={**os.environ, **environment})
            if result.returncode != 0:
                sys.exit(f"{label} failed (exit {result.returncode})")
    text = summary()
    print(text)
    (RESULTS / "summary.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
