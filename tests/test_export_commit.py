"""The export commit protocol (export/commit.py) under SIGKILL at every commit point.

Each export here is a subprocess of the pure-Python commit module writing small fake
artifacts (no TensorFlow): killed at commit point k, it must leave every version in OUT
absent, complete-old or complete-new, and the next export must finish or undo what it
left, clean every leftover and succeed. Every fake file holds its export's id, so a half
made of two exports, or a hub half and a serving half from different exports, is seen.
"""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest

from concise_attention.export import commit

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The files of each half of a fake version (the markers of commit.MARKERS among them).
FILES = {
    "hub": (
        "encoder/saved_model.pb",
        "encoder/variables/variables.index",
        "preprocess/saved_model.pb",
        "hub.tar.gz",
        "export.json",
    ),
    "serving": (
        "saved_model.pb",
        "variables/variables.index",
        "assets.extra/tf_serving_warmup_requests",
        "assets.extra/export.json",
    ),
}
FRESH_POINTS = 9  # staged, journal written, 3 moves x (moved, done), journal removed
OVERWRITE_POINTS = 13  # the same with 2 more moves (the old halves set aside)
PACKAGE_PARENT = []  # the folder _package_without_site makes, while this module's tests run

EXPORT_SCRIPT = r"""
import json, os, sys
from concise_attention.export import commit

out, version = sys.argv[1], None if sys.argv[2] == "next" else int(sys.argv[2])
files = json.loads(sys.argv[3])
with commit.export_version(out, version=version, overwrite=version is not None) as staged:
    for part, names in files.items():
        for name in names:
            path = os.path.join(staged.folder, part, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as file:
                file.write(staged.export_id)
    with open(os.path.join(staged.folder, "models.config"), "w") as file:
        file.write(staged.export_id)
print(json.dumps({"version": staged.version, "export_id": staged.export_id}))
"""


@pytest.fixture(autouse=True, scope="module")
def _package_without_site(tmp_path_factory):
    """A folder holding `concise_attention` (a link to this checkout) for the subprocesses' PYTHONPATH: under -S
    the installed package's path finder (a site .pth file) is not read."""
    parent = tmp_path_factory.mktemp("package")
    (parent / "concise_attention").symlink_to(ROOT, target_is_directory=True)
    PACKAGE_PARENT.append(str(parent))
    yield
    PACKAGE_PARENT.clear()


def _export(out, version="next", kill_at=None):
    """Runs one fake export in a subprocess (-S: the commit module needs the standard library
    only); returns (return code, its json output or None)."""
    env = {**os.environ, "PYTHONPATH": PACKAGE_PARENT[0]}
    env.pop(commit.KILL_AT_VARIABLE, None)
    if kill_at is not None:
        env[commit.KILL_AT_VARIABLE] = str(kill_at)
    result = subprocess.run(
        [sys.executable, "-S", "-c", EXPORT_SCRIPT, str(out), str(version), json.dumps(FILES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode in (0, -signal.SIGKILL), result.stderr[-3000:]
    return result.returncode, json.loads(result.stdout) if result.returncode == 0 else None


def _half(out, part, version):
    """The export id of a complete half, None if absent; fails on an incomplete or mixed one."""
    folder = out / part / str(version)
    if not folder.exists():
        return None
    names = sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())
    assert names == sorted(FILES[part]), (folder, names)
    ids = {(folder / name).read_text() for name in names}
    assert len(ids) == 1, (folder, ids)
    return ids.pop()


def _versions(out, complete=True):
    """{version: export id} of OUT; every half is checked whole, and both halves of a version
    are required (complete=True) or, mid-commit, each one absent or from the same export."""
    numbers = {int(path.name) for part in FILES for path in (out / part).glob("*") if path.name.isdigit()}
    found = {}
    for version in sorted(numbers):
        hub, serving = _half(out, "hub", version), _half(out, "serving", version)
        if complete:
            assert hub is not None and serving is not None, (version, hub, serving)
        assert hub is None or serving is None or hub == serving, (version, hub, serving)
        found[version] = hub or serving
    return found


def _staging_folders(out):
    return sorted(path.name for path in out.iterdir() if path.name.startswith(commit.STAGING_PREFIX))


@pytest.fixture(scope="module")
def one_version(tmp_path_factory):
    """OUT holding version 1, committed by an export that was not killed."""
    out = tmp_path_factory.mktemp("commit") / "out"
    code, written = _export(out)
    assert code == 0 and written["version"] == 1
    assert _versions(out) == {1: written["export_id"]} and _staging_folders(out) == []
    assert (out / "serving" / "models.config").read_text() == written["export_id"]
    return out, written["export_id"]


def _kill_then_export_again(one_version, tmp_path, version, kill_at):
    out, first = one_version
    out = pathlib.Path(shutil.copytree(out, tmp_path / "out"))
    code, _ = _export(out, version, kill_at=kill_at)
    assert code == -signal.SIGKILL, f"commit point {kill_at} not reached"
    (killed,) = [name[len(commit.STAGING_PREFIX) :] for name in _staging_folders(out)]
    during = _versions(out, complete=False)
    assert set(during.values()) <= {first, killed}
    journaled = kill_at >= 2  # point 2: the journal is written (the commit point)
    assert (out / f"{commit.STAGING_PREFIX}{killed}" / commit.JOURNAL).exists() == (
        2 <= kill_at < OVERWRITE_POINTS if version == 1 else 2 <= kill_at < FRESH_POINTS
    )
    code, written = _export(out)  # the next export: recovers, then commits its own version
    assert code == 0 and _staging_folders(out) == []
    return out, first, killed, journaled, written


@pytest.mark.parametrize("kill_at", range(1, FRESH_POINTS + 1))
def test_a_killed_fresh_export_is_finished_or_undone_by_the_next(one_version, tmp_path, kill_at):
    out, first, killed, journaled, written = _kill_then_export_again(one_version, tmp_path, "next", kill_at)
    if journaled:  # past the commit point: version 2 is the killed export's, the next one is 3
        assert _versions(out) == {1: first, 2: killed, 3: written["export_id"]}
    else:
        assert _versions(out) == {1: first, 2: written["export_id"]}
    assert (out / "serving" / "models.config").read_text() == written["export_id"]


@pytest.mark.parametrize("kill_at", range(1, OVERWRITE_POINTS + 1))
def test_a_killed_overwrite_never_loses_version_1(one_version, tmp_path, kill_at):
    out, first, killed, journaled, written = _kill_then_export_again(one_version, tmp_path, 1, kill_at)
    assert _versions(out) == {1: killed if journaled else first, 2: written["export_id"]}


@pytest.mark.parametrize("version, points", [("next", FRESH_POINTS), (1, OVERWRITE_POINTS)])
def test_the_kill_points_are_all_covered(one_version, tmp_path, version, points):
    """The parametrisations above hit every commit point: one point more is never reached."""
    out = pathlib.Path(shutil.copytree(one_version[0], tmp_path / "out"))
    code, written = _export(out, version, kill_at=points + 1)
    assert code == 0 and _versions(out)[written["version"]] == written["export_id"]


def test_a_recovery_killed_at_each_of_its_points_is_finished_by_the_next_one(one_version, tmp_path):
    """An overwrite killed with both old halves set aside (neither hub/1 nor serving/1 in
    place), then the next export killed at each point of its recovery (8) and at the first
    of its own commit: a third export still ends with version 1 new and whole."""
    out, first = one_version
    state = tmp_path / "state"
    shutil.copytree(out, state)
    assert _export(state, 1, kill_at=5)[0] == -signal.SIGKILL
    assert not (state / "hub" / "1").exists() and not (state / "serving" / "1").exists()
    (killed,) = [name[len(commit.STAGING_PREFIX) :] for name in _staging_folders(state)]
    for kill_at in range(1, 10):
        attempt = pathlib.Path(shutil.copytree(state, tmp_path / f"attempt{kill_at}"))
        assert _export(attempt, kill_at=kill_at)[0] == -signal.SIGKILL
        _versions(attempt, complete=False)
        code, written = _export(attempt)
        assert code == 0 and _staging_folders(attempt) == []
        versions = _versions(attempt)
        assert versions[1] == killed and first not in versions.values()
        assert versions[max(versions)] == written["export_id"]


def test_a_staging_folder_of_the_exporter_before_the_journal_is_refused_not_removed(tmp_path):
    """The former exporter kept no journal (its staging folder held export.json at its top): which of its renames
    were done is unknown, so the folder, which may hold the only copy of a replaced version, is left in place and
    the export refuses with one line naming it. A journal-less folder without export.json is removed as ever."""
    out = tmp_path / "out"
    (out / "hub" / "1").mkdir(parents=True)
    (out / "hub" / "1" / "export.json").write_text("new")
    earlier, early = out / ".export-earlier", out / ".export-early"
    (earlier / "replaced-hub").mkdir(parents=True)
    (earlier / "replaced-hub" / "export.json").write_text("old")
    (earlier / "export.json").write_text(json.dumps({"version": 1}))
    (early / "hub").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"\.export-earlier was left by an earlier version of the exporter") as refused:
        commit.recover(out)
    assert "\n" not in str(refused.value)
    assert (earlier / "replaced-hub" / "export.json").read_text() == "old"
    assert (out / "hub" / "1" / "export.json").read_text() == "new"
    shutil.rmtree(earlier)
    assert commit.recover(out) == {"completed": [], "removed": [".export-early"]}


def test_a_lone_half_does_not_block_the_next_default_version(tmp_path):
    out = tmp_path / "out"
    (out / "hub" / "4").mkdir(parents=True)  # e.g. serving/4 deleted by hand
    (out / "serving" / "2").mkdir(parents=True)
    assert commit.versions(out) == [2, 4]
    code, written = _export(out)
    assert code == 0 and written["version"] == 5


@pytest.mark.parametrize("above", [False, True])
def test_export_command_refuses_an_out_that_is_a_file(tmp_path, capsys, above):
    from concise_attention.cli.export import main

    file = tmp_path / "exported"
    file.write_text("not a folder")
    out = file / "sub" if above else file
    with pytest.raises(SystemExit) as exit_info:
        main(["--run", str(tmp_path / "run"), "--out", str(out)])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    assert repr(str(out)) in error and "is a file, not a folder" in error
    assert sorted(path.name for path in tmp_path.iterdir()) == ["exported"] and file.read_text() == "not a folder"


def test_export_command_recover_only(one_version, tmp_path, capsys):
    from concise_attention.cli.export import main

    out = pathlib.Path(shutil.copytree(one_version[0], tmp_path / "out"))
    assert _export(out, 1, kill_at=5)[0] == -signal.SIGKILL  # neither half of version 1 in place
    (killed,) = _staging_folders(out)
    (out / ".export-0123").mkdir()
    assert main(["--out", str(out), "--recover"]) == 0
    assert json.loads(capsys.readouterr().out) == {"completed": [killed], "removed": [".export-0123"]}
    assert _versions(out) == {1: killed[len(commit.STAGING_PREFIX) :]} and _staging_folders(out) == []
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(out)])
    assert exit_info.value.code == 2 and "--run" in capsys.readouterr().err


@pytest.mark.parametrize("source", ["../outside.txt", "/etc/hostname", ".export-1/../../outside.txt", "", "a//b"])
def test_a_journal_that_moves_anything_from_outside_out_is_refused(tmp_path, source):
    """A crafted journal (`..`, an absolute path) cannot make recovery move a file from outside OUT into it."""
    out = tmp_path / "out"
    staging = out / f"{commit.STAGING_PREFIX}crafted"
    staging.mkdir(parents=True)
    (tmp_path / "outside.txt").write_text("not OUT's")
    (staging / commit.JOURNAL).write_text(json.dumps({"version": 1, "moves": [[source, "hub/1/stolen.txt"]]}))
    with pytest.raises(ValueError, match="not inside OUT"):
        commit.recover(out)
    assert (tmp_path / "outside.txt").read_text() == "not OUT's" and not (out / "hub").exists()
