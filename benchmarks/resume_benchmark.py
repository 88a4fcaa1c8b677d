"""Resume cost: time to the first training batch when a run resumes at step N.

Two pipelines over the same corpus, tokenizer and batch shape (tiny_lm: 8 rows x 64 tokens):
  * text: today's text pipeline (`task.dataset: text_files`): it re-reads, re-tokenises and
    re-packs every batch the run had consumed (`dataset.skip(N)`) before the first new one;
  * prepared: the `.npy` shards of `concise-prepare-data` (`task.dataset: prepared`): batch N
    is computed from (seed, N) and read directly (one shard).

The corpus is the shipped sample (822 real paragraphs of the Python Language Reference)
repeated `--repeat` times as .txt files: real lines, repeated, so that resuming at step
10,000 is within the first passes over the text. Each timing builds a fresh pipeline (and a
fresh shard reader) and takes the median of `--rounds`.

    python benchmarks/resume_benchmark.py        # writes benchmarks/results/resume_benchmark.json
"""

import argparse
import os
import platform
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from concise_attention.training.trainers import prepare_data  # noqa: E402
from concise_attention.training.data import shards  # noqa: E402
from concise_attention.training.data.packing import SAMPLE_CORPUS  # noqa: E402
from concise_attention.training.data.pipeline import corpus_lines  # noqa: E402
from concise_attention.training.data.pipeline import language_model_dataset  # noqa: E402
from concise_attention.training.data.pipeline import prepared_dataset  # noqa: E402
from concise_attention.training.files import write_json_atomically  # noqa: E402
from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer  # noqa: E402

from concise_attention.training.run import configs  # noqa: E402

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def _first_batch_seconds(make_dataset, rounds):
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        next(iter(make_dataset()))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=20, help="copies of the sample corpus")
    parser.add_argument("--steps", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument(
        "--prepared-only-steps",
        type=int,
        nargs="+",
        default=[100000, 1000000],
        help="resume steps timed for the prepared shards only (the text pipeline would take minutes)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        corpus = os.path.join(work, "corpus")
        os.makedirs(corpus)
        text = SAMPLE_CORPUS.read_text(encoding="utf-8")
        for copy in range(args.repeat):
            with open(os.path.join(corpus, f"part-{copy:03d}.txt"), "w", encoding="utf-8") as file:
                file.write(text)
        overrides = ["task.dataset=text_files", f"task.data_dir={corpus}"]
        config = configs.load_config("tiny_lm", overrides)
        start = time.perf_counter()
        prepared = os.path.join(work, "prepared")
        manifest = prepare_data.prepare(config, prepared, rows_per_shard=2048, progress=False)
        prepare_seconds = time.perf_counter() - start
        training = config.training
        tokenizer = wordpiece_tokenizer(os.path.join(prepared, shards.VOCABULARY))
        lines = corpus_lines("text_files", corpus, "train")
        text_dataset = lambda step: language_model_dataset(  # noqa: E731
            lines,
            tokenizer,
            training.sequence_length,
            training.batch_size,
            training=True,
            seed=training.seed,
            skip_batches=step,
        )
        prepared_reader = lambda: shards.ShardReader(prepared, "train", tf.io.gfile.GFile, training.seed)  # noqa: E731
        results = []
        for step in args.steps + args.prepared_only_steps:
            row = {
                "resume_step": step,
                "prepared_seconds": _first_batch_seconds(
                    lambda: prepared_dataset(prepared_reader(), training.batch_size, step), args.rounds
                ),
            }
            if step in args.steps:
                row["text_seconds"] = _first_batch_seconds(
                    lambda: text_dataset(step), 1 if step >= 10000 else args.rounds
                )
            results.append(row)
            print(row, flush=True)
    first, last = results[0], results[len(args.steps) - 1]
    summary = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, TensorFlow {tf.__version__}",
        "date": time.strftime("%Y-%m-%d"),
        "corpus": f"the shipped sample repeated {args.repeat} times ({manifest['splits']['train']['lines']} training lines, "
        f"{manifest['splits']['train']['rows']} rows of {training.sequence_length} tokens, "
        f"{len(manifest['splits']['train']['shards'])} shards)",
        "batch": f"{training.batch_size} x {training.sequence_length}",
        "prepare_seconds": prepare_seconds,
        "results": results,
        "text_ratio_last_to_first": last["text_seconds"] / first["text_seconds"],
        "prepared_ratio_last_to_first": last["prepared_seconds"] / first["prepared_seconds"],
        "text_over_prepared_at_last": last["text_seconds"] / last["prepared_seconds"],
    }
    os.makedirs(RESULTS, exist_ok=True)
    write_json_atomically(os.path.join(RESULTS, "resume_benchmark.json"), summary)
    print({key: value for key, value in summary.items() if key != "results"})


if __name__ == "__main__":
    main()
