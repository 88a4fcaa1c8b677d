"""A prepared data folder as one compact archive, to copy to a machine where space or transfer is scarce.

    python scripts/prepared_archive.py pack PREPARED_DIR ARCHIVE.tar.xz [--train-shards N]
    python scripts/prepared_archive.py unpack ARCHIVE.tar.xz PREPARED_DIR

`concise-prepare-data` stores every field as int32 (numpy's format, readable anywhere); token ids
of a 32k vocabulary, segment ids and positions need 16 bits or fewer, so the archive holds each
field in the smallest unsigned type that holds its values, xz-compressed: about a tenth of the
folder. `unpack` rebuilds every shard byte for byte and checks it against the SHA-256 that `pack`
recorded from the original file before writing it; the manifest comes last (as `concise-prepare-data`
writes it), so a folder where a shard was refused is never a prepared folder.

`--train-shards N` keeps the first N training shards (the rows are stored in a seeded random
order, so they are a uniform sample of the corpus) and every held-out shard; the manifest then
lists those shards, their rows and tokens, and says under "subset_of" what the whole split held.
Needs numpy and this package only (no TensorFlow), so it runs on the GPU machine too.
"""

import argparse
import hashlib
import io
import json
import os
import pathlib
import sys
import tarfile

import numpy as np

from concise_attention.training.data import shards

INDEX = "archive.json"
VOCABULARY_FILES = (shards.VOCABULARY, f"{shards.VOCABULARY}.sha256")  # the second: the vocabulary's recorded hash


def _smallest_unsigned(values):
    for dtype in (np.uint8, np.uint16, np.uint32):
        if values.size == 0 or (values.min() >= 0 and values.max() <= np.iinfo(dtype).max):
            return dtype
    raise ValueError(f"Values from {values.min()} to {values.max()} do not fit an unsigned 32-bit field.")


def _add(archive, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def _array_bytes(array):
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _subset_manifest(manifest, train_shards):
    """The manifest of the first `train_shards` training shards (all of them when None)."""
    train = manifest["splits"]["train"]
    if train_shards is None or train_shards >= len(train["shards"]):
        return manifest
    kept = train["shards"][:train_shards]
    subset = {
        "shards": kept,
        "rows": sum(shard["rows"] for shard in kept),
        "tokens": None,
        "subset_of": {key: train[key] for key in ("rows", "lines", "tokens")} | {"shards": len(train["shards"])},
    }
    return manifest | {"splits": manifest["splits"] | {"train": subset}}


def pack(prepared_dir, archive_path, train_shards=None):
    """Writes the archive of `prepared_dir` (its first `train_shards` training shards)."""
    manifest = _subset_manifest(shards.read_manifest(str(prepared_dir)), train_shards)
    index, subset_tokens = {"fields": manifest["fields"], "shards": {}}, 0
    temporary = f"{archive_path}.tmp-{os.getpid()}"
    with tarfile.open(temporary, "w:xz") as archive:
        for name in VOCABULARY_FILES:
            if (pathlib.Path(prepared_dir) / name).exists():
                _add(archive, name, (pathlib.Path(prepared_dir) / name).read_bytes())
        for split in shards.SPLITS:
            for shard in manifest["splits"][split]["shards"]:
                data = (pathlib.Path(prepared_dir) / shard["file"]).read_bytes()
                rows = np.load(io.BytesIO(data), allow_pickle=False)
                index["shards"][shard["file"]] = hashlib.sha256(data).hexdigest()
                for position, field in enumerate(manifest["fields"]):
                    values = rows[:, position]
                    _add(
                        archive, f"{shard['file']}.{field}.npy", _array_bytes(values.astype(_smallest_unsigned(values)))
                    )
                if split == "train" and "subset_of" in manifest["splits"]["train"]:
                    subset_tokens += int(np.count_nonzero(rows[:, manifest["fields"].index("segment_ids")]))
        if "subset_of" in manifest["splits"]["train"]:
            manifest["splits"]["train"]["tokens"] = subset_tokens
        _add(archive, shards.MANIFEST, shards.manifest_bytes(manifest))
        _add(archive, INDEX, json.dumps(index, indent=1).encode())
    os.replace(temporary, archive_path)
    return manifest


def unpack(archive_path, out_dir):
    """Rebuilds the prepared folder; a shard that differs from the packed original is an error."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive_path, "r:xz") as archive:
        members = {member.name: member for member in archive.getmembers()}

        def read(name):
            return archive.extractfile(members[name]).read()

        index = json.loads(read(INDEX))
        for name in VOCABULARY_FILES:
            if name in members:
                (out / name).write_bytes(read(name))
        for name, sha256 in index["shards"].items():
            fields = [np.load(io.BytesIO(read(f"{name}.{field}.npy")), allow_pickle=False) for field in index["fields"]]
            data = shards.shard_bytes(np.stack(fields, axis=1).astype(np.int32))
            if hashlib.sha256(data).hexdigest() != sha256:
                raise ValueError(
                    f"{archive_path}: {name} does not rebuild to the packed shard (sha256 {sha256[:12]}...)."
                )
            (out / name).write_bytes(data)
        (out / shards.MANIFEST).write_bytes(read(shards.MANIFEST))
    return json.loads((out / shards.MANIFEST).read_text())


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python scripts/prepared_archive.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="prepared folder -> archive")
    packing.add_argument("prepared_dir")
    packing.add_argument("archive")
    packing.add_argument("--train-shards", type=int, help="keep the first N training shards (N >= 1)")
    unpacking = commands.add_parser("unpack", help="archive -> prepared folder")
    unpacking.add_argument("archive")
    unpacking.add_argument("prepared_dir")
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            if args.train_shards is not None and args.train_shards < 1:
                raise ValueError(f"--train-shards must be at least 1. Received: {args.train_shards}")
            manifest = pack(args.prepared_dir, args.archive, args.train_shards)
        else:
            manifest = unpack(args.archive, args.prepared_dir)
    except (ValueError, OSError, tarfile.TarError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    train = manifest["splits"]["train"]
    print(f"{args.command}: {len(train['shards'])} training shards, {train['rows']} rows, {train['tokens']} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
