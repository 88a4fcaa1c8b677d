"""concise-attention: transformers with fixed head size, collaborative and deep single-head attention."""

import pathlib
import re

import setuptools
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).parent


class BuildPy(build_py):
    """This folder is the package `concise_attention`: its modules, but not this script."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [module for module in modules if (module[0], module[1]) != ("concise_attention", "setup")]


setuptools.setup(
    name="concise-attention",
    version=re.search(r'__version__ = "([^"]+)"', (HERE / "__init__.py").read_text()).group(1),  # one place
    description=(
        "Keras 3 model zoo for fixed head size, collaborative and deep single-head attention, "
        "with TF-Hub and TF Serving export."
    ),
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10,<3.13",
    # One import name: the design's top-level folders are the sub-packages of `concise_attention` (this
    # folder), so that a user's own `models/` or `training/` can neither shadow ours nor be shadowed.
    packages=["concise_attention"]
    + [
        f"concise_attention.{name}"
        for name in setuptools.find_packages(include=["models*", "training*", "export*", "configs*", "cli*"])
    ],
    package_dir={"concise_attention": "."},
    cmdclass={"build_py": BuildPy},
    package_data={
        "concise_attention.configs": ["*.yaml"],
        "concise_attention.training.data": [
            "*.txt",
            "wordnet_topics/*",
            "debian_sections/*",
            "mteb/*.json",
            "mteb/*/*.jsonl",
        ],
        "concise_attention.models": ["shipped/*/*", "shipped/*/assets/tokenizer/*"],
    },
    install_requires=[
        "tensorflow>=2.20,<2.21",
        "keras>=3.10,<4",
        "keras-hub>=0.29",  # WordPiece vocabulary training (training/preprocessing/tokenizer.py)
        "tensorflow-text>=2.20,<2.21",  # what keras-hub's WordPiece vocabulary training runs on
        "tensorflow-datasets>=4.9",  # GLUE and SQuAD readers
        "tensorly>=0.8",  # the CP decomposition of collaborative conversion
        "safetensors>=0.4",  # Hugging Face weights, never pickle
        "tensorflow-serving-api>=2.20,<2.21",  # the TF Serving warm-up records of an export
        "numpy",
        "scikit-learn>=1.3",  # MTEB's classification protocol (concise-evaluate --encoder) and the PCA baseline
        "scipy>=1.10",  # MTEB's STS protocol (Spearman)
        "pyyaml",
        "tqdm",
    ],
    entry_points={
        "console_scripts": [
            "concise-train = concise_attention.cli.train:main",
            "concise-train-lm = concise_attention.cli.train:main",
            "concise-export = concise_attention.cli.export:main",
            "concise-quickstart = concise_attention.cli.quickstart:main",
            "concise-collaborative = concise_attention.cli.collaborative:main",
            "concise-prepare-data = concise_attention.training.trainers.prepare_data:main",
            "concise-evaluate = concise_attention.cli.evaluate:main",
            "concise-reduce = concise_attention.cli.reduce:main",
        ]
    },
    extras_require={
        # concise-export --onnx (export/onnx.py): the converter, the format and the tokenizer.json writer
        "onnx": ["tf2onnx>=1.16", "onnx>=1.14", "tokenizers>=0.15"],
        "test": [
            "pytest>=8",
            "pytest-timeout",
            "pytest-xdist>=3.5",  # the suite in parallel processes (pytest.ini: -n, one file per worker)
            # the design's stack as test references only (no runtime module imports them): TF-Hub and tf_keras load
            # our exports as their users do; tf-models-official's BERT, SQuAD and tokenizer code checks ours
            "tensorflow-hub>=0.16",
            "tf-keras>=2.20,<2.21",
            "tf-models-official>=2.20,<2.21",
            "jax[cpu]>=0.4.30",
            # independent references in tests: Hugging Face's Rust WordPiece, scikit-learn and SciPy metrics, onnx's
            # reference evaluator (numpy) of our ONNX export
            "tokenizers>=0.15",
            "tf2onnx>=1.16",
            "onnx>=1.14",
            "scikit-learn>=1.3",
            "scipy>=1.10",
            # tests/gcs_fake.py: a local Google Cloud Storage that TensorFlow's gs:// client reaches through a TLS proxy
            "gcp-storage-emulator>=2024.8",
            "trustme>=1.1",
            # the linter the suite runs (tests/test_repository.py; its rules: pyproject.toml)
            "ruff>=0.6",
        ],
    },
)
