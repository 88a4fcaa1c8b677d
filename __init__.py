"""concise-attention: Keras 3 transformers with fixed head size, collaborative and deep single-head attention.

One import name, `concise_attention`; the design's top-level folders are its sub-packages (setup.py maps this
folder to it): `concise_attention.models` (Keras layers, backbones, presets), `.training` (tokenizers, data,
tasks, trainers, the config schema), `.export` (SavedModel, TF-Hub, TF Serving), `.cli` (the commands),
`.configs` (the YAML presets).
Nothing is imported here, so `import concise_attention.models` does not load TensorFlow's training stack;
`concise_attention.SentenceEncoder` (sentence embeddings of a list of strings, from a preset by name) is
imported from `concise_attention.training.inference.embeddings` when first asked for.
"""

import importlib

__version__ = "0.1.0"
__all__ = ["SentenceEncoder"]
_LAZY = {"SentenceEncoder": "concise_attention.training.inference.embeddings"}


def __getattr__(name):
    """The names of `_LAZY`, imported on first use (PEP 562): they load TensorFlow, the package alone does not."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])
