"""Reading a run directory for the exporters: through `training.runs`, the one module that owns it."""

from training import runs


def load_run(run_dir):
    """(config dict, task model, vocabulary path) of a finished run directory.

    For a masked-LM run the model is the `BertPretrainer` (its `.encoder` is the
    `BertEncoder`), for a causal LM run the `CausalLM`, for a fine-tuning run its head model.
    """
    config, model, _, vocabulary = runs.load_model(run_dir)
    return config.to_dict() | {"name": config.name}, model, vocabulary
