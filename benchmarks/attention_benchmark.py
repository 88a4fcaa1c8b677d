"""Forward + backward time of the attention variants against keras.layers.MultiHeadAttention,
and of our fused path (keras.ops.dot_product_attention) against our explicit one.

Every pair is measured in the same run, compiled with XLA, interleaved round by round
so that machine noise hits both sides alike; the figure reported is the ratio of
medians (reference time / our time: >= 1 means ours is at least as fast). In the
"fused vs explicit" rows "ours" is a layer with use_fused=True and the reference the
same layer with use_fused=False, under the masks the row names.

Also counts the FLOPs of the query/key path (analytic counts, which the tests check
against XLA's own cost analysis) for collaborative attention against standard.

    python benchmarks/attention_benchmark.py                 # TensorFlow backend, CPU
    KERAS_BACKEND=jax python benchmarks/attention_benchmark.py
    python benchmarks/attention_benchmark.py --only "fused vs explicit" --out /tmp/fused.json

Writes a JSON record (hardware, versions, every timing) next to the printed table.
"""

import argparse
import json
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from concise_attention.models import CollaborativeAttention  # noqa: E402
from concise_attention.models import FixedHeadSizeAttention  # noqa: E402
from concise_attention.models import StandardAttention  # noqa: E402


def _compiled_step(layer, inputs, call_kwargs):
    """A compiled forward + backward (gradients of all weights and of the input)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=True)
        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(tf.square(layer(x, **call_kwargs)))
            return tape.gradient(loss, [x, *layer.trainable_variables])

        x = tf.constant(inputs)
        return lambda: [g.numpy() for g in step(x)][0]
    if backend == "jax":
        import jax

        def loss(weights, x):
            outputs, _ = layer.stateless_call(weights, [], x, **call_kwargs)
            return (outputs**2).sum()

        grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
        weights = [v.value for v in layer.trainable_variables]
        x = jax.numpy.asarray(inputs)
        return lambda: jax.block_until_ready(grad(weights, x))
    raise SystemExit(f"unsupported backend {backend!r}: use tensorflow or jax")


def _time(step, iterations):
    start = time.perf_counter()
    for _ in range(iterations):
        step()
    return (time.perf_counter() - start) / iterations


def _cases(batch, length):
    """Each case: (name, width, ours, reference, call arguments), the reference configured equivalently."""

    def mha(num_heads, key_dim):
        return _SelfAttention(keras.layers.MultiHeadAttention(num_heads, key_dim=key_dim))

    def fixed(num_heads, head_size, use_fused=True):
        return FixedHeadSizeAttention(num_heads, head_size, use_fused=use_fused)

    # Example b keeps length - b * length / 16 tokens (BERT-style padding over the keys).
    padding = np.arange(length)[None, :] < length - np.arange(batch)[:, None] * (length // 16)
    return [
        ("fixed h=12 d_p=64 vs keras", 768, fixed(12, 64), mha(12, key_dim=64), {}),
        ("standard h=12 vs keras", 768, StandardAttention(12), mha(12, key_dim=64), {}),
        ("fixed h=8 d_p=128 (d=512) vs keras", 512, fixed(8, 128), mha(8, key_dim=128), {}),
        ("fixed h=32 d_p=128 (d=512) vs keras", 512, fixed(32, 128), mha(32, key_dim=128), {}),
        ("collaborative D~k=192 vs standard h=12", 768, CollaborativeAttention(12, 192, 64), StandardAttention(12), {}),
        ("collaborative D~k=192 vs keras", 768, CollaborativeAttention(12, 192, 64), mha(12, key_dim=64), {}),
        ("collaborative D~k=96 vs standard h=12", 768, CollaborativeAttention(12, 96, 64), StandardAttention(12), {}),
        ("standard h=12, fused vs explicit", 768, StandardAttention(12), StandardAttention(12, use_fused=False), {}),
        (
            "fixed h=8 d_p=128 (d=512), padding, fused vs explicit",
            512,
            fixed(8, 128),
            fixed(8, 128, False),
            {"attention_mask": padding},
        ),
        (
            "fixed h=12 d_p=64, causal, fused vs explicit",
            768,
            fixed(12, 64),
            fixed(12, 64, False),
            {"use_causal_mask": True},
        ),
        (
            "fixed h=32 d_p=128 (d=512), padding+causal, fused vs explicit",
            512,
            fixed(32, 128),
            fixed(32, 128, False),
            {"attention_mask": padding, "use_causal_mask": True},
        ),
    ]


def _timed_rounds(steps, rounds, iterations):
    """{case: {"ours": [seconds per round], "reference": [...]}}, the two sides interleaved round by round."""
    timings = {name: {"ours": [], "reference": []} for name, *_ in steps}
    print(f"timing {len(steps)} pairs x {rounds} rounds x {iterations} steps ...", flush=True)
    for round_index in range(rounds):
        for name, _, ours_step, _, reference_step in steps:
            # Alternate which side goes first, so neither always gets the warmer cache.
            order = [("ours", ours_step), ("reference", reference_step)]
            for side, step in order if round_index % 2 == 0 else order[::-1]:
                timings[name][side].append(_time(step, iterations))
    return timings


def _row(name, ours, reference, timings, args):
    """One case's medians and ratio; with the query/key FLOPs of a collaborative layer against its standard one."""
    ours_ms, reference_ms = statistics.median(timings["ours"]) * 1e3, statistics.median(timings["reference"]) * 1e3
    row = {"case": name, "ours_ms": ours_ms, "reference_ms": reference_ms, "speed_ratio": reference_ms / ours_ms}
    if isinstance(ours, CollaborativeAttention) and isinstance(reference, StandardAttention):
        ours_flops = ours.query_key_flops(args.length) * args.batch
        reference_flops = reference.query_key_flops(args.length) * args.batch
        row.update(
            query_key_gflops=ours_flops / 1e9,
            reference_query_key_gflops=reference_flops / 1e9,
            query_key_flop_reduction=reference_flops / ours_flops,
        )
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    parser.add_argument("--iterations", type=int, default=5, help="steps per round")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this text")
    parser.add_argument("--out", default=None, help="JSON output (default benchmarks/results/attention_<backend>.json)")
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    backend = keras.backend.backend()

    steps = []
    cases = [case for case in _cases(args.batch, args.length) if args.only in case[0]]
    if not cases:
        raise SystemExit(f"no case name contains --only={args.only!r}")
    for name, width, ours, reference, call_kwargs in cases:
        x = np.random.default_rng(0).normal(size=(args.batch, args.length, width)).astype("float32")
        ours(x), reference(x)
        ours_step, reference_step = _compiled_step(ours, x, call_kwargs), _compiled_step(reference, x, call_kwargs)
        ours_step(), reference_step()  # compile
        steps.append((name, ours, ours_step, reference, reference_step))

    timings = _timed_rounds(steps, args.rounds, args.iterations)
    rows = [_row(name, ours, reference, timings[name], args) for name, ours, _, reference, _ in steps]

    print(
        f"\nbackend={backend} batch={args.batch} length={args.length} forward+backward, XLA, median of {args.rounds} rounds"
    )
    print(f"{'case':62s} {'ours ms':>9s} {'ref ms':>9s} {'ref/ours':>9s} {'q/k FLOPs ref/ours':>19s}")
    for row in rows:
        flops = f"{row['query_key_flop_reduction']:.2f}x" if "query_key_flop_reduction" in row else ""
        print(
            f"{row['case']:62s} {row['ours_ms']:9.2f} {row['reference_ms']:9.2f} {row['speed_ratio']:9.3f} {flops:>19s}"
        )

    record = {
        "backend": backend,
        "keras": keras.__version__,
        "machine": platform.machine(),
        "processor": platform.processor() or platform.platform(),
        "cpu_count": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
        "args": vars(args),
        "rows": rows,
        "raw_seconds": timings,
    }
    out = args.out or os.path.join(os.path.dirname(__file__), "results", f"attention_{backend}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    temporary = out + ".tmp"  # not training.files: it imports TensorFlow, which a JAX timing run must not load
    with open(temporary, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(temporary, out)
    print(f"\nwrote {out}")


class _SelfAttention(keras.layers.Layer):
    """keras.layers.MultiHeadAttention called as self-attention, like our layers."""

    def __init__(self, attention):
        super().__init__(name="keras_multi_head_attention")
        self.attention = attention

    def call(self, x):
        return self.attention(x, x)


if __name__ == "__main__":
    main()
