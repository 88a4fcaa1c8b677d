"""MPNet (all-mpnet-base-v2's architecture) imported from a Hugging Face folder, against an independent numpy
MPNet forward pass written here from the safetensors file (positions from padding id + 1, one relative
position bias shared by every layer, no segment types, post-LN, exact GELU) and Hugging Face `tokenizers`
configured as MPNet's tokenizer.json is (BertNormalizer, BertPreTokenizer, WordPiece, RobertaProcessing):
a tiny random MPNet folder with all-MiniLM-L6-v2's vocabulary laid out as MPNet's (`<s> <pad> </s> <unk>`
first, `<mask>` last), exported by `concise-export --hf-dir` and loaded by `SentenceEncoder`. The real
all-mpnet-base-v2 is compared with sentence-transformers in `benchmarks/mpnet_reference.py`."""

import json
import math

import numpy as np
import pytest
import safetensors.numpy
import scipy.special
import tensorflow as tf

from concise_attention.cli.export import main
from concise_attention.training.inference import embeddings
from test_hf_export import cosines

HIDDEN, HEADS, LAYERS, INTERMEDIATE, POSITIONS, BUCKETS = 32, 4, 2, 64, 66, 32
MPNET_SPECIAL = ["<s>", "<pad>", "</s>", "<unk>"]
TEXTS = [
    "A man is playing a guitar.",
    "How do I reset my card PIN?",
    "Café naïve Straße!",
    " ".join(["the long sentence of many words"] * 12),
    "a",
    "東京は日本の首都です。 Привет",
]


def mpnet_vocabulary(minilm_dir):
    """all-MiniLM-L6-v2's (BERT-uncased) vocabulary laid out as MPNet's vocab.txt is: 4 tokens first, <mask> last."""
    return MPNET_SPECIAL + (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines() + ["<mask>"]


def _tensors(vocab_size, seed=0):
    rng = np.random.default_rng(seed)

    def normal(*shape, mean=0.0, scale=0.3):
        return (mean + rng.normal(scale=scale, size=shape)).astype("float32")

    def dense(prefix, out, inputs):
        return {f"{prefix}.weight": normal(out, inputs), f"{prefix}.bias": normal(out)}

    def norm(prefix):
        return {f"{prefix}.LayerNorm.weight": normal(HIDDEN, mean=1.0), f"{prefix}.LayerNorm.bias": normal(HIDDEN)}

    tensors = {
        "embeddings.word_embeddings.weight": normal(vocab_size, HIDDEN),
        "embeddings.position_embeddings.weight": normal(POSITIONS, HIDDEN),
        "embeddings.position_ids": np.arange(POSITIONS)[None],
        **norm("embeddings"),
        "encoder.relative_attention_bias.weight": normal(BUCKETS, HEADS, scale=2.0),
    }
    for index in range(LAYERS):
        prefix = f"encoder.layer.{index}"
        for name in "qkvo":
            tensors |= dense(f"{prefix}.attention.attn.{name}", HIDDEN, HIDDEN)
        tensors |= norm(f"{prefix}.attention")
        tensors |= dense(f"{prefix}.intermediate.dense", INTERMEDIATE, HIDDEN) | dense(
            f"{prefix}.output.dense", HIDDEN, INTERMEDIATE
        )
        tensors |= norm(f"{prefix}.output")
    return tensors | dense("pooler.dense", HIDDEN, HIDDEN)


def write_tiny_mpnet(directory, tokens):
    """A sentence-transformers MPNet folder as all-mpnet-base-v2's (mean pooling, Normalize), random weights."""
    directory.mkdir(parents=True)
    safetensors.numpy.save_file(_tensors(len(tokens)), directory / "model.safetensors")
    config = {
        "architectures": ["MPNetForMaskedLM"],
        "model_type": "mpnet",
        "vocab_size": len(tokens),
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": INTERMEDIATE,
        "hidden_act": "gelu",
        "max_position_embeddings": POSITIONS,
        "relative_attention_num_buckets": BUCKETS,
        "layer_norm_eps": 1e-5,
        "pad_token_id": 1,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
    }
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "do_lower_case": True,
                "bos_token": "<s>",
                "eos_token": "</s>",
                "sep_token": "</s>",
                "cls_token": "<s>",
                "unk_token": "[UNK]",
                "pad_token": "<pad>",
                "mask_token": "<mask>",
                "strip_accents": None,
                "tokenizer_class": "MPNetTokenizer",
            }
        )
    )
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 48, "do_lower_case": False}))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": HIDDEN, "pooling_mode_mean_tokens": True})
    )
    return directory


# --- The independent reference: MPNet in numpy, from the checkpoint's tensors ---


def _bucket(relative):
    """Hugging Face's MPNetEncoder.relative_position_bucket (32 buckets, max distance 128), in float64."""
    n = -relative
    bucket = (n < 0) * 16
    n = np.abs(n)
    with np.errstate(divide="ignore"):
        large = 8 + (np.log(n / 8) / math.log(128 / 8) * 8).astype(np.int64)
    return bucket + np.where(n < 8, n, np.minimum(large, 15))


def _layer_norm(x, tensors, prefix):
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + 1e-5) * tensors[f"{prefix}.LayerNorm.weight"] + tensors[
        f"{prefix}.LayerNorm.bias"
    ]


def _dense(x, tensors, prefix):
    return x @ tensors[f"{prefix}.weight"].T + tensors[f"{prefix}.bias"]


def numpy_mpnet(tensors, ids, mask):
    """MPNet's sequence output [B, L, D] of ids [B, L] with padding `mask` (1 = real token), float64."""
    tensors = {name: value.astype("float64") for name, value in tensors.items()}
    positions = np.cumsum(mask, axis=1) * mask + 1  # padding id 1: real tokens from 2
    x = _layer_norm(
        tensors["embeddings.word_embeddings.weight"][ids] + tensors["embeddings.position_embeddings.weight"][positions],
        tensors,
        "embeddings",
    )
    length = ids.shape[1]
    relative = np.arange(length)[None, :] - np.arange(length)[:, None]  # key - query
    # [1, heads, L, L]
    bias = tensors["encoder.relative_attention_bias.weight"][_bucket(relative)].transpose(2, 0, 1)[None]
    for index in range(LAYERS):
        prefix = f"encoder.layer.{index}"

        def split(name):
            return (
                _dense(x, tensors, f"{prefix}.attention.attn.{name}")
                .reshape(*x.shape[:2], HEADS, -1)
                .transpose(0, 2, 1, 3)
            )

        q, k, v = split("q"), split("k"), split("v")
        logits = (
            q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
            + bias
            + np.where(mask[:, None, None, :] > 0, 0.0, -1e9)
        )
        context = (scipy.special.softmax(logits, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(x.shape)
        x = _layer_norm(x + _dense(context, tensors, f"{prefix}.attention.attn.o"), tensors, f"{prefix}.attention")
        hidden = _dense(x, tensors, f"{prefix}.intermediate.dense")
        hidden = 0.5 * hidden * (1.0 + scipy.special.erf(hidden / math.sqrt(2.0)))
        x = _layer_norm(x + _dense(hidden, tensors, f"{prefix}.output.dense"), tensors, f"{prefix}.output")
    return x


def hugging_face_mpnet_tokenizer(tokens):
    """Hugging Face `tokenizers` set up as all-mpnet-base-v2's tokenizer.json is."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer
    from tokenizers import models
    from tokenizers import normalizers
    from tokenizers import pre_tokenizers
    from tokenizers import processors

    tokenizer = Tokenizer(
        models.WordPiece(
            {token: index for index, token in enumerate(tokens)}, unk_token="[UNK]", max_input_chars_per_word=100
        )
    )
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=False
    )
    tokenizer.add_special_tokens([AddedToken(token, normalized=False) for token in [*MPNET_SPECIAL, "[UNK]", "<mask>"]])
    return tokenizer


def reference_embeddings(directory, ids):
    """Unit mean-pooled numpy MPNet of each id list, one at a time (no padding)."""
    tensors = safetensors.numpy.load_file(directory / "model.safetensors")
    rows = [numpy_mpnet(tensors, np.array([row]), np.ones((1, len(row)), "int64"))[0].mean(0) for row in ids]
    return np.stack([row / np.linalg.norm(row) for row in rows])


@pytest.fixture(scope="module")
def tiny_mpnet(minilm_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_mpnet")
    tokens = mpnet_vocabulary(minilm_dir)
    directory = write_tiny_mpnet(root / "mpnet", tokens)
    return {
        "dir": directory,
        "tokens": tokens,
        "root": root,
        "ids": [
            encoding.ids[:47] + ([2] if len(encoding.ids) > 47 else [])
            for encoding in hugging_face_mpnet_tokenizer(tokens).encode_batch(TEXTS)
        ],
    }


def test_the_encoder_equals_a_numpy_mpnet_on_left_and_right_padded_batches(tiny_mpnet):
    """Positions count the real tokens (left padding moves them, as Hugging Face's create_position_ids_from_input_ids),
    the relative bias is by key - query, and the relative bias differs by direction (a test that fails if it is
    read the wrong way round)."""
    from concise_attention.models.hf_import import load_hf_bert

    encoder = load_hf_bert(tiny_mpnet["dir"])
    assert encoder.type_embeddings is None and encoder.max_sequence_length == POSITIONS - 2
    tensors = safetensors.numpy.load_file(tiny_mpnet["dir"] / "model.safetensors")
    ids = tiny_mpnet["ids"][:3]
    width = max(len(row) for row in ids)
    for side in ("right", "left"):
        word_ids = np.ones((len(ids), width), "int32")  # <pad>
        mask = np.zeros_like(word_ids)
        for line, row in enumerate(ids):
            place = slice(0, len(row)) if side == "right" else slice(width - len(row), width)
            word_ids[line, place], mask[line, place] = row, 1
        ours = encoder({"input_word_ids": word_ids, "input_mask": mask, "input_type_ids": 0 * word_ids})[
            "sequence_output"
        ]
        expected = numpy_mpnet(tensors, word_ids, mask)
        real = mask.astype(bool)
        np.testing.assert_allclose(np.asarray(ours)[real], expected[real], atol=2e-4)
    flipped = dict(tensors)
    flipped["encoder.relative_attention_bias.weight"] = np.roll(
        tensors["encoder.relative_attention_bias.weight"], 16, axis=0
    )
    assert np.abs(numpy_mpnet(flipped, word_ids, mask)[real] - expected[real]).max() > 0.1


def test_token_ids_equal_mpnets_tokenizer_on_the_tokenisation_corpus(tiny_mpnet):
    """The tokenizer of an MPNet folder (its vocabulary with BERT's special-token names at MPNet's ids) gives
    Hugging Face's MPNet ids on every line of the hostile corpus, <s> ... </s> included."""
    from test_text import build_corpus

    from concise_attention.training import artifacts
    from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer

    typed_special = ("<s>", "</s>", "<pad>", "<unk>", "<mask>")
    corpus = [line for line in build_corpus() if not any(token in line for token in typed_special)]
    assert len(corpus) >= 3000
    source = artifacts.read(tiny_mpnet["dir"])
    tokenizer = wordpiece_tokenizer(source.vocabulary, **source.tokenizer)
    expected = [encoding.ids for encoding in hugging_face_mpnet_tokenizer(tiny_mpnet["tokens"]).encode_batch(corpus)]
    ours = embeddings.token_ids(tokenizer, corpus, 100_000)
    assert [line for line, mine, theirs in zip(corpus, ours, expected) if mine != theirs][:5] == []
    assert (tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]"), tokenizer.token_to_id("[PAD]")) == (0, 2, 1)
    assert tokenizer.token_to_id("[MASK]") == len(tiny_mpnet["tokens"]) - 1


def test_exported_and_sentence_encoder_embeddings_equal_the_numpy_mpnet(tiny_mpnet):
    """`concise-export --hf-dir` serves the folder's unit mean embeddings at its max_seq_length (48: the last text
    is cut), tokenised as MPNet; `SentenceEncoder.from_preset` gives the same."""
    from concise_attention import SentenceEncoder

    out = tiny_mpnet["root"] / "out"
    assert main(["--hf-dir", str(tiny_mpnet["dir"]), "--out", str(out)]) == 0
    serving = tf.saved_model.load(str(out / "serving" / "1"))
    served_ids = serving.signatures["tokenize"](text=tf.constant(TEXTS))["input_word_ids"].numpy()
    assert [[int(i) for i in row[: len(ids)]] for row, ids in zip(served_ids, tiny_mpnet["ids"])] == tiny_mpnet["ids"]
    expected = reference_embeddings(tiny_mpnet["dir"], tiny_mpnet["ids"])
    served = serving.signatures["serving_default"](text=tf.constant(TEXTS))["embedding"].numpy()
    assert cosines(served, expected).min() >= 0.99999
    tokenized = serving.signatures["tokenize"](text=tf.constant(TEXTS))
    by_ids = serving.signatures["serve_token_ids"](**tokenized)["embedding"].numpy()
    assert cosines(by_ids, expected).min() >= 0.99999
    encoder = SentenceEncoder.from_preset(str(tiny_mpnet["dir"]))
    assert encoder.sequence_length == 48
    encoded = encoder.encode(TEXTS)
    assert cosines(encoded, expected).min() >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(encoded, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("cls_token", "[CLS]", "cls_token='[CLS]', but MPNet's tokenisation uses '<s>'"),
        ("tokenizer_class", "RobertaTokenizer", "tokenizer_class='RobertaTokenizer'"),
    ],
)
def test_an_mpnet_folder_that_disagrees_with_itself_is_named(tiny_mpnet, tmp_path, capsys, field, value, message):
    assert message in _export_error(tiny_mpnet, tmp_path, capsys, "tokenizer_config.json", {field: value})


def _export_error(tiny_mpnet, tmp_path, capsys, name, changes):
    """The one-line error (exit 2, nothing written) of `concise-export --hf-dir` on a copy of the tiny MPNet folder
    whose JSON file `name` has `changes`."""
    import shutil

    directory = tmp_path / "mpnet"
    shutil.copytree(tiny_mpnet["dir"], directory)
    settings = json.loads((directory / name).read_text())
    (directory / name).write_text(json.dumps(settings | changes))
    with pytest.raises(SystemExit) as exit_info:
        main(["--hf-dir", str(directory), "--out", str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and error.count("\n") == 1, error
    assert not (tmp_path / "out").exists()
    return error


def test_a_concise_student_distils_from_an_mpnet_teacher(tiny_mpnet, tmp_path):
    """`concise-train` with an MPNet folder as task.teacher: the cached teacher outputs are the numpy MPNet's unit
    embeddings, and the student starts from the teacher (its relative position biases are the teacher's first
    heads', moved by 3 steps only), narrower and with its own head count."""
    import dataclasses

    from concise_attention.cli import train as cli
    from concise_attention.training.run import runs
    from concise_attention.training.tasks import make_task

    overrides = [
        f"task.teacher={tiny_mpnet['dir']}",
        f"task.cache_dir={tmp_path / 'cache'}",
        "task.dataset=sample",
        "task.data_dir=null",
        "task.train_texts=48",
        "task.eval_texts=16",
        "training.batch_size=16",
        "training.train_steps=3",
        "training.steps_per_epoch=3",
        "training.steps_per_execution=3",
        "training.eval_batches=1",
        "training.jit_compile=false",
        "training.warmup_fraction=null",
        "training.warmup_steps=1",
        "training.sequence_length=32",
        "model.num_layers=2",
        f"model.vocab_size={len(tiny_mpnet['tokens'])}",
        "model.hidden_size=16",
        "model.num_heads=2",
        "model.intermediate_size=16",
        f"model.max_sequence_length={POSITIONS - 2}",
        "model.attention={type: fixed, head_size: 8}",
    ]
    argv = ["--config", "distill_mpnet_d192_fixed", "--run-dir", str(tmp_path / "run"), "--quiet"]
    for override in overrides:
        argv += ["--set", override]
    assert cli.main(argv) == 0
    loaded = runs.load(tmp_path / "run")
    config, backbone = loaded.config, loaded.backbone
    teacher_bias = safetensors.numpy.load_file(tiny_mpnet["dir"] / "model.safetensors")[
        "encoder.relative_attention_bias.weight"
    ]
    np.testing.assert_allclose(backbone.relative_attention_bias.embeddings.numpy(), teacher_bias[:, :2], atol=0.02)
    assert backbone.type_embeddings is None and backbone.position_offset == 2 and config.task.teacher_width == HIDDEN
    task = make_task(
        dataclasses.replace(config, task=dataclasses.replace(config.task, cache_dir=str(tmp_path / "cache")))
    )
    task.read()
    [cached] = [
        np.load(path) for path in (tmp_path / "cache").glob("*.npy") if np.load(path).shape[0] == len(task.eval_texts)
    ]
    ids = [
        encoding.ids[:31] + ([2] if len(encoding.ids) > 31 else [])
        for encoding in hugging_face_mpnet_tokenizer(tiny_mpnet["tokens"]).encode_batch(task.eval_texts)
    ]
    assert cosines(cached, reference_embeddings(tiny_mpnet["dir"], ids)).min() >= 0.99999


def test_a_classifier_fine_tunes_from_an_mpnet_folder(tiny_mpnet, tmp_path):
    """task.init an MPNet folder: the run takes its architecture (no segment types, counted positions, the relative
    bias) and fine-tunes a head on its mean token vector (a sentence-transformers folder), and reloads."""
    from concise_attention.cli import train as cli
    from concise_attention.training.run import runs

    short = [
        "training.sequence_length=32",
        "training.batch_size=8",
        "training.train_steps=2",
        "training.train_epochs=null",
        "training.steps_per_epoch=2",
        "training.steps_per_execution=2",
        "training.jit_compile=false",
        "training.warmup_fraction=null",
        "training.warmup_steps=1",
    ]
    argv = [
        "--config",
        "wordnet_topics",
        "--run-dir",
        str(tmp_path / "run"),
        "--quiet",
        "--set",
        f"task.init={tiny_mpnet['dir']}",
        *(item for override in short for item in ("--set", override)),
    ]
    assert cli.main(argv) == 0
    loaded = runs.load(tmp_path / "run")
    config, backbone = loaded.config, loaded.backbone
    assert (config.model.type_vocab_size, config.model.position_offset, config.model.relative_attention_buckets) == (
        0,
        2,
        BUCKETS,
    )
    assert config.task.pooling == "mean" and backbone.hidden_size == HIDDEN


def _load_join_script():
    from loading import load

    return load("scripts/join_mpnet.py")


def test_the_join_script_checks_the_zip_keeps_the_model_folder_and_replaces_only_its_own_output(
    tmp_path, monkeypatch, capsys
):
    import hashlib
    import zipfile

    join = _load_join_script()
    archive = tmp_path / "whole.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("all-mpnet-base-v2/config.json", '{"model_type": "mpnet"}')
        bundle.writestr("all-mpnet-base-v2/1_Pooling/config.json", "{}")
        bundle.writestr("all-mpnet-base-v2/desktop.ini", "[.ShellClassInfo]")
    data = archive.read_bytes()
    volumes = []
    for index, start in enumerate(range(0, len(data), len(data) // 4 + 1)):  # the zip cut into volumes
        volumes.append(tmp_path / f"all-mpnet-base-v2.zip.{index + 1:03d}")
        volumes[-1].write_bytes(data[start : start + len(data) // 4 + 1])
    monkeypatch.setattr(join, "PACKAGES", [f"part-{index}" for index in range(len(volumes))])
    monkeypatch.setattr(join, "volume", lambda package: volumes[int(package.split("-")[1])])
    monkeypatch.setattr(join, "ZIP_SHA256", hashlib.sha256(data).hexdigest())
    out = tmp_path / "all-mpnet-base-v2"
    assert join.main(["--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "1_Pooling/config.json",
        "config.json",
        "manifest.json",
    ]
    assert manifest["files"]["config.json"] == hashlib.sha256(b'{"model_type": "mpnet"}').hexdigest()
    assert join.main(["--out", str(out)]) == 0  # an earlier output is replaced
    mine = tmp_path / "mine"
    (mine / "src").mkdir(parents=True)
    (mine / "src" / "code.py").write_text("keep me")
    capsys.readouterr()
    for target in (mine, mine / "src" / "code.py"):
        with pytest.raises(SystemExit) as exit_info:
            join.main(["--out", str(target)])
        assert exit_info.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    assert (mine / "src" / "code.py").read_text() == "keep me"
    monkeypatch.setattr(join, "ZIP_SHA256", "0" * 64)
    with pytest.raises(SystemExit):
        join.main(["--out", str(tmp_path / "other")])
    assert "not the pinned" in capsys.readouterr().err and not (tmp_path / "other").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.type_vocab_size=2", "model.type_vocab_size=2 but the teacher's is 0"),
        ("model.position_offset=null", "model.position_offset=None but the teacher's is 2"),
        ("model.relative_attention_buckets=0", "model.relative_attention_buckets=0 but the teacher's is 32"),
        ("model.num_heads=8", "model.num_heads=8 exceeds the teacher's 4"),
    ],
)
def test_a_student_started_from_an_mpnet_teacher_takes_its_position_scheme(
    tiny_mpnet, tmp_path, capsys, override, message
):
    from concise_attention.cli import train as cli

    argv = ["--config", "distill_mpnet_d192_fixed", "--run-dir", str(tmp_path / "run"), "--quiet"]
    for setting in (
        f"task.teacher={tiny_mpnet['dir']}",
        f"task.cache_dir={tmp_path / 'cache'}",
        "task.dataset=sample",
        "task.data_dir=null",
        "model.hidden_size=16",
        "model.num_heads=2",
        "model.num_layers=2",
        "model.max_sequence_length=64",
        "model.intermediate_size=32",
        "model.attention={type: fixed, head_size: 8}",
        f"model.vocab_size={len(tiny_mpnet['tokens'])}",
        override,
    ):
        argv += ["--set", setting]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in error and error.count("\n") == 1, error
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.position_offset=abc", "`model.position_offset` must be a number > 0"),
        ("model.relative_attention_buckets=33", "`model.relative_attention_buckets` must be 0 or an even number >= 4"),
        ("model.relative_attention_max_distance=4", "`model.relative_attention_max_distance` must exceed"),
        ("model.type_vocab_size=-1", "`model.type_vocab_size` must be an integer >= 0"),
    ],
)
def test_bad_mpnet_settings_are_named_before_a_run_is_written(tmp_path, override, message):
    from concise_attention.training.run import configs

    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        configs.load_config("distill_mpnet_d384_fixed", [override])


@pytest.mark.parametrize(
    "field, value", [("pad_token_id", None), ("pad_token_id", "1"), ("relative_attention_num_buckets", 0)]
)
def test_a_bad_mpnet_config_json_is_one_line(tiny_mpnet, tmp_path, capsys, field, value):
    assert f"`{field}` must be an integer" in _export_error(tiny_mpnet, tmp_path, capsys, "config.json", {field: value})


def test_an_mpnet_folder_loads_where_the_cache_cannot_be_written(tiny_mpnet, tmp_path, monkeypatch):
    """The BERT-named vocabulary goes to the temporary directory when the per-user cache cannot be written."""
    from concise_attention.training import files
    from concise_attention.training import artifacts

    monkeypatch.setenv("CONCISE_ATTENTION_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(artifacts.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    write = files.write_verified

    def read_only_cache(base, *args, **kwargs):
        if base.startswith(str(tmp_path / "cache")):
            raise PermissionError(f"{base}: Read-only file system")
        return write(base, *args, **kwargs)

    monkeypatch.setattr(files, "write_verified", read_only_cache)
    vocabulary = artifacts.read(tiny_mpnet["dir"]).vocabulary
    assert vocabulary.startswith(str(tmp_path / "tmp")) and open(vocabulary).read().split("\n")[:3] == [
        "[CLS]",
        "[PAD]",
        "[SEP]",
    ]
