"""Reading a run directory back: the exporters read only config.json, the weights and vocab.txt."""

import json
import pathlib

from configs import BUILDERS


def load_run(run_dir):
    """The saved config, trained model and vocabulary of a run directory.

    Args:
        run_dir: a directory written by the trainer (config.json, model.weights.h5,
            vocab.txt).

    Returns:
        (config dict, model, vocabulary path): for a BERT run the model is the
        `BertPretrainer` (its `.encoder` is the `BertEncoder`), for a causal LM run the
        `CausalLM`.
    """
    from models.bert import BertPretrainer

    run = pathlib.Path(run_dir)
    config_path, weights_path, vocabulary = run / "config.json", run / "model.weights.h5", run / "vocab.txt"
    missing = [path.name for path in (config_path, weights_path) if not path.is_file()]
    if missing:
        raise ValueError(f"A run directory needs config.json and model.weights.h5; {str(run)!r} lacks {', '.join(missing)}.")
    config = json.loads(config_path.read_text())
    if config.get("model_type") not in BUILDERS:
        raise ValueError(f"{config_path}: `model_type` must be one of {sorted(BUILDERS)}. Received: {config.get('model_type')!r}")
    model = BUILDERS[config["model_type"]](**config["model"])
    if config["model_type"] == "bert":
        model = BertPretrainer(model)
    try:
        model.load_weights(weights_path)
    except ValueError as error:
        raise ValueError(f"The weights in {weights_path} do not fit the model of {config_path}: {error}") from error
    return config, model, vocabulary
