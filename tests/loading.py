"""Loads a file of the repository that the package does not install (a script, a benchmark) as a module."""

import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load(relative_path):
    """The module of ROOT/`relative_path`, registered under its file's stem (dataclasses look their module up there)."""
    path = ROOT / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
