"""Serving throughput of exported sentence encoders against the machine's own limit and against
sentence-transformers.

    python benchmarks/serving_benchmark.py [--rounds 3] [--st-python ST_VENV/bin/python]

For all-MiniLM-L6-v2 (exported by `concise-export --hf-dir`, the README's command) and every concise
encoder shipped with the package, on short (~15 WordPieces), medium (~40) and long (~120) sentences of
the shipped corpus and on mixed ones (3-126, in no order), at batch 1, 32 and 1,024, interleaved round by round in one process:

  (a) `export`       the exported TF Serving model's `serving_default` (text in): length-sorted chunks,
                     each padded to its own longest text (`export.chunking`);
  (b) `fixed_length` the serving graph exports had before, every text padded to 128 (today's figures
                     on main before chunking), on the same loaded encoder;
  (c) `keras_ids`    the Keras encoder called directly on token ids (tokenised beforehand), padded to
                     each batch's longest text, mean-pooled in the same graph;
  (d) `sentence_transformers`  (with `--st-python`, a Python that has sentence-transformers and PyTorch
                     CPU; run in a subprocess on the same texts, its own tokenizer and batching);

and the machine's float32 matrix-product rate measured in the same run (a [4096, 384] x [384, 1536]
product), so that each figure is also a share of the hardware: the encoder's FLOPs for the real tokens
of each sentence (dense layers and attention, counted from the model's shapes) x sentences/s / rate.
Every variant's embeddings are checked against (c) (cosine >= 0.99999) before anything is timed.
Results: `--out` (JSON) and a Markdown table with the machine and the date.

The JSON records whether TensorFlow's oneDNN CPU kernels were on: TensorFlow turns them on by itself only on
CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX, and reads `TF_ENABLE_ONEDNN_OPTS` once, when it is imported, so
`TF_ENABLE_ONEDNN_OPTS=1 python benchmarks/serving_benchmark.py ...` measures with them elsewhere.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import provenance  # noqa: E402  (benchmarks/, beside this script)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.util import _pywrap_util_port  # noqa: E402  (IsMklEnabled: are oneDNN's kernels on)

RESULTS = pathlib.Path(__file__).parent / "results"
# WordPieces, [CLS] and [SEP] excluded; "mixed": every length up to the long texts', in no order (alphabetical), as
# requests come: what sorting a request's texts by length is for (keras_ids pads each batch as it comes).
LENGTHS = {"short": (12, 18), "medium": (36, 44), "long": (110, 126), "mixed": (3, 126)}
BATCHES = (1, 32, 1024)
SEQ_LENGTH = 128

ST_SCRIPT = r"""
import json, sys, time
import numpy as np, torch
from sentence_transformers import SentenceTransformer
folder, texts_path, batch, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
texts = json.load(open(texts_path))
model = SentenceTransformer(folder, device="cpu")
model.max_seq_length = 128
first = model.encode(texts[:batch], batch_size=batch, convert_to_numpy=True)
rates = []
for _ in range(rounds):
    start = time.perf_counter()
    model.encode(texts, batch_size=batch, convert_to_numpy=True)
    rates.append(len(texts) / (time.perf_counter() - start))
np.save(texts_path + ".npy", first)
print(json.dumps({"rates": rates, "threads": torch.get_num_threads(), "torch": torch.__version__}))
"""


def minilm_folder():
    from concise_attention.training.tasks.distill import default_teacher

    return pathlib.Path(default_teacher())


def texts_by_length(tokenizer, count=1024):
    """{short, medium, long, mixed}: `count` texts of the shipped corpus (sentences, and whole paragraphs for
    the long ones) whose WordPiece counts lie in LENGTHS, repeated in order if there are fewer."""
    from concise_attention.training.data.packing import read_lines

    lines = [line.strip() for line in read_lines() if line.strip()]
    candidates = sorted(
        {part.strip() for line in lines for part in (line, *line.split(". ")) if len(part.split()) >= 3}
    )
    pieces = tokenizer.token_ids(tf.constant(candidates), max_length=None).row_lengths().numpy()
    chosen = {}
    for name, (low, high) in LENGTHS.items():
        found = [text for text, length in zip(candidates, pieces) if low <= length <= high]
        if not found:
            raise ValueError(f"no {name} text ({low}-{high} WordPieces) in the shipped corpus")
        chosen[name] = [found[index % len(found)] for index in range(count)]
    return chosen


def encoder_flops(encoder, tokens):
    """FLOPs (a multiply-add counts 2) of the encoder's dense layers and attention (scores and the
    weighted sum of values) for one sentence of `tokens` real tokens; embeddings and pooler excluded."""
    config = encoder.get_config()
    dense = sum(
        int(np.prod(weight.shape))
        for weight in encoder.trainable_weights
        if len(weight.shape) >= 2 and "embedding" not in weight.path and "pooler" not in weight.path
    )
    head_size = config["attention"].get("head_size")
    width = config["num_heads"] * head_size if head_size else config["hidden_size"]
    return 2 * tokens * dense + config["num_layers"] * 2 * 2 * tokens * tokens * width


def matmul_rate(repeats=20):
    """FLOP/s of a float32 [4096, 384] x [384, 1536] product on this machine (median of `repeats`)."""
    a, b = tf.random.normal([4096, 384]), tf.random.normal([384, 1536])
    product = tf.function(lambda: tf.reduce_sum(tf.matmul(a, b)))
    product()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        product().numpy()
        times.append(time.perf_counter() - start)
    return 2 * 4096 * 384 * 1536 / float(np.median(times))


def fixed_length_graph(encoder, tokenizer):
    """The serving graph before chunking: every text packed to SEQ_LENGTH, then mean pooling."""
    from concise_attention.models.heads import mean_pooled

    def serve(text):
        inputs = tokenizer.encode(text, SEQ_LENGTH)
        return mean_pooled(encoder(inputs, training=False)["sequence_output"], inputs["input_mask"])

    return tf.function(serve, input_signature=[tf.TensorSpec([None], tf.string)])


def keras_ids_graph(encoder):
    from concise_attention.models.heads import mean_pooled

    def forward(word_ids, mask):
        inputs = {"input_word_ids": word_ids, "input_mask": mask, "input_type_ids": tf.zeros_like(word_ids)}
        return mean_pooled(encoder(inputs, training=False)["sequence_output"], mask)

    return tf.function(forward, input_signature=[tf.TensorSpec([None, None], tf.int32)] * 2)


def variants(serving_dir, encoder, tokenizer):
    """{variant: function(texts list) -> numpy embeddings} of one encoder."""
    served = tf.saved_model.load(str(serving_dir)).signatures["serving_default"]
    fixed, by_ids = fixed_length_graph(encoder, tokenizer), keras_ids_graph(encoder)

    def keras_ids(batch_ids):  # tokenised beforehand: (word_ids, mask) of each batch
        return np.concatenate([by_ids(ids, mask).numpy() for ids, mask in batch_ids])

    return {
        "export": lambda texts: served(text=tf.constant(texts))["embedding"].numpy(),
        "fixed_length": lambda texts: fixed(tf.constant(texts)).numpy(),
        "keras_ids": keras_ids,
    }


def tokenised_batches(tokenizer, texts, batch):
    """(word_ids, mask) per batch of `texts`, each padded to its own longest text."""
    out = []
    for start in range(0, len(texts), batch):
        inputs = tokenizer.pack(
            [tokenizer.tokenize(tf.constant(texts[start : start + batch]), max_length=SEQ_LENGTH)], SEQ_LENGTH
        )
        longest = int(inputs["input_mask"].numpy().sum(1).max())
        out.append((inputs["input_word_ids"][:, :longest], inputs["input_mask"][:, :longest]))
    return out


def sentence_transformers_rates(st_python, folder, texts, batch, rounds):
    """(sentences/s per round, embeddings of the first batch, details) of sentence-transformers in `st_python`."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "texts.json")
        with open(path, "w", encoding="utf-8") as file:
            json.dump(texts, file)
        result = subprocess.run(
            [st_python, "-c", ST_SCRIPT, str(folder), path, str(batch), str(rounds)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise ValueError(
                f"--st-python {st_python}: sentence-transformers failed: {result.stderr.strip().splitlines()[-1:]}"
            )
        details = json.loads(result.stdout.strip().splitlines()[-1])
        return details.pop("rates"), np.load(path + ".npy"), details


def unit(rows):
    rows = np.asarray(rows, "float64")
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def check_answers(functions, reference, texts, batch_ids):
    """The lowest cosine of each variant's embeddings against the Keras encoder's on the same texts."""
    expected = unit(reference(batch_ids))
    lowest = {}
    for name, function in functions.items():
        got = unit(function(batch_ids if name == "keras_ids" else texts))
        lowest[name] = float(np.min(np.sum(got * expected, axis=1)))
    return lowest


def measure(functions, texts, batch_ids, batch, rounds):
    """{variant: median sentences/s} over `rounds`, the variants interleaved within each round."""
    rates = {name: [] for name in functions}
    batches = [texts[start : start + batch] for start in range(0, len(texts), batch)]
    for name, function in functions.items():  # warm-up: tracing, thread pools
        function(batch_ids[:1] if name == "keras_ids" else batches[0])
    for _ in range(rounds):
        for name, function in functions.items():
            start = time.perf_counter()
            for index, chunk in enumerate(batches):
                function(batch_ids[index : index + 1] if name == "keras_ids" else chunk)
            rates[name].append(len(texts) / (time.perf_counter() - start))
    return {name: float(np.median(values)) for name, values in rates.items()}


def encoders(chosen=None):
    """(name, source for export_run, loaded backbone, tokenizer) of the teacher and each shipped preset
    (only the names in `chosen`, when given)."""
    from concise_attention.models import presets
    from concise_attention.training.preprocessing.text import WordPieceModule
    from concise_attention.training import artifacts

    for name, source in [
        ("all-MiniLM-L6-v2", str(minilm_folder())),
        *[(preset, preset) for preset in presets.shipped_presets()],
    ]:
        if chosen and name not in chosen:
            continue
        model = artifacts.load(source)
        loaded, backbone = model.source, model.backbone
        tokenizer = WordPieceModule(
            loaded.vocabulary,
            lowercase=loaded.tokenizer.get("lowercase", True),
            strip_accents=loaded.tokenizer.get("strip_accents"),
        )
        yield name, source, backbone, tokenizer


def benchmark_encoder(name, source, backbone, tokenizer, args, rate, workdir):
    from concise_attention.export.savedmodels import export_run

    written = export_run(source, os.path.join(workdir, name), seq_length=SEQ_LENGTH)
    functions = variants(written["serving"], backbone, tokenizer)
    rows = []
    for length, texts in texts_by_length(tokenizer, args.count).items():
        each = tokenizer.token_ids(tf.constant(texts), max_length=SEQ_LENGTH).row_lengths().numpy() + 2
        tokens = float(np.mean(each))
        flops = float(np.mean([encoder_flops(backbone, count) for count in each]))  # attention grows as a square
        for batch in args.batches:
            count = min(len(texts), max(batch * 4, 64)) if batch < 1024 else len(texts)
            chosen = texts[:count]
            batch_ids = tokenised_batches(tokenizer, chosen, batch)
            cosines = check_answers(
                {key: value for key, value in functions.items() if key != "keras_ids"},
                functions["keras_ids"],
                chosen[:batch],
                batch_ids[:1],
            )
            rates = measure(functions, chosen, batch_ids, batch, args.rounds)
            if args.st_python and name == "all-MiniLM-L6-v2":
                st_rates, st_first, _ = sentence_transformers_rates(args.st_python, source, chosen, batch, args.rounds)
                rates["sentence_transformers"] = float(np.median(st_rates))
                cosines["sentence_transformers"] = float(
                    np.min(np.sum(unit(st_first) * unit(functions["keras_ids"](batch_ids[:1])), axis=1))
                )
            row = {
                "encoder": name,
                "length": length,
                "tokens": tokens,
                "batch": batch,
                "texts": count,
                "sentences_per_s": rates,
                "lowest_cosine_to_keras": cosines,
                "share_of_matmul_rate": {key: value * flops / rate for key, value in rates.items()},
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def table(result):
    # a student has no sentence_transformers
    variants_seen = list(dict.fromkeys(key for row in result["rows"] for key in row["sentences_per_s"]))
    lines = [
        "| encoder | texts | batch | "
        + " | ".join(variants_seen)
        + " | export / fixed_length | export, share of matmul rate |",
        "|---|---|---:|" + "---:|" * (len(variants_seen) + 2),
    ]
    for row in result["rows"]:
        rates = row["sentences_per_s"]
        lines.append(
            f"| {row['encoder']} | {row['length']} ({row['tokens']:.0f} tokens) | {row['batch']} | "
            + " | ".join(f"{rates[key]:.0f}" if key in rates else "" for key in variants_seen)
            + f" | {rates['export'] / rates['fixed_length']:.1f}x | {row['share_of_matmul_rate']['export']:.0%} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--count", type=int, default=1024, help="texts of each length (batch 1024 uses them all)")
    parser.add_argument(
        "--encoders", nargs="+", help="only these (all-MiniLM-L6-v2 and shipped preset names; default: all)"
    )
    parser.add_argument("--st-python", help="a Python with sentence-transformers and PyTorch CPU (a separate venv)")
    parser.add_argument("--out", default=str(RESULTS / "serving_benchmark.json"))
    parser.add_argument("--markdown", metavar="JSON", help="only print the table of a results file")
    args = parser.parse_args(argv)
    if args.markdown:
        print(table(json.loads(pathlib.Path(args.markdown).read_text())))
        return
    rate = matmul_rate()
    print(f"float32 matmul rate: {rate / 1e9:.0f} GFLOP/s", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for name, source, backbone, tokenizer in encoders(args.encoders):
            rows += benchmark_encoder(name, source, backbone, tokenizer, args, rate, workdir)
    result = {
        **provenance.header(__file__, argv),
        "tensorflow": tf.__version__,
        "onednn": bool(_pywrap_util_port.IsMklEnabled()),
        "sequence_length": SEQ_LENGTH,
        "matmul_gflops": rate / 1e9,
        "rounds": args.rounds,
        "rows": rows,
    }
    provenance.write(args.out, result)
    print(
        f"\n{result['machine']}, {result['date']}, oneDNN {'on' if result['onednn'] else 'off'}, "
        f"matmul {result['matmul_gflops']:.0f} GFLOP/s\n\n" + table(result)
    )


if __name__ == "__main__":
    main()
