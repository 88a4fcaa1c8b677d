"""Training throughput of our causal LM against keras-hub's GPT-2 of the same size, MFU, input pipeline.

Measured in one run, interleaved:
  * tokens/s of a compiled training step (forward, backward, Adam) of `CausalLM` (standard
    and fixed-head-size attention) and of keras-hub's `GPT2Backbone` with its tied output
    embedding, same width, depth, heads, feed-forward, vocabulary, batch and length;
  * model FLOPs utilisation: 6 * non-embedding parameters + 12 * layers * length * width
    (attention) + 6 * vocabulary * width (output layer) FLOPs per token, against the FLOP/s
    of a large XLA matmul measured here;
  * the tf.data pipeline (tokenise, pack, batch) in tokens/s on the shipped corpus, against
    what the training step consumes.

    python benchmarks/train_benchmark.py                     # TensorFlow backend
    KERAS_BACKEND=jax python benchmarks/train_benchmark.py   # the same models and steps under JAX

Writes benchmarks/results/train_<backend>.json.
"""

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from concise_attention.training.data.pipeline import corpus_lines  # noqa: E402
from concise_attention.training.data.pipeline import language_model_dataset  # noqa: E402
from concise_attention.training.files import write_json_atomically  # noqa: E402
from concise_attention.training.preprocessing.tokenizer import train_wordpiece  # noqa: E402
from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer  # noqa: E402
from concise_attention.training.run import configs  # noqa: E402
from concise_attention.training.tasks.objectives import TokenCrossEntropy  # noqa: E402

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def _gpt2_lm(vocabulary, width, layers, heads, feedforward, length):
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocabulary,
        num_layers=layers,
        num_heads=heads,
        hidden_dim=width,
        intermediate_dim=feedforward,
        max_sequence_length=length,
        dropout=0.0,
    )
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    hidden = backbone({"token_ids": token_ids, "padding_mask": keras.ops.ones_like(token_ids)})
    return keras.Model(token_ids, backbone.token_embedding(hidden, reverse=True))


def _train_step_timer(model, inputs, labels, iterations):
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss=TokenCrossEntropy(), jit_compile=True)
    model.train_on_batch(inputs, labels)  # compile

    def run():
        start = time.perf_counter()
        for _ in range(iterations):
            model.train_on_batch(inputs, labels)
        return (time.perf_counter() - start) / iterations

    return run


def _matmul_flops_per_second(size=2048, repeats=20):
    """FLOP/s of a large XLA-compiled matmul on the running backend: what MFU is measured against."""
    a = keras.random.normal((size, size))
    b = keras.random.normal((size, size))
    if keras.backend.backend() == "jax":
        import jax

        matmul = jax.jit(lambda x, y: x @ y)
        wait = jax.block_until_ready
    else:
        matmul = tf.function(lambda x, y: tf.matmul(x, y), jit_compile=True)
        wait = lambda result: result.numpy()  # noqa: E731
    wait(matmul(a, b))
    start = time.perf_counter()
    for _ in range(repeats):
        result = matmul(a, b)
    wait(result)
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def _backend_version(backend):
    if backend == "jax":
        import jax

        return jax.__version__
    return tf.__version__


def _model_flops_per_token(model, layers, width, length, vocabulary):
    embeddings = sum(int(np.prod(w.shape)) for w in model.weights if "embedding" in w.path)
    non_embedding = model.count_params() - embeddings
    return 6 * non_embedding + 12 * layers * length * width + 6 * vocabulary * width


def _pipeline_tokens_per_second(length, batch, batches=200):
    """Tokens per second the input pipeline delivers on the shipped corpus (vocabulary trained on it, cached)."""
    lines = corpus_lines("sample", split="train")
    vocabulary = train_wordpiece(list(lines()), 2000, os.path.join(RESULTS, "cache", "sample_corpus_vocab.txt"))
    iterator = iter(language_model_dataset(lines, wordpiece_tokenizer(vocabulary), length, batch, training=True))
    next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * batch * length / (time.perf_counter() - start)


def _timed_rounds(timers, rounds):
    """{model: [seconds of each round]}, the models' order reversed every other round."""
    seconds = {name: [] for name in timers}
    print(f"timing {len(timers)} models x {rounds} rounds ...", flush=True)
    for round_index in range(rounds):
        for name in list(timers) if round_index % 2 == 0 else list(timers)[::-1]:
            seconds[name].append(timers[name]())
    return seconds


def _print_table(record):
    args, rows = record["args"], record["rows"]
    print(
        f"\n{record['backend']} backend, batch {args['batch']} x length {args['length']}, width {args['width']}, "
        f"{args['layers']} layers, {args['heads']} heads, vocabulary {args['vocabulary']}"
    )
    print(f"{'model':28s} {'params':>10s} {'ms/step':>9s} {'tokens/s':>10s} {'vs GPT-2':>9s} {'MFU':>7s}")
    for row in rows:
        print(
            f"{row['model']:28s} {row['parameters']:10,d} {row['step_ms']:9.1f} {row['tokens_per_second']:10.0f} "
            f"{row['speed_vs_gpt2']:9.3f} {row['mfu']:7.1%}"
        )
    fastest = max(row["tokens_per_second"] for row in rows)
    pipeline = record["pipeline_tokens_per_second"]
    print(
        f"large matmul: {record['matmul_peak_gflops']:.1f} GFLOP/s; input pipeline: {pipeline:,.0f} tokens/s "
        f"= {pipeline / fastest:.1f}x what the fastest training step consumes"
    )


def _models(args):
    """Our standard and fixed-head-size causal LMs and keras-hub's GPT-2 of the same shape."""
    feedforward = 4 * args.width
    common = [
        f"model.vocab_size={args.vocabulary}",
        f"model.hidden_size={args.width}",
        f"model.num_layers={args.layers}",
        f"model.num_heads={args.heads}",
        f"model.intermediate_size={feedforward}",
        f"model.max_sequence_length={args.length}",
        "model.dropout=0",
        "model.attention_dropout=0",
        "model.activation=gelu_approximate",
        "model.position_embedding=learned",
    ]
    return {
        "ours standard": configs.load_config("tiny_lm", common + ["model.attention={type: standard}"]).build_model(),
        "ours fixed (head size 2x)": configs.load_config(
            "tiny_lm", common + [f"model.attention={{type: fixed, head_size: {2 * args.width // args.heads}}}"]
        ).build_model(),
        "keras-hub GPT2Backbone": _gpt2_lm(
            args.vocabulary, args.width, args.layers, args.heads, feedforward, args.length
        ),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--vocabulary", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    models = _models(args)
    rng = np.random.default_rng(0)
    tokens = rng.integers(5, args.vocabulary, size=(args.batch, args.length)).astype("int32")
    labels = np.roll(tokens, -1, axis=1)
    packed = {
        "token_ids": tokens,
        "segment_ids": np.ones_like(tokens),
        "positions": np.tile(np.arange(args.length, dtype="int32"), (args.batch, 1)),
    }
    timers = {}
    for name, model in models.items():
        inputs = tokens if name.startswith("keras-hub") else packed
        timers[name] = _train_step_timer(model, inputs, labels, args.iterations)
    seconds = _timed_rounds(timers, args.rounds)
    peak, pipeline_tokens_per_second = _matmul_flops_per_second(), _pipeline_tokens_per_second(args.length, args.batch)
    tokens_per_step = args.batch * args.length
    rows = []
    reference = statistics.median(seconds["keras-hub GPT2Backbone"])
    for name, model in models.items():
        step = statistics.median(seconds[name])
        flops = _model_flops_per_token(model, args.layers, args.width, args.length, args.vocabulary) * tokens_per_step
        rows.append(
            {
                "model": name,
                "parameters": model.count_params(),
                "step_ms": step * 1e3,
                "tokens_per_second": tokens_per_step / step,
                "speed_vs_gpt2": reference / step,
                "mfu": flops / step / peak,
            }
        )
    backend = keras.backend.backend()
    record = {
        "args": vars(args),
        "date": time.strftime("%Y-%m-%d"),
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "backend": backend,
        "backend_version": _backend_version(backend),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "keras_hub": keras_hub.__version__,
        "matmul_peak_gflops": peak / 1e9,
        "pipeline_tokens_per_second": pipeline_tokens_per_second,
        "rows": rows,
        "raw_seconds": seconds,
    }
    _print_table(record)
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"train_{backend}.json")
    write_json_atomically(path, record)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
