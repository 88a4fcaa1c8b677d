"""An encoder as an ONNX model folder in the layout ONNX Runtime, sentence-transformers' ONNX backend and fastembed
load (`concise-export --onnx`: OUT/hub/<version>/onnx/, committed with the rest of the version):

    onnx/model.onnx                  the encoder: input_ids, attention_mask, token_type_ids (int64 [batch, seq]) ->
                                     last_hidden_state (float32 [batch, seq, width]); ONNX opset 17, converted by tf2onnx
    tokenizer.json                   the tokenizer in Hugging Face `tokenizers` format, built from the export's
                                     vocabulary and settings (lowercase, strip_accents), truncating at its length
    tokenizer_config.json, special_tokens_map.json, vocab.txt
    config.json                      what `transformers`' AutoConfig needs to pick a BERT feature extractor, and this
                                     model's own architecture under `concise_attention`
    modules.json, 1_Pooling/, 2_Normalize/, sentence_bert_config.json
                                     sentence-transformers' pipeline: mean pooling over the real tokens (then unit
                                     length for a "normalized_mean" export): the export's `embedding`

    >>> SentenceTransformer("OUT/hub/1/onnx", backend="onnx").encode(texts)                        # sentence-transformers
    >>> TextEmbedding.add_custom_model(..., pooling=PoolingType.MEAN, normalization=True, model_file="onnx/model.onnx")

Needs the `onnx` extra (tf2onnx, onnx, tokenizers): `pip install "concise-attention[onnx]"`.
"""

import importlib.util
import json
import logging
import os

import numpy as np
import tensorflow as tf

ONNX_POOLINGS = ("mean", "normalized_mean")  # the sentence-transformers pipelines written here
OPSET = 17
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
SPECIAL_TOKENS = {
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "mask_token": "[MASK]",
}


def check_onnx(pooling):
    """Refuses an ONNX export, before anything is written, that the installed packages or the pooling cannot give."""
    missing = [name for name in ("tf2onnx", "onnx", "tokenizers") if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(
            f"The ONNX export needs {', '.join(missing)}: pip install 'concise-attention[onnx]' (or pip install "
            f"{' '.join(missing)})."
        )
    if pooling not in ONNX_POOLINGS:
        raise ValueError(
            f"The ONNX export writes a sentence-transformers mean pooling ({' or '.join(ONNX_POOLINGS)}). "
            f"Received: pooling={pooling!r}"
        )


def write_onnx_folder(folder, encoder, vocabulary, export):
    """Writes the folder of the module docstring for `encoder` (a float32 `BertEncoder`), `vocabulary` (its
    vocab.txt) and the export's settings `export` (seq_length, pooling, lowercase, strip_accents)."""
    os.makedirs(os.path.join(folder, "onnx"))
    onnx_model(encoder, os.path.join(folder, "onnx", "model.onnx"))
    tokenizer = hugging_face_tokenizer(vocabulary, export["lowercase"], export["strip_accents"], export["seq_length"])
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    tf.io.gfile.copy(vocabulary, os.path.join(folder, "vocab.txt"), overwrite=True)
    width = encoder.embedding_size
    files = {
        "config.json": _hf_config(encoder, export),
        "tokenizer_config.json": {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": export["lowercase"],
            "strip_accents": export["strip_accents"],
            "tokenize_chinese_chars": True,
            "model_max_length": export["seq_length"],
            **SPECIAL_TOKENS,
        },
        "special_tokens_map.json": SPECIAL_TOKENS,
        "sentence_bert_config.json": {"max_seq_length": export["seq_length"], "do_lower_case": False},
        "modules.json": _modules(export["pooling"]),
        "1_Pooling/config.json": {
            "word_embedding_dimension": width,
            "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True,
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        },
    }
    for name, value in files.items():
        os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
        with open(os.path.join(folder, name), "w") as file:
            json.dump(value, file, indent=1, sort_keys=True)
    if export["pooling"] == "normalized_mean":
        os.makedirs(os.path.join(folder, "2_Normalize"))


def onnx_model(encoder, path):
    """Converts `encoder` to ONNX at `path` (module docstring's inputs and output), any batch size and length."""
    import tf2onnx  # optional: the onnx extra

    logging.getLogger("tf2onnx").setLevel(logging.ERROR)
    spec = [tf.TensorSpec([None, None], tf.int64, name=name) for name in INPUTS]

    @tf.function(input_signature=spec, autograph=False)
    def forward(input_ids, attention_mask, token_type_ids):
        inputs = {"input_word_ids": input_ids, "input_mask": attention_mask, "input_type_ids": token_type_ids}
        outputs = encoder({name: tf.cast(value, tf.int32) for name, value in inputs.items()}, training=False)
        return {"last_hidden_state": outputs["sequence_output"]}

    model, _ = tf2onnx.convert.from_function(
        forward, input_signature=spec, opset=OPSET, custom_op_handlers={"Erfc": (_erfc, [])}
    )
    with open(path, "wb") as file:
        file.write(canonical(model).SerializeToString(deterministic=True))


def canonical(model):
    """`model` with its nodes in one order and its names given by that order: tf2onnx orders nodes and names
    constants by object ids, which differ from one process to the next; this makes an export of the same weights
    the same bytes. The order is a depth-first walk from the graph's outputs through each node's inputs in turn."""
    graph = model.graph
    if any(attribute.type in (5, 10) for node in graph.node for attribute in node.attribute):  # GRAPH, GRAPHS
        raise ValueError("The converted encoder has control flow (a subgraph): not supported by the ONNX export.")
    producers = {name: node for node in graph.node for name in node.output}
    order, done = [], set()
    for output in graph.output:
        stack = [producers[output.name]] if output.name in producers else []
        while stack:
            node = stack.pop()
            if id(node) in done:
                continue
            pending = next((name for name in node.input if name in producers and id(producers[name]) not in done), None)
            if pending is not None:
                stack += [node, producers[pending]]
            else:
                done.add(id(node))
                order.append(node)
    kept = {item.name for item in [*graph.input, *graph.output]}
    initializers = {item.name: item for item in graph.initializer}
    names, weights = {}, 0
    for index, node in enumerate(order):
        for name in node.input:
            if name in initializers and name not in names:
                names[name], weights = f"weight_{weights}", weights + 1
        for position, name in enumerate(node.output):
            names[name] = name if name in kept else f"{node.op_type}_{index}_{position}"
    for node_index, node in enumerate(order):
        node.name, node.doc_string = f"{node.op_type}_{node_index}", ""
        node.input[:] = [names.get(name, name) for name in node.input]
        node.output[:] = [names[name] for name in node.output]
    for item in graph.initializer:
        item.name = names.get(item.name, item.name)
    kept_initializers = sorted(
        (item for item in graph.initializer if item.name.startswith("weight_")), key=lambda item: int(item.name[7:])
    )
    del graph.initializer[:]
    graph.initializer.extend(kept_initializers)
    del graph.node[:]
    graph.node.extend(order)
    del graph.value_info[:]
    graph.doc_string = ""  # tf2onnx's names the traced function, numbered per process
    for value in [*graph.input, *graph.output]:  # [batch, sequence(, width)]: tf2onnx numbers the free dimensions
        for dimension, name in zip(value.type.tensor_type.shape.dim, ("batch", "sequence")):
            dimension.dim_param = name
    return model


def _erfc(ctx, node, name, args):
    """tf2onnx has no Erfc (TensorFlow's exact GELU): 1 - Erf(x)."""
    from tf2onnx import utils  # optional: the onnx extra

    x = node.input[0]
    one = ctx.make_const(utils.make_name("one"), np.array(1, utils.map_onnx_to_numpy_type(ctx.get_dtype(x))))
    erf = ctx.make_node("Erf", [x])
    node.type = "Sub"
    ctx.replace_inputs(node, [one.output[0], erf.output[0]])
    return node


def hugging_face_tokenizer(vocabulary, lowercase, strip_accents, max_length):
    """BERT's tokenizer in `tokenizers` (the components of its BertWordPieceTokenizer: BERT's normaliser and
    pre-tokeniser, WordPiece, `[CLS] text [SEP]`), with our settings, truncating at `max_length` tokens."""
    from tokenizers import BertWordPieceTokenizer  # optional: the onnx extra

    tokenizer = BertWordPieceTokenizer(
        vocabulary, lowercase=lowercase, strip_accents=strip_accents, clean_text=True, handle_chinese_chars=True
    )
    tokenizer.enable_truncation(max_length)
    return tokenizer


def _hf_config(encoder, export):
    model = encoder.get_config()
    return {
        "model_type": "bert",
        "architectures": ["BertModel"],
        "hidden_size": model["hidden_size"],
        "num_hidden_layers": model["num_layers"],
        "num_attention_heads": model["num_heads"],
        "intermediate_size": model["intermediate_size"],
        "vocab_size": model["vocab_size"],
        "max_position_embeddings": model["max_sequence_length"],
        "type_vocab_size": model["type_vocab_size"],
        "concise_attention": {"model": export["config"]["model"], "model_type": export["config"]["model_type"]},
    }


def _modules(pooling):
    modules = [("", "Transformer"), ("1_Pooling", "Pooling")] + [("2_Normalize", "Normalize")] * (
        pooling == "normalized_mean"
    )
    return [
        {"idx": index, "name": str(index), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for index, (path, kind) in enumerate(modules)
    ]
