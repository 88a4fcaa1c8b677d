"""concise-attention: Keras 3 transformers with fixed head size, collaborative and deep single-head attention.

One import name, `concise_attention`; the design's top-level folders are its sub-packages (setup.py maps this
folder to it): `concise_attention.models` (Keras layers, backbones, presets), `.training` (tokenizers, data,
tasks, trainers, the config schema), `.export` (SavedModel, TF-Hub, TF Serving), `.cli` (the commands),
`.configs` (the YAML presets).
Nothing is imported here, so `import concise_attention.models` does not load TensorFlow's training stack.
"""

__version__ = "0.1.0"
