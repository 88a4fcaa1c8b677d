"""Crash-safe, versioned commits: OUT/hub/<N> and OUT/serving/<N> land together or not at all.

Pure Python (no TensorFlow): the exporter stages a version, this module puts it in place.

Layout of an export directory OUT:

    OUT/hub/<N>/...                      TF-Hub half of version N; hub/<N>/export.json holds its export id
    OUT/serving/<N>/...                  TF Serving half; serving/<N>/assets.extra/export.json, the same id
    OUT/serving/models.config
    OUT/.export-<id>/                    staging folder of an export that is running (or was killed):
        hub/  serving/  models.config    the new version, complete before anything in OUT changes
        journal.json                     the commit's intent: its moves, in order (written atomically)
        done-<i>                         move i of the journal is done
        replaced-hub/  replaced-serving/ the version being overwritten, moved aside

Protocol, on a local filesystem (where a rename is atomic):
  1. OUT is locked (flock on the folder, held for the whole export: a second export waits;
     the kernel releases it when a process dies, so a killed export never leaves it held).
  2. Recovery: every staging folder with a journal is rolled forward (its moves not yet done
     are done, then the folder is removed); every staging folder without one is removed, as
     nothing in OUT had changed yet (one an earlier version of the exporter left, with
     export.json at its top and no journal, is refused, for a hand to restore). So the leftovers of killed exports (staging folders,
     replaced-* copies, half-committed versions) never outlive the next export, or
     `concise-export --out OUT --recover`.
  3. The version's number is chosen (one above the highest in hub/ or serving/) or checked.
  4. The exporter writes the complete version into a new staging folder.
  5. journal.json is written (temporary file, fsync, rename): the commit point. A kill
     before it leaves every version as it was; after it the next export finishes the commit.
  6. The moves, each one rename followed by its done-<i> marker:
        serving/N -> replaced-serving, hub/N -> replaced-hub   (overwrite only)
        models.config -> serving/models.config, hub -> hub/N, serving -> serving/N
     A move is redone only while its done-<i> is missing and its source still exists (a
     kill between the rename and the marker), so replaying a journal is idempotent.
  7. journal.json is removed, then the staging folder and the replaced version in it.

What readers see, at every instant: each of hub/N and serving/N is absent, the complete
old copy or the complete new one (whole folders are renamed). As the old halves are moved
aside before any new half is put in place, and serving/N is put in place last, whenever
both halves are present they come from the same export (the same export id), and a
version N that TF Serving sees already has its hub half. A version is never lost: once
the journal exists, its old copy is replaced by the new one, never just removed. A TF
Serving server watching serving/ sees a new version appear complete: saved_model.pb,
variables and assets.extra/tf_serving_warmup_requests at once. On an overwrite it sees
serving/N complete-old, absent for the instant between two renames, then complete-new;
TF Serving knows versions by number, so a server that has loaded the old N goes on
serving it from memory unless one of its polls of serving/ falls into that instant (it then
unloads N and loads the new one at its next poll). Export a new version to roll a model out
to running servers; --overwrite is for versions no server has loaded yet.

On an object store (gs:// through tf.io.gfile; see `export.savedmodels.GFileStore`) a
rename is not atomic: the same journal and moves are used, but a move copies every object
and then deletes the source, and a replayed move copies again, so recovery is the same.
Inside a move, a version's files are written before its markers, saved_model.pb after the
rest and export.json (the marker holding the export id) last, and deleted in the reverse
order: a reader that trusts only versions whose hub/N/export.json and
serving/N/assets.extra/export.json hold the same export id, with no journal pending in
OUT, sees versions absent, complete-old or complete-new. TF Serving is not such a reader:
while serving/N is being copied it sees a version folder without saved_model.pb and its
load fails (it retries: --max_num_load_retries, --load_retry_interval_micros); the first
load that finds saved_model.pb finds every variable and asset already written. During an
overwrite it sees the old N lose its saved_model.pb first (a server that has it loaded keeps
it). Object stores have no lock here: run one export into such an OUT at a time.
"""

import contextlib
import dataclasses
import fcntl
import itertools
import json
import os
import posixpath
import secrets
import shutil
import signal

PARTS = ("hub", "serving")
STAGING_PREFIX = ".export-"
JOURNAL = "journal.json"
MODELS_CONFIG = "models.config"
# The marker of each half, written last and deleted first on object stores; it holds the export id.
MARKERS = {"hub": "export.json", "serving": "assets.extra/export.json"}
# Fault injection for the crash tests: with CONCISE_EXPORT_KILL_AT=k, the process SIGKILLs
# itself at the k-th commit point it reaches (see `_commit_point`).
KILL_AT_VARIABLE = "CONCISE_EXPORT_KILL_AT"
_points_reached = itertools.count(1)


class LocalStore:
    """The protocol's file operations on a local POSIX filesystem (atomic renames, flock)."""

    join = staticmethod(posixpath.join)
    exists = staticmethod(os.path.exists)
    isdir = staticmethod(os.path.isdir)
    listdir = staticmethod(os.listdir)

    @staticmethod
    def makedirs(path):
        os.makedirs(path, exist_ok=True)

    @staticmethod
    def move(source, target):
        """Atomic rename; replaces a target file, fails on a non-empty target folder."""
        os.replace(source, target)

    @staticmethod
    def remove(path):
        """Removes a file or a folder tree; nothing if absent."""
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)

    @staticmethod
    def read_text(path):
        with open(path, encoding="utf-8") as file:
            return file.read()

    @staticmethod
    def write_text(path, text):
        with open(path, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())

    @staticmethod
    def working_folder(staging):
        """Where the exporter writes a version staged at `staging`: the staging folder itself."""
        os.makedirs(staging)
        return staging

    @staticmethod
    @contextlib.contextmanager
    def lock(folder):
        """Exclusive lock on the folder, released when the block ends or the process dies."""
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)


@dataclasses.dataclass(frozen=True)
class Staged:
    """A version being exported: the exporter writes hub/, serving/ and models.config into
    `folder`, with `export_id` in both halves' markers (see `MARKERS`); `staging` is its
    staging folder in OUT (the same as `folder` on a local filesystem); `recovered` is what
    the recovery before it did (`recover`)."""

    out: str
    version: int
    export_id: str
    staging: str
    folder: str
    recovered: dict


def versions(out, store=None):
    """The version numbers present in OUT/hub or OUT/serving (either half), sorted."""
    store = store or LocalStore()
    numbers = set()
    for part in PARTS:
        folder = store.join(out, part)
        if store.isdir(folder):
            numbers.update(int(name.rstrip("/")) for name in store.listdir(folder) if name.rstrip("/").isdigit())
    return sorted(numbers)


def check_out_dir(out, store=None):
    """Raises ValueError if OUT (or the nearest existing folder above it) is not a folder."""
    store = store or LocalStore()
    path = str(out)
    while not store.exists(path):
        parent = posixpath.dirname(path.rstrip("/"))
        if parent in ("", path) or ("://" in path and "://" not in parent):
            return
        path = parent
    if not store.isdir(path):
        which = "it" if path == str(out) else f"{path!r}, above it,"
        raise ValueError(f"The export directory (--out) {str(out)!r} cannot be used: {which} is a file, not a folder.")


@contextlib.contextmanager
def export_version(out, version=None, overwrite=False, store=None):
    """Locks OUT, recovers what killed exports left, picks or checks `version` (default: one above
    the highest present; an existing one is replaced only with `overwrite`) and yields a
    `Staged`. The version is committed when the block ends normally; if it raises, the staging
    folder is removed and OUT is as before. A commit interrupted past its commit point is
    finished by the next export or `recover`. `store`: `LocalStore` (default) or `GFileStore`.

    Example:
    >>> with export_version("exported") as staged:
    ...     write_hub_and_serving(staged.folder, staged.export_id)
    """
    out, store = str(out), store or LocalStore()
    check_out_dir(out, store)
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
        raise ValueError(f"`version` must be a positive integer. Received: version={version!r}")
    store.makedirs(out)
    with store.lock(out):
        recovered = _recover(out, store)
        version = version or (versions(out, store) or [0])[-1] + 1
        existing = [
            store.join(out, part, str(version)) for part in PARTS if store.exists(store.join(out, part, str(version)))
        ]
        if existing and not overwrite:
            raise ValueError(
                f"Version {version} already exists ({', '.join(existing)}); pass overwrite=True (--overwrite) to replace it."
            )
        export_id = secrets.token_hex(8)
        staging = store.join(out, STAGING_PREFIX + export_id)
        folder = store.working_folder(staging)
        try:
            yield Staged(out, version, export_id, staging, folder, recovered)
            if folder != staging:
                store.move(folder, staging)
        except BaseException:
            store.remove(folder)
            store.remove(staging)
            raise
        commit(out, staging, version, store)


def commit(out, staging, version, store=None):
    """Puts the version staged in `staging` (hub/, serving/, models.config) in place as
    version `version` of OUT, per the protocol of the module docstring (OUT must be locked)."""
    store = store or LocalStore()
    _commit_point("staged")
    moves = []
    for part in reversed(PARTS):  # serving/N leaves first: TF Serving stops seeing it before hub/N goes
        target = f"{part}/{version}"
        if store.exists(store.join(out, target)):
            moves.append((target, _relative(staging, f"replaced-{part}")))
    moves.append((_relative(staging, MODELS_CONFIG), f"serving/{MODELS_CONFIG}"))
    moves += [(_relative(staging, part), f"{part}/{version}") for part in PARTS]
    _write_journal(staging, {"version": version, "moves": moves}, store)
    _finish(out, staging, moves, store)


def recover(out, store=None):
    """Finishes the commits of killed exports and removes their leftovers (module docstring),
    under OUT's lock; every export does it first.

    Returns:
        {"completed": [staging folders whose version it committed], "removed": [staging
        folders it removed, their export not having reached its commit point]}.
    """
    out, store = str(out), store or LocalStore()
    check_out_dir(out, store)
    if not store.isdir(out):
        return {"completed": [], "removed": []}
    with store.lock(out):
        return _recover(out, store)


def _recover(out, store):
    done = {"completed": [], "removed": []}
    for name in sorted(name.rstrip("/") for name in store.listdir(out)):
        staging = store.join(out, name)
        if not name.startswith(STAGING_PREFIX) or not store.isdir(staging):
            continue
        journal = _read_journal(staging, store)
        if journal is None:
            _refuse_journalless(staging, store)
            store.remove(staging)
            done["removed"].append(name)
        else:
            _finish(out, staging, journal["moves"], store)
            done["completed"].append(name)
    return done


def _relative(staging, name):
    """A path inside the staging folder, relative to OUT (the journal holds no absolute path)."""
    return posixpath.join(posixpath.basename(staging), name)


def _write_journal(staging, journal, store):
    temporary = store.join(staging, "journal.tmp")
    store.write_text(temporary, json.dumps(journal, indent=1))
    store.move(temporary, store.join(staging, JOURNAL))
    _commit_point("journal written")


def _read_journal(staging, store):
    path = store.join(staging, JOURNAL)
    if not store.exists(path):
        return None
    try:
        journal = json.loads(store.read_text(path))
        journal["moves"] = [(str(source), str(target)) for source, target in journal["moves"]]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"The commit journal {path} is unreadable ({error}); move it and its folder away by hand."
        ) from error
    for move in journal["moves"]:
        outside = [name for name in move if not _inside(name)]
        if outside:
            raise ValueError(
                f"The commit journal {path} moves {outside[0]!r}, which is not inside OUT: refused; "
                "move it and its folder away by hand."
            )
    return journal


def _inside(name):
    """Whether a journal's path names something inside OUT: relative, normalised, no `..`, not empty."""
    return (
        bool(name)
        and not name.startswith("/")
        and posixpath.normpath(name) == name
        and ".." not in name.split("/")
        and "://" not in name
    )


def _finish(out, staging, moves, store):
    """Does the journal's moves not yet done (idempotent), then removes the staging folder."""
    for index, (source, target) in enumerate(moves):
        marker = store.join(staging, f"done-{index}")
        if store.exists(marker):
            continue
        if store.exists(store.join(out, source)):
            store.makedirs(posixpath.dirname(store.join(out, target)))
            store.move(store.join(out, source), store.join(out, target))
            _commit_point(f"moved {source} -> {target}")
        store.write_text(marker, "")
        _commit_point(f"done-{index}")
    store.remove(store.join(staging, JOURNAL))
    _commit_point("journal removed")
    store.remove(staging)


def _refuse_journalless(staging, store):
    """A staging folder with export.json but no journal was left by an exporter of an earlier version, killed
    while it renamed: which renames it did is not recorded, so it is neither rolled forward nor removed."""
    if store.exists(store.join(staging, "export.json")):
        raise ValueError(
            f"{staging} was left by an earlier version of the exporter (export.json, no {JOURNAL}): "
            "its renames cannot be finished safely; restore OUT from it by hand and remove it."
        )


def _commit_point(name):
    """A point of the commit where a crash test may kill the process (KILL_AT_VARIABLE)."""
    if os.environ.get(KILL_AT_VARIABLE) == str(next(_points_reached)):
        os.kill(os.getpid(), signal.SIGKILL)
