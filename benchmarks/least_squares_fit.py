"""How the least-squares cosine to the teacher (`distill_eval.py`'s `cos, least-squares map`) depends on the number of
training texts the map is fitted on, and on the ridge strength, for one shipped preset.

    python benchmarks/least_squares_fit.py --data-dir corpus [--preset concise-minilm-d192]

Texts as `distill_eval.py` draws them (its held-out texts; its training-split draw, the first N of it for each size);
the held-out cosine and the cosine on the fitted texts themselves (how far the map over-fits). Results: --out (JSON).
"""

import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import distill_eval  # noqa: E402  (benchmarks/, beside this script)
import provenance  # noqa: E402

SIZES = (4096, 10000, 20000, 40000, 80000)
RIDGES = (1e-5, 1e-4, 1e-3, 1e-2)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True, help="a folder built by scripts/make_corpus.py")
    parser.add_argument("--preset", default="concise-minilm-d192")
    parser.add_argument("--out", default=str(distill_eval.RESULTS / "least_squares_fit.json"))
    args = parser.parse_args(argv)
    from concise_attention.training.inference.embeddings import SentenceEncoder
    from concise_attention.training.tasks.distill import default_teacher

    texts, _, drawn = distill_eval.heldout_data(args.data_dir, 2048, 0, max(SIZES))
    teacher = SentenceEncoder.from_preset(default_teacher())
    student = SentenceEncoder.from_preset(args.preset)
    teacher, student = (
        distill_eval.Encoder(name, model.backbone, teacher.tokenizer)
        for name, model in (("teacher", teacher), ("student", student))
    )
    targets, held_out = teacher.embed(drawn), teacher.embed(texts)
    inputs, own = student.embed(drawn), student.embed(texts)
    rows = []
    for size in SIZES:
        for ridge in RIDGES if size == 40000 else (1e-3,):
            mapped = (inputs[:size], targets[:size])
            kernel, bias = distill_eval.ridge_map(*mapped, ridge=ridge)
            fitted = float(np.mean(np.sum(distill_eval.unit(inputs[:size] @ kernel + bias) * targets[:size], axis=1)))
            rows.append(
                {
                    "texts": size,
                    "ridge": ridge,
                    "held_out_cosine": distill_eval.least_squares_cosine(mapped, own, held_out, ridge),
                    "fitted_texts_cosine": fitted,
                }
            )
            print(rows[-1], flush=True)
    result = {**provenance.header(__file__, argv), "preset": args.preset, "held_out_texts": len(texts), "rows": rows}
    provenance.write(args.out, result)


if __name__ == "__main__":
    main()
