"""Where, when and from which code a result was measured: recorded beside every results row."""

import json
import os
import pathlib
import platform
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def machine_name():
    """The CPU model and core count, for the record of where a run was measured."""
    try:
        with open("/proc/cpuinfo") as file:
            model = next(line.split(":", 1)[1].strip() for line in file if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    return f"{model}, {os.cpu_count()} cores"


def commit():
    """(the checkout's commit, whether its tree was clean), ("unknown", False) outside a git checkout of its own
    (a copy of the tree without .git, even inside another repository). Clean means no tracked file differs from
    the commit outside benchmarks/results/: the results a study writes as it goes (its CSV gains a row per run)
    do not make the code that measures them another."""

    def git(*arguments):
        return subprocess.run(["git", *arguments], cwd=ROOT, capture_output=True, text=True, check=True).stdout

    try:
        if pathlib.Path(git("rev-parse", "--show-toplevel").strip()).resolve() != pathlib.Path(ROOT).resolve():
            return "unknown", False
        changed = git("diff", "HEAD", "--name-only", "--", ".", ":(exclude)benchmarks/results").split()
        return git("rev-parse", "HEAD").strip(), not changed
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False


def command_line(script, argv):
    """The command that regenerates a result, runnable from the repository root, naming no machine's folders:
    each absolute path in `argv` is given relative to the working directory."""

    def shown(argument):
        return os.path.relpath(argument) if os.path.isabs(argument) else argument

    return " ".join([f"python {script}", *map(shown, argv)])


def record(since=None):
    """{date, machine, commit, clean}: the fields every results file and row carries. With `since`, the record()
    taken when the measurement began: the commit is the one it began from (the code it loaded), clean only if the
    tree was clean at both ends and the commit did not move in between."""
    head, clean = commit()
    fields = {"date": time.strftime("%Y-%m-%d"), "machine": machine_name(), "commit": head, "clean": clean}
    if since is not None:
        fields.update(commit=since["commit"], clean=clean and since["clean"] and head == since["commit"])
    return fields


def header(script, argv=None, since=None):
    """What every results file opens with: record(since), then the command that regenerates it. `script` is the
    benchmark's __file__, `argv` its arguments (sys.argv[1:] when None)."""
    shown = os.path.relpath(os.path.abspath(script), ROOT)
    return {**record(since), "command": command_line(shown, sys.argv[1:] if argv is None else argv)}


def write(path, result):
    """`result` as indented JSON at `path`, atomically: a kill leaves the file as it was or whole, never half."""
    from concise_attention.training import files

    files.write_bytes_atomically(path, json.dumps(result, indent=1) + "\n")
