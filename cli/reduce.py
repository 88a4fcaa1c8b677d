"""`concise-reduce`: a narrower sentence embedding from any encoder, by its principal directions, without training.

    concise-reduce path/to/all-MiniLM-L6-v2 --width 192 --fit-texts general-corpus --out minilm-192
    python -c "from concise_attention import SentenceEncoder; print(SentenceEncoder.from_preset('minilm-192').width)"

Embeds --fit-count texts drawn from the training split of --fit-texts (never an evaluation text: as `concise-evaluate
--teacher` draws them): a corpus folder of .txt files, or one .txt file, one text a line (your own texts fit the
directions to what you embed; every 20th line is held out). Fits scikit-learn's PCA to their unit embeddings and
writes OUT as a Keras preset folder: the source encoder with an output projection (`model.output_size`) onto the
--width leading principal directions. The corpus mean is not subtracted, so the projection is linear and sits inside
the encoder (sentence-transformers' Dense module after pooling, as its dimensionality-reduction example adds one):
every export serves it, and its cosines are those of `concise-evaluate`'s "PCA to W, uncentred" row. The cost is the
source's; the embedding is W wide. OUT loads, evaluates, exports and fine-tunes as any preset folder. It is written
into a temporary folder renamed at the end: a refused or failed command leaves nothing behind, and an existing OUT is
kept unless --overwrite.
"""

import argparse
import pathlib
import sys

from concise_attention.cli.evaluate import FIT_COUNT
from concise_attention.cli.evaluate import draw_fit_texts
from concise_attention.export.savedmodels import write_keras_preset
from concise_attention.models.checks import check_integer
from concise_attention.models.shrink import with_output_projection
from concise_attention.training import artifacts
from concise_attention.training import files
from concise_attention.training.inference import encoders
from concise_attention.training.run import configs


def reduced(spec, width, fit_texts, fit_count=FIT_COUNT):
    """(source, its name, the reduced encoder, the number of texts fitted on, the share of their embeddings' variance
    the directions keep) of the encoder named by `spec` (a preset, run, Keras preset or Hugging Face folder)."""
    texts = draw_fit_texts(fit_texts, fit_count)  # a bad corpus is refused before the encoder loads
    source = artifacts.read(spec)
    encoder = encoders.load_encoder(spec)
    if not isinstance(encoder, encoders.Loaded):
        raise ValueError(f"{spec} is a served model (a concise-export folder): give the model it was exported from.")
    if width >= encoder.width:
        raise ValueError(f"--width must be narrower than the encoder's {encoder.width}. Received: --width={width}")
    if len(texts) <= width:
        raise ValueError(f"--fit-texts {fit_texts} gives {len(texts)} texts: more than --width={width} are needed.")
    pca = encoders.TeacherPca(encoder, texts, width).pca
    backbone = encoder.sentence_encoder.backbone
    kept = float(pca.explained_variance_ratio_.sum())
    return source, encoder.name, with_output_projection(backbone, pca.components_.T), len(texts), kept


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="concise-reduce", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", help="a shipped preset, Keras preset folder, run directory or Hugging Face folder")
    parser.add_argument("--width", type=int, required=True, help="the embedding width of OUT")
    parser.add_argument(
        "--fit-texts",
        required=True,
        help="the texts the PCA is fitted on: a folder of .txt files or one .txt file, one text a line",
    )
    parser.add_argument("--fit-count", type=int, default=FIT_COUNT, help=f"texts to fit on (default {FIT_COUNT})")
    parser.add_argument("--out", required=True, help="the Keras preset folder to write")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    with configs.one_line_errors(parser, "concise-reduce"):
        if out.exists() and not args.overwrite:
            raise ValueError(f"{out} exists; pass --overwrite to replace it.")
        check_integer("--width", args.width)
        check_integer("--fit-count", args.fit_count)
        source, name, narrow, fitted, kept = reduced(args.source, args.width, args.fit_texts, args.fit_count)
        with files.staged_folder(out) as staging:
            write_keras_preset(staging, narrow, source.vocabulary, source)
    print(
        f"wrote {out}: {name} at width {args.width}, fitted on {fitted:,} texts"
        + (f" (all --fit-texts holds: fewer than --fit-count={args.fit_count:,})" if fitted < args.fit_count else "")
        + f"; the directions keep {100 * kept:.1f}% of their variance"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
