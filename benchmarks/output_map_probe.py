"""Whether a 192-d student scores higher on MTEB's protocols read through a linear map fitted after training.

    python benchmarks/output_map_probe.py --encoder concise-minilm-d192 --fit-texts general-corpus

Embeds --fit-count texts of the corpus' training split (as `concise-evaluate --teacher` draws them: never an
evaluation text) with the student and its teacher, fits ridge least-squares maps from the student's unit embedding
to the teacher's (384-d) and to the teacher's uncentred PCA to the student's width (linear, and affine), and scores
the student through each map (at unit length) on the test and dev splits. A linear map to any width reads the
student's own 192 dimensions under another metric: the cosines are those of a 192 x 192 map. Results: --out (JSON).
"""

import argparse
import json
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import provenance  # noqa: E402  (benchmarks/, beside this script)

RIDGE = 1e-3  # times the number of texts: the strength `distill_eval.py`'s least-squares map uses


def fitted_maps(student, teacher, texts):
    """{name: embeddings -> mapped embeddings}: the identity and three maps fitted on `texts`."""
    from sklearn.decomposition import PCA

    x, y = student.encode(texts), teacher.encode(texts)
    principal = y @ PCA(student.width, random_state=0).fit(y).components_.T

    def with_bias(e):
        return np.hstack([e, np.ones((len(e), 1), e.dtype)])

    def solve(a, b):
        return np.linalg.solve(a.T @ a + RIDGE * len(a) * np.eye(a.shape[1]), a.T @ b)

    to_teacher, to_principal, affine = solve(x, y), solve(x, principal), solve(with_bias(x), principal)
    return {
        "the student": lambda e: e,
        "linear map to the teacher": lambda e: e @ to_teacher,
        "linear map to the teacher's uncentred PCA": lambda e: e @ to_principal,
        "affine map to the teacher's uncentred PCA": lambda e: with_bias(e) @ affine,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoder", default="concise-minilm-d192", help="a student: preset, run or preset folder")
    parser.add_argument("--fit-texts", required=True, help="the corpus folder the maps are fitted on")
    parser.add_argument("--fit-count", type=int, default=20000)
    parser.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "output_map_probe.json"))
    args = parser.parse_args(argv)
    from concise_attention.cli.evaluate import draw_fit_texts
    from concise_attention.training.inference import encoders
    from concise_attention.training.inference import mteb_protocol
    from concise_attention.training.inference.embeddings import unit_rows
    from concise_attention.training.tasks.distill import default_teacher

    student = encoders.load_encoder(args.encoder, 256)
    teacher = encoders.load_encoder(default_teacher(), 256)
    maps = fitted_maps(student, teacher, draw_fit_texts(args.fit_texts, args.fit_count))
    embedded = {}  # every map reads the same calls' embeddings: each text list is embedded once

    def student_embeddings(texts):
        if tuple(texts) not in embedded:
            embedded[tuple(texts)] = student.encode(texts)
        return embedded[tuple(texts)]

    rows = {}
    for name, mapped in maps.items():
        embed = lambda texts, mapped=mapped: unit_rows(mapped(student_embeddings(texts)).astype(np.float32))  # noqa: E731
        rows[name] = {
            split: mteb_protocol.with_mean(mteb_protocol.evaluate(embed, split=split)) for split in ("test", "dev")
        }
        print(name, json.dumps(rows[name]), flush=True)
    result = {**provenance.header(__file__, argv), "encoder": args.encoder, "teacher": teacher.name, "rows": rows}
    provenance.write(args.out, result)


if __name__ == "__main__":
    main()
