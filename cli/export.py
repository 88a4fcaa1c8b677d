"""`concise-export`: a trained BERT -> TF-Hub encoder + preprocessor, Keras preset, TF Serving model, tarball.

    concise-export --run runs/bert --out exported            # next free version
    concise-export --run converted --out exported            # a concise-collaborative output
    concise-export --hf-dir path/to/bert --out exported      # a Hugging Face BERT folder, as it is
    concise-export --run runs/bert --out exported --version 1 --overwrite
    concise-export --preset concise-minilm-d192 --out exported --onnx   # + an ONNX model folder
    concise-export --out exported --recover                  # only finish/clean up killed exports

Writes OUT/hub/<version>/{encoder,preprocess,keras,hub.tar.gz,export.json} (+ onnx/ with --onnx) and OUT/serving/<version>/
(+ OUT/serving/models.config) through a staging folder and a commit journal
(export/commit.py): a failed or killed export never leaves a version half-written, the
next export finishes or removes what a killed one left, and an existing version is only
replaced with --overwrite. OUT may be a gs:// path.
"""

import argparse
import json
import sys

from concise_attention.export import commit
from concise_attention.export.savedmodels import GFileStore
from concise_attention.export.savedmodels import POOLINGS
from concise_attention.export.savedmodels import export_run
from concise_attention.training.run import configs


def _parser():
    parser = argparse.ArgumentParser(
        prog="concise-export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--run", help="a run directory (config.json, backbone.weights.h5, vocab.txt) or a concise-collaborative output"
    )
    source.add_argument(
        "--hf-dir", help="a Hugging Face BERT folder (config.json, model.safetensors, vocab.txt, tokenizer_config.json)"
    )
    source.add_argument("--preset", help="a preset shipped with the package (by name) or a Keras preset folder")
    parser.add_argument("--out", required=True, help="export directory (versions already in it are kept)")
    parser.add_argument("--version", type=int, help="integer version (default: one above the highest present)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing version")
    parser.add_argument(
        "--seq-length",
        type=int,
        help="sequence length of the preprocessor and serving model (default: the length the model records for serving, "
        "a shipped preset's 256 or a sentence-transformers folder's max_seq_length, else a run's own "
        "training.sequence_length, else 128)",
    )
    parser.add_argument("--model-name", help="TF Serving model name (default: the run's config name)")
    parser.add_argument(
        "--pooling",
        choices=POOLINGS,
        default=None,
        help="the served `embedding` (and the TF-Hub encoder's): mean of the real tokens, that mean at unit length, or the "
        "pooled [CLS]; default: the sentence embedding the model was distilled to give, or its sentence-transformers "
        "pooling (normalized_mean or mean), else mean",
    )
    parser.add_argument(
        "--onnx",
        action="store_true",
        help="also write OUT/hub/<version>/onnx/: the encoder as ONNX, a tokenizers tokenizer.json and "
        "sentence-transformers' pooling (for ONNX Runtime, sentence-transformers' ONNX backend, fastembed; needs "
        "pip install 'concise-attention[onnx]')",
    )
    parser.add_argument(
        "--xla",
        action="store_true",
        help="the serving model runs a request of one text compiled by XLA (faster at batch 1 on CPU; TF Serving then "
        "needs --xla_cpu_compilation_enabled=true); an encoder's serving model only",
    )
    parser.add_argument(
        "--recover",
        action="store_true",
        help="only finish the commits of killed exports into OUT and remove their leftovers",
    )
    return parser


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.recover and not (args.run or args.hf_dir or args.preset):
        parser.error("--run, --hf-dir or --preset is required (unless --recover)")
    with configs.one_line_errors(parser, "concise-export"):
        if args.recover:
            print(json.dumps(commit.recover(args.out, _store(args.out)), indent=1))
            return 0
        commit.check_out_dir(args.out, _store(args.out))  # before any model is loaded or built
        written = export_run(
            args.run or args.hf_dir or args.preset,
            args.out,
            version=args.version,
            overwrite=args.overwrite,
            seq_length=args.seq_length,
            model_name=args.model_name,
            pooling=args.pooling,
            kind="hf" if args.hf_dir else None,
            onnx=args.onnx,
            xla=args.xla,
        )
    print(json.dumps(written, indent=1))
    return 0


def _store(out):
    if "://" not in str(out):
        return commit.LocalStore()
    return GFileStore()


if __name__ == "__main__":
    sys.exit(main())
