"""The quickstart: the README's first command runs the main job end to end."""

import pathlib
import re
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_first_command_is_the_quickstart():
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)```", readme, re.S).group(1).strip()
    assert first == "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/concise-quickstart --out my_export"


def test_quickstart_pretrains_exports_and_reads_embeddings_back(tmp_path):
    """The quickstart job as the README runs it (its default config and steps), in a fresh process."""
    result = subprocess.run(
        [sys.executable, "-m", "training.quickstart", "--out", str(tmp_path / "my_export")],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout
    assert "[3/3] embeddings read back through" in out and out.count("dim 32:") == 3
    similarities = re.search(r"cosine similarities:\n(.*?)\n\n", out, re.S).group(1)
    matrix = np.array([[float(x) for x in re.findall(r"-?\d+\.\d*", row)] for row in similarities.strip().splitlines()])
    assert matrix.shape == (3, 3) and np.allclose(np.diag(matrix), 1.0, atol=1e-3)
    for name in ("encoder", "preprocess", "tarball", "serving", "models_config"):
        path = re.search(rf"  {name}\s+(\S+)", out).group(1)
        assert path.startswith(str(tmp_path / "my_export" / "export")) and pathlib.Path(path).exists(), name
    assert re.search(r"step 1000: eval MLM loss (\d+\.\d+)", out)
