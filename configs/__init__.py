"""The YAML presets (package data), named on the command line and in `load_config`.

The schema and the loader are `concise_attention.training.run.configs`; `python -m concise_attention.configs NAME
[--set KEY=VALUE ...]` prints one preset resolved, with its parameter count.
"""
