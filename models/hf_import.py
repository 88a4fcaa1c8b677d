"""Import of a pre-trained Hugging Face BERT or MPNet directory into `BertEncoder` (standard attention).

Reads `config.json` and `model.safetensors` with safetensors (never pickle or
torch.load); `vocab.txt` is left for the tokenizer. Works on BertModel checkpoints
(keys `embeddings.*`) and BertFor* ones (keys `bert.embeddings.*`), with LayerNorm
parameters named weight/bias or gamma/beta; the masked-LM head of BertForMaskedLM /
BertForPreTraining checkpoints (`cls.predictions.*`) becomes a `BertPretrainer`.

MPNet (`model_type: mpnet`, all-mpnet-base-v2) is a `BertEncoder` without segment types, with
positions counted from padding id + 1 and one relative position bias shared by every layer
(`mpnet_arguments`). Its tokenizer is BERT's lower-cased WordPiece with other names for the
special tokens (`<s> </s> <pad> <mask>`; `[UNK]` as BERT): `bert_named_tokens` gives its
vocabulary BERT's names at MPNet's ids, which changes no text's ids (both sets of names hold
punctuation, which the basic tokenizer splits off, so no text reaches either). The masked-LM head
of MPNetForMaskedLM is not imported.

What tokenizer_config.json may say is checked against config.json and vocab.txt
(`check_tokenizer_agrees`): a disagreement is a setting both files state with different
values, or a tokenizer whose ids the model cannot take; a shorter `model_max_length`
than `max_position_embeddings` is not one (the export's sequence length is bounded by both).
"""

import json
import pathlib

import numpy as np
import safetensors.numpy

from concise_attention.models.bert import BertEncoder
from concise_attention.models.bert import BertPretrainer

# Hugging Face `hidden_act` -> Keras activation of the same function.
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_approximate", "gelu_pytorch_tanh": "gelu_approximate", "relu": "relu"}


# tokenizer_config.json fields naming the special tokens, and the tokens BERT's and MPNet's vocabularies use.
_SPECIAL_TOKEN_FIELDS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}
_MPNET_SPECIAL_TOKENS = {
    "unk_token": "[UNK]",
    "sep_token": "</s>",
    "pad_token": "<pad>",
    "cls_token": "<s>",
    "mask_token": "<mask>",
}
_TOKENIZER_CLASSES = {"bert": ("BertTokenizer", "BertTokenizerFast"), "mpnet": ("MPNetTokenizer", "MPNetTokenizerFast")}
# Tensor names (after the `bert.` / `mpnet.` prefix) of one layer's attention, by model type.
_ATTENTION_TENSORS = {
    "bert": {
        "query": "attention.self.query",
        "key": "attention.self.key",
        "value": "attention.self.value",
        "output": "attention.output.dense",
        "norm": "attention.output",
    },
    "mpnet": {
        "query": "attention.attn.q",
        "key": "attention.attn.k",
        "value": "attention.attn.v",
        "output": "attention.attn.o",
        "norm": "attention",
    },
}
_DISPLAY_NAMES = {"bert": "BERT", "mpnet": "MPNet"}
MPNET_MAX_DISTANCE = 128  # Hugging Face's MPNet fixes it (relative_position_bucket)


def _read_json(path):
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}).") from error
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object. Received: {type(value).__name__}")
    return value


def read_hf_config(directory):
    """config.json of a Hugging Face BERT or MPNet folder, as a dict (else an error naming the field)."""
    path = pathlib.Path(directory) / "config.json"
    if not path.is_file():
        raise ValueError(f"No config.json in the Hugging Face BERT directory. Received: directory={str(directory)!r}")
    config = _read_json(path)
    if config.get("model_type") not in _ATTENTION_TENSORS:
        raise ValueError(
            f"{path}: only BERT and MPNet checkpoints can be imported. Received: model_type={config.get('model_type')!r}"
        )
    return config


def hf_bert_config(directory):
    """The `BertEncoder` arguments of a Hugging Face BERT or MPNet `config.json`. MPNet: no segment types, positions
    counted from pad_token_id + 1 (the first rows of its table are never read), the relative position bias."""
    config, path = read_hf_config(directory), pathlib.Path(directory) / "config.json"
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(
            f"Only absolute position embeddings are supported. Received: position_embedding_type={config['position_embedding_type']!r}"
        )
    if config.get("hidden_act") not in _ACTIVATIONS:
        raise ValueError(
            f"{path}: `hidden_act` must be one of {sorted(_ACTIVATIONS)}. Received: hidden_act={config.get('hidden_act')!r}"
        )
    mpnet = config["model_type"] == "mpnet"
    for field, least in (("pad_token_id", 0), ("relative_attention_num_buckets", 4)) if mpnet else ():
        value = config.get(field, 1 if field == "pad_token_id" else 32)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{path}: `{field}` must be an integer >= {least}. Received: {field}={value!r}")
    offset = config.get("pad_token_id", 1) + 1 if mpnet else 0
    positions = (
        {
            "type_vocab_size": 0,
            "position_offset": offset,
            "relative_attention_buckets": config.get("relative_attention_num_buckets", 32),
            "relative_attention_max_distance": MPNET_MAX_DISTANCE,
        }
        if mpnet
        else {"type_vocab_size": config["type_vocab_size"]}
    )
    return {
        "vocab_size": config["vocab_size"],
        "hidden_size": config["hidden_size"],
        "num_layers": config["num_hidden_layers"],
        "num_heads": config["num_attention_heads"],
        "intermediate_size": config["intermediate_size"],
        "attention": {"type": "standard"},
        "max_sequence_length": config["max_position_embeddings"] - offset,
        **positions,
        "activation": _ACTIVATIONS[config["hidden_act"]],
        "dropout": config.get("hidden_dropout_prob", 0.1),
        "attention_dropout": config.get("attention_probs_dropout_prob", 0.1),
        "layer_norm_epsilon": config.get("layer_norm_eps", 1e-5 if mpnet else 1e-12),
        "initializer_range": config.get("initializer_range", 0.02),
    }


def bert_named_tokens(tokens):
    """The lines of an MPNet vocabulary with BERT's special-token names at MPNet's ids: `<s>` and `[CLS]` trade
    lines, as do `</s>` and `[SEP]`, `<pad>` and `[PAD]`, `<mask>` and `[MASK]` (a missing BERT name just
    takes the MPNet token's line). No text's ids change (see the module docstring)."""
    tokens = list(tokens)
    for field, bert_name in _SPECIAL_TOKEN_FIELDS.items():
        mpnet_name = _MPNET_SPECIAL_TOKENS[field]
        if mpnet_name == bert_name:
            continue
        if mpnet_name not in tokens:
            raise ValueError(f"The MPNet vocabulary (vocab.txt) lacks its special token {mpnet_name!r} ({field}).")
        mpnet_line = tokens.index(mpnet_name)
        if bert_name in tokens:
            tokens[tokens.index(bert_name)] = mpnet_name
        tokens[mpnet_line] = bert_name
    return tokens


def hf_tokenizer_settings(directory):
    """The tokenizer settings of a Hugging Face BERT folder: dict(lowercase, strip_accents).

    From tokenizer_config.json (`do_lower_case`, `strip_accents`; None follows
    lowercase, as BertTokenizer) when present, else BERT-uncased's defaults.
    """
    path = pathlib.Path(directory) / "tokenizer_config.json"
    if not path.is_file():
        return {"lowercase": True, "strip_accents": None}
    settings = _read_json(path)
    lowercase, strip_accents = settings.get("do_lower_case", True), settings.get("strip_accents")
    if not isinstance(lowercase, bool) or strip_accents not in (None, True, False):
        raise ValueError(
            f"{path}: do_lower_case must be true/false and strip_accents true/false/null. "
            f"Received: do_lower_case={lowercase!r}, strip_accents={strip_accents!r}"
        )
    tokenizer_class = settings.get("tokenizer_class")
    classes = _TOKENIZER_CLASSES[read_hf_config(directory)["model_type"]]
    if tokenizer_class and tokenizer_class not in classes:
        raise ValueError(
            f"{path}: only {' and '.join(classes)} are supported for this model. Received: tokenizer_class={tokenizer_class!r}"
        )
    for field in ("do_basic_tokenize", "tokenize_chinese_chars"):  # BERT's basic tokenizer, always applied here
        if settings.get(field, True) is not True:
            raise ValueError(f"{path}: {field}={settings[field]!r} is not supported (BERT's tokenisation applies it).")
    return {"lowercase": lowercase, "strip_accents": strip_accents}


def check_tokenizer_agrees(directory, tokens):
    """Raises ValueError naming the file and field where tokenizer_config.json, config.json and
    vocab.txt (`tokens`, its lines) disagree: a vocabulary larger than config.json's
    vocab_size (ids the embedding table lacks); a pad_token_id that is not the pad token's line; a
    special token (unk/sep/pad/cls/mask_token) other than BERT's (MPNet's for an MPNet folder); a
    do_lower_case or tokenizer_class that config.json states otherwise."""
    directory = pathlib.Path(directory)
    config, vocabulary = read_hf_config(directory), directory / "vocab.txt"
    special = _MPNET_SPECIAL_TOKENS if config["model_type"] == "mpnet" else _SPECIAL_TOKEN_FIELDS
    if len(tokens) > config["vocab_size"]:
        raise ValueError(
            f"{vocabulary} has {len(tokens)} tokens, more than {directory / 'config.json'} vocab_size={config['vocab_size']}."
        )
    if special["pad_token"] not in tokens:
        raise ValueError(f"{vocabulary} lacks the pad token {special['pad_token']!r}.")
    pad = tokens.index(special["pad_token"])
    if config.get("pad_token_id", pad) != pad:
        raise ValueError(
            f"{directory / 'config.json'}: pad_token_id={config['pad_token_id']} but {special['pad_token']} is line {pad} of {vocabulary}."
        )
    path = directory / "tokenizer_config.json"
    settings = _read_json(path) if path.is_file() else {}
    for field, token in special.items():
        value = settings.get(field, token)
        value = value.get("content") if isinstance(value, dict) else value  # a serialised AddedToken
        if value != token:
            raise ValueError(
                f"{path}: {field}={value!r}, but {_DISPLAY_NAMES[config['model_type']]}'s tokenisation uses {token!r}."
            )
    for field in ("do_lower_case", "tokenizer_class"):
        if field in config and field in settings and config[field] != settings[field]:
            raise ValueError(
                f"{path}: {field}={settings[field]!r} disagrees with {directory / 'config.json'}: {field}={config[field]!r}."
            )


class _Checkpoint:
    """The tensors of a safetensors file, looked up without the `bert.` (`mpnet.`) prefix."""

    def __init__(self, path):
        self.tensors = {
            name.removeprefix("bert.").removeprefix("mpnet."): value
            for name, value in safetensors.numpy.load_file(path).items()
        }
        self.path = path

    def __call__(self, name):
        for candidate in (name, name.replace(".weight", ".gamma").replace(".bias", ".beta")):
            if candidate in self.tensors:
                return self.tensors[candidate]
        raise ValueError(
            f"The checkpoint {self.path.name} has no tensor {name!r}: not a BERT checkpoint of this config?"
        )

    def layer_norm(self, prefix):
        return [self(f"{prefix}.LayerNorm.weight"), self(f"{prefix}.LayerNorm.bias")]

    def dense(self, prefix):
        # PyTorch Linear stores (out, in); Keras Dense kernels are (in, out).
        return self(f"{prefix}.weight").T, self(f"{prefix}.bias")


def _assign(variable, value, source):
    value = np.asarray(value)
    if tuple(variable.shape) != value.shape:
        raise ValueError(
            f"Shape mismatch importing {source!r} into {variable.path!r}: checkpoint {value.shape}, model {tuple(variable.shape)}"
        )
    variable.assign(value)


def load_hf_bert(directory, **overrides):
    """A `BertEncoder` with the weights of a Hugging Face BERT directory.

    Args:
        directory: folder with config.json and model.safetensors.
        **overrides: `BertEncoder` arguments to change (e.g. `dropout=0.0`).

    Returns:
        The encoder, standard attention, weights loaded.
    """
    return _load_encoder(directory, overrides)[0]


def load_hf_model(directory, **overrides):
    """The encoder of a Hugging Face BERT directory and its masked-LM head when it has one.

    Returns:
        (encoder, pretrainer): `pretrainer` is a `BertPretrainer` around the encoder with
        the checkpoint's `cls.predictions.*` weights (BertForMaskedLM, BertForPreTraining),
        or None when the checkpoint has no MLM head (BertModel exports).
    """
    encoder, checkpoint = _load_encoder(directory, overrides)
    if not any(name.startswith("cls.predictions.") for name in checkpoint.tensors):
        return encoder, None
    pretrainer = BertPretrainer(encoder)
    _set_dense(
        pretrainer.transform, checkpoint.dense("cls.predictions.transform.dense"), "cls.predictions.transform.dense"
    )
    _set_layer_norm(
        pretrainer.transform_norm,
        checkpoint.layer_norm("cls.predictions.transform"),
        "cls.predictions.transform.LayerNorm",
    )
    bias = "cls.predictions.bias" if "cls.predictions.bias" in checkpoint.tensors else "cls.predictions.decoder.bias"
    _assign(pretrainer.output_bias.bias, checkpoint(bias), bias)
    decoder = checkpoint.tensors.get("cls.predictions.decoder.weight")
    if decoder is not None and not np.array_equal(decoder, checkpoint("embeddings.word_embeddings.weight")):
        raise ValueError(
            f"{checkpoint.path}: cls.predictions.decoder.weight differs from the word embeddings; "
            "only a decoder tied to them (tie_word_embeddings, BERT's default) is supported."
        )
    return encoder, pretrainer


def _load_encoder(directory, overrides):
    directory = pathlib.Path(directory)
    weights_path = directory / "model.safetensors"
    if not weights_path.is_file():
        raise ValueError(
            f"No model.safetensors in the Hugging Face BERT directory. Received: directory={str(directory)!r}"
        )
    encoder = BertEncoder(**(hf_bert_config(directory) | overrides))
    checkpoint = _Checkpoint(weights_path)
    _assign(encoder.word_embeddings.embeddings, checkpoint("embeddings.word_embeddings.weight"), "word_embeddings")
    _assign(
        encoder.position_embeddings.embeddings,
        checkpoint("embeddings.position_embeddings.weight"),
        "position_embeddings",
    )
    if encoder.type_embeddings is not None:
        _assign(
            encoder.type_embeddings.embeddings,
            checkpoint("embeddings.token_type_embeddings.weight"),
            "token_type_embeddings",
        )
    if encoder.relative_attention_bias is not None:
        _assign(
            encoder.relative_attention_bias.embeddings,
            checkpoint("encoder.relative_attention_bias.weight"),
            "encoder.relative_attention_bias",
        )
    _set_layer_norm(encoder.embeddings_norm, checkpoint.layer_norm("embeddings"), "embeddings.LayerNorm")
    names = _ATTENTION_TENSORS[read_hf_config(directory)["model_type"]]
    for index, block in enumerate(encoder.blocks):
        _load_block(block, checkpoint, f"encoder.layer.{index}", names)
    _set_dense(encoder.pooler, checkpoint.dense("pooler.dense"), "pooler.dense")
    return encoder, checkpoint


def _load_block(block, checkpoint, prefix, names):
    """One transformer layer's weights; `names`: its attention tensors' names (`_ATTENTION_TENSORS`)."""
    attention, heads = block.attention, block.attention.num_heads
    for dense, name in (
        (attention.query_dense, "query"),
        (attention.key_dense, "key"),
        (attention.value_dense, "value"),
    ):
        source = f"{prefix}.{names[name]}"
        kernel, bias = checkpoint.dense(source)
        _assign(dense.kernel, kernel.reshape(kernel.shape[0], heads, -1), f"{source}.weight")
        _assign(dense.bias, bias.reshape(heads, -1), f"{source}.bias")
    source = f"{prefix}.{names['output']}"
    kernel, bias = checkpoint.dense(source)
    _assign(attention.output_dense.kernel, kernel.reshape(heads, -1, kernel.shape[-1]), f"{source}.weight")
    _assign(attention.output_dense.bias, bias, f"{source}.bias")
    _set_layer_norm(
        block.attention_norm, checkpoint.layer_norm(f"{prefix}.{names['norm']}"), f"{prefix}.{names['norm']}.LayerNorm"
    )
    _set_dense(block.intermediate, checkpoint.dense(f"{prefix}.intermediate.dense"), f"{prefix}.intermediate.dense")
    _set_dense(block.feedforward_output, checkpoint.dense(f"{prefix}.output.dense"), f"{prefix}.output.dense")
    _set_layer_norm(block.feedforward_norm, checkpoint.layer_norm(f"{prefix}.output"), f"{prefix}.output.LayerNorm")


def _set_dense(layer, kernel_and_bias, source):
    _assign(layer.kernel, kernel_and_bias[0], f"{source}.weight")
    _assign(layer.bias, kernel_and_bias[1], f"{source}.bias")


def _set_layer_norm(layer, gamma_and_beta, source):
    _assign(layer.gamma, gamma_and_beta[0], f"{source}.weight")
    _assign(layer.beta, gamma_and_beta[1], f"{source}.bias")


def load_hf_weights(encoder, directory):
    """Copies a Hugging Face BERT checkpoint into an existing `BertEncoder` of the same
    architecture (any attention type whose weights have the same shapes), weight by weight."""
    imported = load_hf_bert(directory)
    if len(imported.weights) != len(encoder.weights):
        raise ValueError(
            f"The checkpoint {directory} has {len(imported.weights)} weights, the configured encoder {len(encoder.weights)}: "
            "the model section must describe the checkpoint's architecture."
        )
    for target, source in zip(encoder.weights, imported.weights):
        if tuple(target.shape) != tuple(source.shape):
            raise ValueError(
                f"Checkpoint {directory}: {source.path} has shape {tuple(source.shape)} but the configured encoder's "
                f"{target.path} has {tuple(target.shape)}: the model section must describe the checkpoint's architecture."
            )
        target.assign(source)
