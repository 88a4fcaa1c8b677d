"""Encoders between two others of one architecture and vocabulary, in weight space, scored with MTEB's protocols.

    python benchmarks/interpolation.py --start $MINILM --end runs/student --shares 0.25,0.5,0.75 [--out FILE.json]
    python benchmarks/interpolation.py --start $MINILM --end runs/student --select-on dev [--out FILE.json]

Each weight of the encoder at share a is (1 - a) * start's + a * end's: with --start the model a run began from and
--end the run, WiSE-FT (Wortsman et al. 2022, robust fine-tuning); with two runs of one recipe and two seeds, a
uniform model soup at 0.5 (Wortsman et al. 2022, model soups). Shares 0 and 1 (the two encoders themselves) are
scored too. A share chosen on these test sets is a selection, not a held-out result: with --select-on dev every
share is scored on the selection protocol (`concise-evaluate --split dev`: STSBenchmark's dev split, Banking77's
train texts that no experiment draws) and only the share with the best dev mean, with 0 and 1, on the test sets.
--save OUT writes the encoder at the chosen share (or at the one share given) as a run directory: --end's config with
an `interpolation` record, its vocabulary and the interpolated backbone.weights.h5, which every command that reads a
finished run reads (concise-evaluate, concise-export, benchmarks/mteb_table.py, export.ship).
"""

import argparse
import json
import os
import pathlib
import shutil
import sys


from concise_attention.training import files
from concise_attention.training.inference import mteb_protocol
from concise_attention.training.inference.embeddings import SentenceEncoder


def shares(text):
    """The --shares list: numbers in [0, 1], 0 and 1 added, sorted."""
    values = sorted({0.0, 1.0, *(float(value) for value in text.split(","))})
    if values[0] < 0 or values[-1] > 1:
        raise ValueError(f"--shares {text}: each share must be within [0, 1]")
    return values


def interpolator(start_spec, end_spec):
    """(the end encoder, a function that sets its weights to those at a share between the two)."""
    start, end = SentenceEncoder.from_preset(start_spec), SentenceEncoder.from_preset(end_spec)
    if start.tokenizer.get_vocabulary() != end.tokenizer.get_vocabulary():
        raise ValueError(f"--start {start_spec} and --end {end_spec} read different vocabularies")
    first = [weight.numpy() for weight in start.backbone.weights]
    last = [weight.numpy() for weight in end.backbone.weights]
    if [array.shape for array in first] != [array.shape for array in last]:
        raise ValueError(f"--start {start_spec} and --end {end_spec} are not of one architecture")

    def move_to(share):
        for variable, a, b in zip(end.backbone.weights, first, last):
            variable.assign((1 - share) * a + share * b)

    return end, move_to


def interpolated_scores(encoder, move_to, values, split="test"):
    """{share: {task: score, "mean": ...}} on `split` of the encoders at `values`."""
    rows = {}
    for share in values:
        move_to(share)
        scores = mteb_protocol.evaluate(encoder.encode, split=split)
        rows[f"{share:g}"] = mteb_protocol.with_mean(scores)
        print(split, share, json.dumps(rows[f"{share:g}"]), flush=True)
    return rows


def scored(encoder, move_to, values, select_on=None):
    """The result's rows: {"rows": test rows of every share}, or with `select_on` {"selection": its rows,
    "chosen": the share of the best mean there, "rows": test rows of 0, the chosen share and 1}."""
    if select_on is None:
        return {"rows": interpolated_scores(encoder, move_to, values)}
    selection = interpolated_scores(encoder, move_to, values, select_on)
    chosen = float(max(selection, key=lambda share: selection[share]["mean"]))
    return {
        "selected_on": select_on,
        "selection": selection,
        "chosen": chosen,
        "rows": interpolated_scores(encoder, move_to, sorted({0.0, chosen, 1.0})),
    }


def save(encoder, end_spec, out, record):
    """Writes `encoder` as it is now as the run directory `out` (module docstring); --end must be a run directory."""
    config = files.read_json(os.path.join(end_spec, files.CONFIG))
    with files.staged_folder(out) as staging:
        files.write_json_atomically(os.path.join(staging, files.CONFIG), config | {"interpolation": record})
        shutil.copyfile(os.path.join(end_spec, files.VOCABULARY), os.path.join(staging, files.VOCABULARY))
        files.save_weights(encoder.backbone, os.path.join(staging, files.BACKBONE_WEIGHTS))


def check_save(args, values):
    if args.save is None:
        return
    if not os.path.isfile(os.path.join(args.end, files.CONFIG)):
        raise ValueError(f"--save needs --end to be a run directory; {args.end} has no {files.CONFIG}")
    if os.path.exists(args.save):
        raise ValueError(f"--save {args.save}: already exists")
    if args.select_on is None and len(values) != 3:
        raise ValueError("--save without --select-on needs exactly one share in --shares")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start", required=True, help="the encoder at share 0 (preset, run or folder)")
    parser.add_argument("--end", required=True, help="the encoder at share 1, of the same architecture and vocabulary")
    parser.add_argument("--shares", default="0.25,0.5,0.75", help="comma-separated shares of --end in [0, 1]")
    parser.add_argument(
        "--select-on",
        choices=["dev"],
        help="choose the share on the selection protocol; only it, 0 and 1 are scored on the test sets",
    )
    parser.add_argument("--out", default=None)
    parser.add_argument("--save", help="a new run directory for the encoder at the chosen share")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import provenance

    try:
        values = shares(args.shares)
        check_save(args, values)
        since = provenance.record()
        encoder, move_to = interpolator(args.start, args.end)
        rows = scored(encoder, move_to, values, args.select_on)
        if args.save:
            share = rows.get("chosen", values[1])
            move_to(share)
            record = {"start": args.start, "end": args.end, "share": share, "selected_on": args.select_on}
            save(encoder, args.end, args.save, record)
    except ValueError as error:
        parser.exit(2, f"interpolation.py: error: {error}\n")
    result = {**provenance.header(__file__, argv, since), "start": args.start, "end": args.end, **rows}
    if args.out:
        provenance.write(args.out, result)


if __name__ == "__main__":
    main()
