"""What a smaller embedding saves downstream: exact top-10 retrieval over 100k vectors.

The point of a 512-wide encoder that matches a 1024-wide one: every stored vector is half
the size and every query half the work. This measures exact (brute-force) inner-product
search, float32, over `--vectors` unit vectors at each dimension, for batches of queries:
index memory, latency per query batch (p50) and queries per second, and the ratio of the
1024-dim cost to the 512-dim cost measured in the same run (interleaved rounds).

    python benchmarks/retrieval_benchmark.py [--vectors 100000 --dims 512 1024]
"""

import argparse
import json
import os
import pathlib
import platform
import time

import numpy as np

RESULTS = pathlib.Path(__file__).parent / "results"


def top_k(index_NxD, queries_QxD, k):
    scores_QxN = queries_QxD @ index_NxD.T
    best = np.argpartition(-scores_QxN, k, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores_QxN, best, axis=1), axis=1)
    return np.take_along_axis(best, order, axis=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vectors", type=int, default=100_000)
    parser.add_argument("--dims", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--queries", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", default=str(RESULTS / "retrieval_benchmark.json"))
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    indexes, queries = {}, {}
    for dim in args.dims:
        index = rng.standard_normal((args.vectors, dim), dtype=np.float32)
        indexes[dim] = index / np.linalg.norm(index, axis=1, keepdims=True)
        queries[dim] = [indexes[dim][rng.integers(0, args.vectors, args.queries)] for _ in range(args.rounds)]
    for dim in args.dims:  # warm-up; a stored vector must find itself first
        assert (
            top_k(indexes[dim], queries[dim][0], 10)[:, 0] == np.argmax(queries[dim][0] @ indexes[dim].T, axis=1)
        ).all()
    timings = {dim: [] for dim in args.dims}
    for round_index in range(args.rounds):
        for dim in args.dims:
            start = time.perf_counter()
            top_k(indexes[dim], queries[dim][round_index], 10)
            timings[dim].append(time.perf_counter() - start)
    rows = []
    for dim in args.dims:
        p50 = float(np.percentile(timings[dim], 50))
        rows.append(
            {
                "dim": dim,
                "index_mb": indexes[dim].nbytes / 2**20,
                "p50_ms": 1000 * p50,
                "queries_per_s": args.queries / p50,
            }
        )
        print(
            f"dim {dim:5d}: index {rows[-1]['index_mb']:7.1f} MiB, top-10 of {args.queries} queries p50 {rows[-1]['p50_ms']:7.1f} ms, "
            f"{rows[-1]['queries_per_s']:8.0f} queries/s"
        )
    if len(rows) >= 2:
        print(
            f"cost ratio dim {rows[-1]['dim']} / dim {rows[0]['dim']}: time {rows[-1]['p50_ms'] / rows[0]['p50_ms']:.2f}x, "
            f"memory {rows[-1]['index_mb'] / rows[0]['index_mb']:.2f}x"
        )
    record = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
        "vectors": args.vectors,
        "queries_per_batch": args.queries,
        "rounds": args.rounds,
        "rows": rows,
    }
    temporary = pathlib.Path(args.out).with_suffix(".json.tmp")  # numpy only: no TensorFlow import for one atomic write
    temporary.write_text(json.dumps(record, indent=1))
    os.replace(temporary, args.out)


if __name__ == "__main__":
    main()
