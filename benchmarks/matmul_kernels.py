"""The matrix products of one request in TensorFlow's CPU kernels against ONNX Runtime's, same matrices, same run.

    python benchmarks/matmul_kernels.py --runtime-path ENV/bin/python [--rounds 5] [--out results/matmul_kernels.json]

ENV is the peers' environment of `runtimes_benchmark.py` (onnx and onnxruntime in it). The product timed is the
feed-forward chain of all-MiniLM-L6-v2's six layers: x (rows, 384) through twelve float32 matrices, alternately
(384, 1536) and (1536, 384), 28 MB of weights, random values (a kernel's speed does not depend on them). Rows: 16
(one short text, a batch-1 request) and 512 (32 such texts). Milliseconds per chain, the median of ROUNDS rounds in
which every variant runs once, 2 threads each:

  tensorflow          tf.matmul in a tf.function (oneDNN's kernels where TensorFlow enables them, else Eigen's)
  tensorflow_xla      the same compiled by XLA (jit_compile=True)
  tensorflow_bf16     the weights and x in bfloat16 (not exact: a measure of what halving the bytes buys)
  onnxruntime         the same twelve MatMul nodes as an ONNX graph in ONNX Runtime, in ENV's Python

The ratio is each variant's time over ONNX Runtime's. `runtimes_benchmark.py` times whole requests; this isolates
the kernels, which no graph change of ours reaches.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys

import numpy as np

SHAPES = [(384, 1536), (1536, 384)] * 6
ROWS = (16, 512)
CALLS = {16: 50, 512: 5}
THREADS = 2


def weights():
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(shape) / np.sqrt(shape[0])).astype("float32") for shape in SHAPES]


def inputs(rows):
    return np.random.default_rng(rows).standard_normal((rows, SHAPES[0][0])).astype("float32")


def milliseconds(call, calls):
    """Mean milliseconds of `calls` calls after 5 warm-up calls."""
    import time

    for _ in range(5):
        call()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1000


def tensorflow_variants():
    """{variant: function(x) -> y} on TensorFlow."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(THREADS)
    float32 = [tf.Variable(matrix) for matrix in weights()]
    bfloat16 = [tf.Variable(tf.cast(matrix, tf.bfloat16)) for matrix in weights()]

    def chain(x, matrices):
        for matrix in matrices:
            x = tf.matmul(x, matrix)
        return x

    plain = tf.function(lambda x: chain(x, float32))
    xla = tf.function(lambda x: chain(x, float32), jit_compile=True)
    half = tf.function(lambda x: tf.cast(chain(tf.cast(x, tf.bfloat16), bfloat16), tf.float32))
    return {"tensorflow": plain, "tensorflow_xla": xla, "tensorflow_bf16": half}


def onnxruntime_round():
    """{rows: ms} of the chain in ONNX Runtime: the worker run in the peers' environment."""
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    nodes, initializers, previous = [], [], "x"
    for index, matrix in enumerate(weights()):
        initializers.append(numpy_helper.from_array(matrix, f"w{index}"))
        nodes.append(helper.make_node("MatMul", [previous, f"w{index}"], [f"h{index}"]))
        previous = f"h{index}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", SHAPES[0][0]])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, ["rows", SHAPES[-1][1]])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {rows: {"x": inputs(rows)} for rows in ROWS}  # drawn once: the timed calls run the graph alone
    return {rows: milliseconds(lambda: session.run(None, feeds[rows]), CALLS[rows]) for rows in ROWS}


def measure(runtime_path, rounds):
    """{rows: {variant: [ms per round]}}, the variants alternating inside each round."""
    variants = tensorflow_variants()
    times = {rows: {name: [] for name in [*variants, "onnxruntime"]} for rows in ROWS}
    for _ in range(rounds):
        for rows in ROWS:
            x = inputs(rows)
            for name, function in variants.items():
                times[rows][name].append(milliseconds(lambda: function(x), CALLS[rows]))
        worker = subprocess.run(
            [runtime_path, os.path.abspath(__file__), "--worker"], capture_output=True, text=True, check=True
        )
        for rows, value in json.loads(worker.stdout.strip().splitlines()[-1]).items():
            times[int(rows)]["onnxruntime"].append(value)
    return times


def summary(times):
    """{rows: {variant: {ms, ratio to onnxruntime}}} of the rounds' medians."""
    result = {}
    for rows, variants in times.items():
        reference = float(np.median(variants["onnxruntime"]))
        result[str(rows)] = {
            name: {"ms": round(float(np.median(values)), 3), "ratio": round(float(np.median(values)) / reference, 2)}
            for name, values in variants.items()
        }
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime-path", help="the Python of the peers' environment (onnx, onnxruntime)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(onnxruntime_round()))
        return
    if not args.runtime_path or not os.path.isfile(args.runtime_path):
        parser.exit(2, f"matmul_kernels.py: error: --runtime-path must name the peers' Python: {args.runtime_path!r}\n")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import provenance

    result = {**provenance.header(__file__, argv), "rows": summary(measure(args.runtime_path, args.rounds))}
    print(json.dumps(result["rows"], indent=1))
    if args.out:
        provenance.write(args.out, result)


if __name__ == "__main__":
    main()
