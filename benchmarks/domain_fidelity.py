"""How closely a narrower encoder keeps its teacher's geometry on each kind of text, beside the teacher's PCA.

    python benchmarks/domain_fidelity.py --encoder runs/d192 --fit-texts general-corpus [--out FILE.json]

For each text set (the held-out split of --fit-texts, and the texts of each MTEB-protocol task: STSBenchmark's
test sentences, Banking77's test queries), two measures of the encoder against the teacher (all-MiniLM-L6-v2 unless
--teacher), and the same two for the teacher's uncentred PCA to the encoder's width:

  cosine     mean cosine between the teacher's embedding and the encoder's mapped into the teacher's space by
             least squares (fitted on --fit-count training texts of --fit-texts, never on an evaluation text);
  pairs      Spearman correlation between the teacher's and the encoder's cosines of 5,000 random pairs of the set
             (seed 0): how well the ranking of similarities, what retrieval and STS read, is kept.

Evaluation texts are only embedded here, never fitted on. A student far below the PCA on one set and near it on
another lacks training text like that set's (its corpus does not cover the domain), not capacity alone.
"""

import argparse
import json
import pathlib
import sys

import numpy as np
from scipy.stats import spearmanr

from concise_attention.cli.evaluate import draw_fit_texts
from concise_attention.training.data.pipeline import corpus_lines
from concise_attention.training.inference import encoders
from concise_attention.training.inference import mteb_protocol
from concise_attention.training.tasks.distill import default_teacher

PAIRS = 5000
SET_SIZE = 2000


def text_sets(fit_texts):
    """{name: up to SET_SIZE texts}: the corpus' held-out split and each MTEB-protocol task's test texts."""
    sts = mteb_protocol.read_split("STSBenchmark", "test")
    banking = mteb_protocol.read_split("Banking77Classification", "test")
    heldout = [line for line in corpus_lines("text_files", fit_texts, split="eval")() if line.strip()]
    return {
        "corpus held-out": heldout[:SET_SIZE],
        "STSBenchmark test": [row["sentence1"] for row in sts][:SET_SIZE],
        "Banking77 test": [row["text"] for row in banking][:SET_SIZE],
    }


def fidelity(teacher_vectors, vectors, mapping, pairs):
    """{"cosine": mean cosine of the mapped vectors to the teacher's, "pairs": Spearman of pair cosines}."""
    mapped = vectors @ mapping
    cosine = np.sum(mapped * teacher_vectors, axis=1) / np.linalg.norm(mapped, axis=1)
    first, second = pairs
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    ranks = spearmanr(
        np.sum(teacher_vectors[first] * teacher_vectors[second], 1), np.sum(unit[first] * unit[second], 1)
    )
    return {"cosine": float(cosine.mean()), "pairs": float(ranks.statistic)}


def measure(encoder_spec, teacher_spec, fit_texts, fit_count):
    """{set: {encoder name: fidelity, "teacher, PCA to W, uncentred": fidelity}}."""
    teacher, encoder = encoders.load_encoder(teacher_spec), encoders.load_encoder(encoder_spec)
    fit = draw_fit_texts(fit_texts, fit_count)
    teacher_fit, encoder_fit = teacher.encode(fit), encoder.encode(fit)
    components = np.linalg.svd(teacher_fit, full_matrices=False)[2][: encoder.width].T
    student_map = np.linalg.lstsq(encoder_fit, teacher_fit, rcond=None)[0]
    pca_name = f"{teacher.name}, PCA to {encoder.width}, uncentred"
    rows, rng = {}, np.random.default_rng(0)
    for name, texts in text_sets(fit_texts).items():
        pairs = rng.integers(0, len(texts), (2, PAIRS))
        target = teacher.encode(texts)
        rows[name] = {
            encoder.name: fidelity(target, encoder.encode(texts), student_map, pairs),
            pca_name: fidelity(target, target @ components, components.T, pairs),
        }
        print(name, json.dumps(rows[name]), flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoder", required=True, help="the narrower encoder (preset, run or folder)")
    parser.add_argument("--teacher", default=None, help="the teacher (default: all-MiniLM-L6-v2)")
    parser.add_argument("--fit-texts", required=True, help="a text corpus folder (train/ and heldout/ splits)")
    parser.add_argument("--fit-count", type=int, default=20000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import provenance

    rows = measure(args.encoder, args.teacher or default_teacher(), args.fit_texts, args.fit_count)
    result = {**provenance.header(__file__, argv), "rows": rows}
    if args.out:
        provenance.write(args.out, result)
    for name, encoders_row in rows.items():
        for encoder, measures in encoders_row.items():
            print(f"| {name} | {encoder} | {measures['cosine']:.4f} | {measures['pairs']:.4f} |")


if __name__ == "__main__":
    main()
