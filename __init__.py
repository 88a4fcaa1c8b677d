"""concise-attention: Keras 3 transformers with fixed head size, collaborative and deep single-head attention.

One import name, `concise_attention`; the design's top-level folders are its sub-packages (setup.py maps this
folder to it): `concise_attention.models` (Keras layers, backbones, presets), `.training` (tokenizers, data,
tasks, trainers), `.export` (SavedModel, TF-Hub, TF Serving), `.configs` (the YAML presets and their schema).
Nothing is imported here, so `import concise_attention.models` does not load TensorFlow's training stack.
"""

__version__ = "0.1.0"
