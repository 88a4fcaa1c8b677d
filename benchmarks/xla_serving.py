"""What `concise-export --xla` buys a served request: the TF Serving model of one preset exported plain and with
--xla, called alternately in one process on the same texts.

    python benchmarks/xla_serving.py --preset concise-minilm-d192 [--out results/xla_serving.json]

For each length of `serving_benchmark.LENGTHS` (32 texts of the shipped corpus), sentences/s of `serving_default`
at batch 1 (one text a request: the path --xla compiles) and batch 32 (the chunked path, compiled by neither), best
of ROUNDS rounds, the two exports alternating inside each round; the ratio --xla / plain; the least cosine between
the two exports' embeddings of each text sent alone; and the seconds the --xla model's first request of each padded
length took after a first request of two texts (its XLA compilation, which the export's warm-up requests make before
TF Serving serves).
"""

import argparse
import json
import pathlib
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf

from concise_attention.export.savedmodels import export_run
from concise_attention.training.preprocessing.text import WordPieceModule

ROUNDS = 5


def rate(signature, texts, batch):
    """Sentences/s of `signature` over `texts` sent `batch` at a time."""
    start = time.perf_counter()
    for index in range(0, len(texts), batch):
        signature(text=tf.constant(texts[index : index + batch]))
    return len(texts) / (time.perf_counter() - start)


def first_calls(signature, texts):
    """Seconds of the first request of each distinct text alone (the --xla model compiles a padded length then)."""
    seconds = []
    for text in dict.fromkeys(texts):
        start = time.perf_counter()
        signature(text=tf.constant([text]))
        seconds.append(time.perf_counter() - start)
    return seconds


def compare(plain, xla, texts):
    """{batch 1 and 32: rates of each export, ratio}, the least cosine of single-text embeddings, first-call seconds."""
    for signature in (plain, xla):  # the graphs' own first-call setup, on the chunked path neither compiles
        signature(text=tf.constant(texts[:2]))
    compiled = first_calls(xla, texts)
    row = {"xla_first_request_seconds_max": max(compiled)}
    for signature in (plain, xla):
        rate(signature, texts, 32)
    single = [
        [signature(text=tf.constant([text]))["embedding"].numpy()[0] for text in texts[:8]]
        for signature in (plain, xla)
    ]
    row["cosine_min"] = min(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(single[0], single[1]))
    for batch in (1, 32):
        rates = {"plain": [], "xla": []}
        for _ in range(ROUNDS):
            for name, signature in (("plain", plain), ("xla", xla)):
                rates[name].append(rate(signature, texts * (3 if batch == 1 else 5), batch))
        best = {name: max(values) for name, values in rates.items()}
        row[f"batch {batch}"] = {**best, "ratio": best["xla"] / best["plain"]}
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="concise-minilm-d192")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import provenance
    import serving_benchmark

    result = {
        **provenance.record(),
        "command": provenance.command_line("benchmarks/xla_serving.py", argv or sys.argv[1:]),
    }
    with tempfile.TemporaryDirectory() as workdir:
        served = {}
        for name, xla in (("plain", False), ("xla", True)):
            written = export_run(args.preset, pathlib.Path(workdir) / name, xla=xla)
            served[name] = tf.saved_model.load(written["serving"]).signatures["serving_default"]
        vocabulary = pathlib.Path(written["encoder"]) / "assets" / "vocab.txt"
        texts = serving_benchmark.texts_by_length(WordPieceModule(str(vocabulary)), 32)
        result["rows"] = {name: compare(served["plain"], served["xla"], chosen) for name, chosen in texts.items()}
    print(json.dumps(result, indent=1))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
