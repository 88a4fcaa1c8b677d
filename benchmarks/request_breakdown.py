"""Where the time of one request to our TF Serving export goes, at batch 1 and 32, and what XLA would save.

    python benchmarks/request_breakdown.py --export EXPORT --preset PRESET [--out results/request_breakdown.json]

EXPORT is a `concise-export` of PRESET. For 32 texts of each length of `serving_benchmark.LENGTHS` (short, medium,
long), milliseconds per request (best of 5 rounds' means) of:

  serving         the served `serving_default` (text in, embedding out): what a client waits for;
  tokenize        its `tokenize` signature alone (in-graph WordPiece, padded to the export's length);
  encoder         its `serve_token_ids` signature on those ids cut to the request's longest text (what
                  `serving_default` runs after sorting and chunking);
  keras           PRESET's Keras encoder in a tf.function on the same ids;
  keras_xla       the same tf.function compiled by XLA (jit_compile=True), after one warm-up call per shape.

serving - tokenize - encoder is the rest of the graph (sorting, the chunk loop, pooling); keras / keras_xla is what
compiling the encoder would save per call at that shape.
"""

import argparse
import json
import pathlib
import sys
import time

import tensorflow as tf

from concise_attention.models.bert import BertEncoder
from concise_attention.training import artifacts
from concise_attention.training.inference import encoders
from concise_attention.training.preprocessing.text import WordPieceModule

ROUNDS, CALLS = 5, 20


def milliseconds(call):
    """Best of ROUNDS means of CALLS calls, after 3 warm-up calls."""
    for _ in range(3):
        call()
    rounds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(CALLS):
            call()
        rounds.append((time.perf_counter() - start) / CALLS * 1000)
    return min(rounds)


def breakdown(served, keras, keras_xla, texts):
    """{part: ms} for one request of `texts`."""
    text = tf.constant(texts)
    ids = served.signatures["tokenize"](text=text)
    longest = int(tf.reduce_max(tf.reduce_sum(ids["input_mask"], axis=1)))
    cut = {name: value[:, :longest] for name, value in ids.items()}
    return {
        "serving": milliseconds(lambda: served.signatures["serving_default"](text=text)),
        "tokenize": milliseconds(lambda: served.signatures["tokenize"](text=text)),
        "encoder": milliseconds(lambda: served.signatures["serve_token_ids"](**cut)),
        "keras": milliseconds(lambda: keras(cut)),
        "keras_xla": milliseconds(lambda: keras_xla(cut)),
        "tokens": longest,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export", required=True, help="a concise-export folder")
    parser.add_argument("--preset", required=True, help="what it was exported from")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import provenance
    import serving_benchmark

    served = tf.saved_model.load(encoders.serving_version(args.export))
    encoder = BertEncoder.from_preset(args.preset)
    keras = tf.function(lambda inputs: encoder(inputs))
    keras_xla = tf.function(lambda inputs: encoder(inputs), jit_compile=True)
    source = artifacts.read(args.preset)
    chosen = serving_benchmark.texts_by_length(WordPieceModule(source.vocabulary, **source.tokenizer), 32)
    rows = {}
    for length in ("short", "medium", "long"):
        for batch in (1, 32):
            rows[f"{length} b{batch}"] = breakdown(served, keras, keras_xla, chosen[length][:batch])
            print(
                length, batch, json.dumps({key: round(value, 2) for key, value in rows[f"{length} b{batch}"].items()})
            )
    result = provenance.header(__file__, argv)
    result["rows"] = rows
    if args.out:
        provenance.write(args.out, result)


if __name__ == "__main__":
    main()
