"""What `concise-export --xla` buys a served request: the TF Serving model of one preset exported plain and with
--xla, called alternately in one process on the same texts.

    python benchmarks/xla_serving.py --preset concise-minilm-d192 [--out results/xla_serving.json]

For each length of `serving_benchmark.LENGTHS` (32 texts of the shipped corpus), sentences/s of `serving_default`
at batch 1 (one text a request: the path --xla compiles) and batch 32 (the chunked path, compiled by neither), the
median of ROUNDS rounds with the two exports alternating inside each (`serving_benchmark.measure`); the ratio --xla / plain; the least cosine between
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
    import serving_benchmark  # benchmarks/ is on sys.path once main() ran

    functions = {
        name: (lambda batch, signature=signature: signature(text=tf.constant(batch))["embedding"])
        for name, signature in (("plain", plain), ("xla", xla))
    }
    for function in functions.values():  # the graphs' own first-call setup, on the chunked path neither compiles
        function(texts[:2])
    row = {"xla_first_request_seconds_max": max(first_calls(xla, texts))}
    single = {
        name: serving_benchmark.unit([function([text])[0] for text in texts[:8]])
        for name, function in functions.items()
    }
    row["cosine_min"] = float(np.min(np.sum(single["plain"] * single["xla"], axis=1)))
    for batch in (1, 32):
        rates = serving_benchmark.measure(functions, texts * (3 if batch == 1 else 5), None, batch, ROUNDS)
        row[f"batch {batch}"] = {**rates, "ratio": rates["xla"] / rates["plain"]}
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="concise-minilm-d192")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import provenance
    import serving_benchmark

    result = provenance.header(__file__, argv)
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
        provenance.write(args.out, result)


if __name__ == "__main__":
    main()
