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
