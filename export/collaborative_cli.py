"""`concise-collaborative`: convert a trained model's attention to collaborative attention.

    concise-collaborative --hf-dir path/to/bert --shared-key-dim 192 --out converted/
    concise-collaborative --run runs/tiny --ratio 0.5 --out converted/

Writes OUT/config.json (the builder and its arguments), OUT/model.weights.h5 and
OUT/conversion_report.json, all into a temporary folder renamed at the end: a failed or
refused conversion leaves nothing behind, and an existing OUT is kept unless --overwrite.
"""

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile

from models.transformer import head_size_of


def _load_source(args):
    if args.hf_dir:
        from models.hf_import import load_hf_bert

        return load_hf_bert(args.hf_dir), "bert"
    from export.run import load_run

    config, model, _ = load_run(args.run)
    # A BERT run holds the encoder and its MLM head; the encoder is converted.
    return (model.encoder if config["model_type"] == "bert" else model), config["model_type"]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="concise-collaborative", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--hf-dir", help="Hugging Face BERT directory (config.json + model.safetensors)")
    source.add_argument("--run", help="our run directory (config.json + model.weights.h5)")
    rank = parser.add_mutually_exclusive_group(required=True)
    rank.add_argument("--shared-key-dim", type=int, help="D~k, the shared query/key width")
    rank.add_argument("--ratio", type=float, help="D~k as a fraction of num_heads * head_size")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=200, help="ALS iterations per layer")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    try:
        if out.exists() and not args.overwrite:
            raise ValueError(f"{out} exists; pass --overwrite to replace it.")
        model, model_type = _load_source(args)
        head_size = head_size_of(model)
        full = model.num_heads * head_size
        shared_key_dim = args.shared_key_dim if args.shared_key_dim is not None else round(args.ratio * full)
        from export.collaborative import convert_model

        converted, reports = convert_model(model, shared_key_dim, seed=args.seed, n_iter_max=args.iterations)
    except ValueError as error:
        parser.exit(2, f"concise-collaborative: error: {error}\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        arguments = {k: v for k, v in converted.get_config().items() if k not in ("name", "trainable", "dtype")}
        (staging / "config.json").write_text(json.dumps({"model_type": model_type, "model": arguments}, indent=1))
        converted.save_weights(staging / "model.weights.h5")
        (staging / "conversion_report.json").write_text(json.dumps(reports, indent=1))
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for report in reports:
        print(f"{report['layer']}: D~k={report['shared_key_dim']} relative error {report['relative_error']:.4f}, "
              f"query/key parameters {report['query_key_parameters_before']:,} -> {report['query_key_parameters_after']:,}, "
              f"FLOPs at length {report['flops_length']} {report['query_key_flops_before']:,} -> {report['query_key_flops_after']:,}, "
              f"{report['seconds']:.1f} s")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
