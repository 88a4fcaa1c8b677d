"""all-mpnet-base-v2 through this project against sentence-transformers' own embeddings of it.

Its environment is the mteb one (`benchmarks/mteb_adapter.py`: PyTorch, sentence-transformers; none is a dependency
of the package) plus pytest (the tests' corpus), with the folder `scripts/join_mpnet.py` writes:

    mteb-env/bin/python benchmarks/mpnet_reference.py --model all-mpnet-base-v2 --out benchmarks/results/mpnet_reference.json

On the tokenisation corpus of the tests (`tests/test_text.py`: >= 3,000 lines of real, multilingual and
adversarial text, less the lines that type one of MPNet's special tokens, which Hugging Face maps to their ids
and BERT's tokenisation cuts like any text): the ids of our tokenizer against the folder's tokenizer.json (Hugging
Face `tokenizers`), cut at its max_seq_length; then `SentenceEncoder.from_preset(folder)` against
`SentenceTransformer(folder).encode` on every `--every`-th line and the longest 32, cosine of each pair.
"""

import argparse
import json
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
TYPED_SPECIAL = ("<s>", "</s>", "<pad>", "<unk>", "<mask>")


def corpus_lines():
    from test_text import build_corpus

    return [line for line in build_corpus() if not any(token in line for token in TYPED_SPECIAL)]


def compare_ids(model, lines, length):
    """(lines whose ids equal tokenizer.json's, lines, first differing lines)."""
    from tokenizers import Tokenizer

    from concise_attention.training.inference import embeddings
    from concise_attention.training import artifacts
    from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer

    reference = Tokenizer.from_file(str(pathlib.Path(model) / "tokenizer.json"))
    reference.no_padding()
    reference.enable_truncation(length)
    expected = [encoding.ids for encoding in reference.encode_batch(lines)]
    source = artifacts.read(model)
    ours = embeddings.token_ids(wordpiece_tokenizer(source.vocabulary, **source.tokenizer), lines, length)
    different = [line for line, mine, theirs in zip(lines, ours, expected) if mine != theirs]
    return len(lines) - len(different), len(lines), different[:5]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the all-mpnet-base-v2 folder (scripts/join_mpnet.py)")
    parser.add_argument("--every", type=int, default=12, help="embed every n-th corpus line (and the 32 longest)")
    parser.add_argument("--out", help="JSON results file")
    args = parser.parse_args(argv)
    from sentence_transformers import SentenceTransformer

    from concise_attention import SentenceEncoder

    lines = corpus_lines()
    reference = SentenceTransformer(args.model, device="cpu")
    identical, total, different = compare_ids(args.model, lines, reference.max_seq_length)
    subset = sorted(set(lines[:: args.every]) | set(sorted(lines, key=len)[-32:]))
    start = time.perf_counter()
    theirs = reference.encode(subset, batch_size=32, normalize_embeddings=True)
    seconds_theirs = time.perf_counter() - start
    encoder = SentenceEncoder.from_preset(args.model)
    start = time.perf_counter()
    ours = encoder.encode(subset, batch_size=32)
    seconds_ours = time.perf_counter() - start
    cosine = np.sum(ours * theirs, axis=1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    import provenance

    result = {
        **provenance.header(__file__, argv),
        "model": str(args.model),
        "max_seq_length": reference.max_seq_length,
        "sequence_length": encoder.sequence_length,
        "ids_identical_lines": identical,
        "lines": total,
        "first_different_lines": different,
        "embedded_lines": len(subset),
        "cosine_min": float(cosine.min()),
        "cosine_mean": float(cosine.mean()),
        "seconds_sentence_transformers": round(seconds_theirs, 1),
        "seconds_ours": round(seconds_ours, 1),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        provenance.write(args.out, result)
    return 0 if identical == total and cosine.min() >= 0.99999 else 1


if __name__ == "__main__":
    sys.exit(main())
