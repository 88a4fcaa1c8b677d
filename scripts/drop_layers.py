"""A run directory of fewer layers from a trained run: the starting point of a shallower student (`task.init`).

    python scripts/drop_layers.py runs/d192_general_s0 runs/d192_general_l5_init --layers 5

Keeps layer round(i * L / n) of the run's L layers for each of the new n (`models.shrink`: 6 -> 5 drops layer 3),
every other weight as it is; writes OUT/config.json (the run's, num_layers n), OUT/vocab.txt and
OUT/backbone.weights.h5. A distill run started from it fits its projection to the teacher's space first.
"""

import argparse
import os
import shutil

from concise_attention.models import BUILDERS
from concise_attention.models.shrink import shrink_into
from concise_attention.training import files
from concise_attention.training import artifacts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a trained run directory")
    parser.add_argument("out", help="the new run directory (must not exist)")
    parser.add_argument("--layers", type=int, required=True, help="layers to keep")
    args = parser.parse_args(argv)
    try:
        source = artifacts.read(args.run, kind="run")
    except ValueError as error:
        parser.exit(2, f"drop_layers: error: {error}\n")
    if not 1 <= args.layers < source.model["num_layers"]:
        parser.exit(
            2, f"drop_layers: error: --layers {args.layers}: must be in [1, {source.model['num_layers'] - 1}]\n"
        )
    if os.path.exists(args.out):
        parser.exit(2, f"drop_layers: error: {args.out} exists\n")
    full = artifacts.load_backbone(source)
    shallow = BUILDERS[source.model_type](**(source.model | {"num_layers": args.layers}))
    shrink_into(full, shallow)
    config = files.read_json(os.path.join(args.run, "config.json"))
    config["model"]["num_layers"] = args.layers
    config["description"] = (
        f"{args.run} with {args.layers} of its {source.model['num_layers']} layers (scripts/drop_layers.py)"
    )
    staging = f"{args.out}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    shutil.copyfile(os.path.join(args.run, "vocab.txt"), os.path.join(staging, "vocab.txt"))
    files.save_weights(shallow, os.path.join(staging, "backbone.weights.h5"))
    files.write_json_atomically(os.path.join(staging, "config.json"), config)
    os.rename(staging, args.out)


if __name__ == "__main__":
    main()
