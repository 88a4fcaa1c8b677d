"""concise-attention: transformers with fixed head size, collaborative and deep single-head attention."""

import pathlib

import setuptools

HERE = pathlib.Path(__file__).parent

setuptools.setup(
    name="concise-attention",
    version="0.1.0",
    description=(
        "Keras 3 model zoo for fixed head size, collaborative and deep single-head attention, "
        "with TF-Hub and TF Serving export."
    ),
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10,<3.13",
    packages=setuptools.find_packages(include=["models*", "training*", "export*", "configs*"]),
    package_data={"configs": ["*.yaml"], "training": ["data/*.txt", "data/*/*"], "models": ["shipped/*/*", "shipped/*/assets/tokenizer/*"]},
    install_requires=[
        "tensorflow>=2.20,<2.21",
        "keras>=3.10,<4",
        "keras-hub>=0.29",
        "tf-keras>=2.20,<2.21",
        "tf-models-official>=2.20,<2.21",
        "tensorflow-text>=2.20,<2.21",
        "tensorflow-datasets>=4.9",
        "tensorflow-hub>=0.16",
        "tensorly>=0.8",
        "safetensors>=0.4",
        "tensorflow-serving-api>=2.20,<2.21",
        "numpy",
        "pyyaml",
        "tqdm",
    ],
    entry_points={
        "console_scripts": [
            "concise-train = training.cli:main",
            "concise-train-lm = training.cli:main",
            "concise-export = export.cli:main",
            "concise-quickstart = training.quickstart:main",
            "concise-collaborative = training.collaborative_cli:main",
            "concise-prepare-data = training.prepare_data:main",
            "concise-evaluate = training.evaluate_cli:main",
        ]
    },
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-timeout",
            "pytest-xdist>=3.5",  # the suite in parallel processes (pytest.ini: -n, one file per worker)
            "jax[cpu]>=0.4.30",
            # independent references in tests: Hugging Face's Rust WordPiece, scikit-learn and SciPy metrics
            "tokenizers>=0.15",
            "scikit-learn>=1.3",
            "scipy>=1.10",
            # tests/gcs_fake.py: a local Google Cloud Storage that TensorFlow's gs:// client reaches through a TLS proxy
            "gcp-storage-emulator>=2024.8",
            "trustme>=1.1",
        ],
    },
)
