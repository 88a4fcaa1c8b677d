"""`concise-export`: a trained BERT run -> TF-Hub encoder + preprocessor, TF Serving model, tarball.

    concise-export --run runs/bert --out exported            # next free version
    concise-export --run runs/bert --out exported --version 1 --overwrite

Writes OUT/hub/<version>/{encoder,preprocess,hub.tar.gz} and OUT/serving/<version>/ (+
OUT/serving/models.config) through a staging folder: a failed export leaves nothing, and
an existing version is only replaced with --overwrite.
"""

import argparse
import json
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="concise-export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="run directory of a BERT run (config.json, model.weights.h5, vocab.txt)")
    parser.add_argument("--out", required=True, help="export directory (versions already in it are kept)")
    parser.add_argument("--version", type=int, help="integer version (default: one above the highest present)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing version")
    parser.add_argument("--seq-length", type=int, help="sequence length of the preprocessor and serving model (default min(128, max))")
    parser.add_argument("--model-name", help="TF Serving model name (default: the run's config name)")
    parser.add_argument("--pooling", choices=("mean", "cls"), default="mean", help="serving embedding: mean of tokens or pooled [CLS]")
    args = parser.parse_args(argv)
    from export.savedmodels import export_run

    try:
        written = export_run(args.run, args.out, version=args.version, overwrite=args.overwrite, seq_length=args.seq_length,
                             model_name=args.model_name, pooling=args.pooling)
    except ValueError as error:
        parser.exit(2, f"concise-export: error: {error}\n")
    print(json.dumps(written, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
