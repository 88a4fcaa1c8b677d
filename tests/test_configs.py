"""Presets: loading, validation, overrides, and the papers' parameter counts."""

import dataclasses
import inspect
import json

import pytest

from concise_attention.models.bert import BertEncoder
from concise_attention.models.lm import CausalLM
from concise_attention.training import files
from concise_attention.training.run import configs

# Bhojanapalli et al. (2020), Tables 1-3: parameters of the BERT-study models.
PAPER_PARAMETERS = {
    "bert_large": 336e6,
    "bert_d512_p128_h8": 168e6,
    "bert_d512_p128_h12": 193e6,
    "bert_d512_p128_h16": 218e6,
    "bert_d512_p128_h32": 319e6,
    "bert_d512_h8_p32": 130e6,
    "bert_d512_h8_p64": 142e6,
    "bert_d512_h8_p256": 218e6,
    "bert_d768_p128_h8": 214e6,
    "bert_d768_p128_h12": 252e6,
    "bert_d768_p128_h16": 290e6,
    "bert_d768_p128_h20": 327e6,
}


def _parameters(config):
    return configs.count_parameters(config)


@pytest.mark.parametrize("name", sorted(PAPER_PARAMETERS))
def test_bert_study_parameter_counts_match_the_paper(name):
    assert _parameters(configs.load_config(name)) == pytest.approx(PAPER_PARAMETERS[name], rel=0.01)


def test_deep_single_head_matches_shallow_multi_head_parameters():
    shallow = _parameters(configs.load_config("lm1b_shallow_multi_head"))
    deep = _parameters(configs.load_config("lm1b_deep_single_head_admin"))
    assert deep == pytest.approx(shallow, rel=0.01)
    config = configs.load_config("lm1b_deep_single_head_admin").model
    assert (config.num_layers, config.num_heads, config.residual_scaling) == (48, 1, "admin")


def test_collaborative_presets_use_a_quarter_and_an_eighth_of_the_key_dimension():
    for name, ratio in (("lm1b_collaborative_d512_k128", 4), ("lm1b_collaborative_d512_k64", 8)):
        model = configs.load_config(name).model
        assert model.num_heads * model.attention["head_size"] == ratio * model.attention["shared_key_dim"]


@pytest.mark.parametrize("name", [n for n in configs.preset_names() if n.startswith("tiny_")])
def test_tiny_presets_build_and_run(name):
    model = configs.load_config(name).build_model()
    assert model.count_params() < 200_000


def test_model_fields_are_the_builders_arguments():
    for model_type, builder in (("bert", BertEncoder), ("causal_lm", CausalLM)):
        arguments = [p for p in inspect.signature(builder.__init__).parameters if p not in ("self", "dtype", "kwargs")]
        assert sorted(f.name for f in dataclasses.fields(configs.MODEL_CONFIGS[model_type])) == sorted(arguments)


def test_configs_are_frozen():
    config = configs.load_config("tiny_bert_fixed")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model.num_heads = 3


def test_overrides_and_inheritance():
    config = configs.load_config("bert_d512_p128_h12", ["model.num_heads=32", "model.dropout=0"])
    assert (config.model.num_heads, config.model.attention, config.model.hidden_size) == (
        32,
        {"type": "fixed", "head_size": 128},
        512,
    )
    assert config.model.dropout == 0.0 and isinstance(config.model.dropout, float)
    assert config.model.num_layers == 24  # inherited from bert_large through bert_d512_p128_h8


def test_a_step_count_on_the_command_line_wins_over_the_files_epochs():
    """glue_base derives its steps from train_epochs: 3 and its warm-up from warmup_fraction: 0.1; an override of
    the count alone replaces the derivation (it used to be ignored silently), both overridden keep the epochs."""
    assert configs.load_config("glue_base").training.train_epochs == 3
    training = configs.load_config("glue_base", ["training.train_steps=4"]).training
    assert (training.train_steps, training.train_epochs, training.warmup_fraction) == (4, None, 0.1)
    training = configs.load_config("glue_base", ["training.warmup_steps=2"]).training
    assert (training.warmup_steps, training.warmup_fraction, training.train_epochs) == (2, None, 3)
    training = configs.load_config("glue_base", ["training.train_steps=4", "training.train_epochs=2"]).training
    assert (training.train_steps, training.train_epochs) == (4, 2)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.num_head=4"], "Unknown config key `model.num_head`"),
        (["trainer.steps=4"], "Unknown config key.*trainer"),
        (["model.num_heads=four"], r"`model.num_heads` must be of type int. Received: model.num_heads='four'"),
        (["model.tie_embeddings=3"], "model.tie_embeddings"),
        (["model_type=gpt"], "model_type='gpt'"),
        (["model.num_heads"], "key.subkey=value"),
    ],
)
def test_bad_configs_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        configs.load_config("tiny_lm", overrides)


def test_unknown_preset_lists_the_presets(tmp_path):
    with pytest.raises(ValueError, match="No such config file or preset: 'nope'.*tiny_lm"):
        configs.load_config("nope")
    path = tmp_path / "broken.yaml"
    path.write_text("model: [unclosed")
    with pytest.raises(ValueError, match="not valid YAML"):
        configs.load_config(path)


@pytest.mark.parametrize(
    "overrides, message",
    [(["model.position_embedding=rotary"], "kind='rotary'"), (["model.residual_scaling=admin"], "post-LN")],
)
def test_bad_model_configs_fail_at_build(overrides, message):
    with pytest.raises(ValueError, match=message):
        configs.load_config("tiny_lm", overrides).build_model()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["model.attention.type=sparse"],
            r"`model.attention.type` must be one of .*Received: model.attention.type='sparse'",
        ),
        (["model.attention.head_size=null"], "`model.attention.head_size` is required for attention type 'fixed'"),
        (
            ["model.attention.shared_key_dim=8"],
            "Unknown key `model.attention.shared_key_dim` for attention type 'fixed'",
        ),
        (["model.attention.type=collaborative"], "`model.attention.shared_key_dim` is required"),
        (["model.attention.num_heads=8"], r"`model.attention.num_heads` is set by the model \(num_heads\)"),
        (["model.attention=fixed"], "`model.attention` must be of type dict. Received: model.attention='fixed'"),
        # The flat attention keys of earlier versions, refused with the nested key to set:
        (["model.head_size=8"], "`model.head_size` is the flat form of `model.attention.head_size`"),
        (["model.attention_type=standard"], "`model.attention_type` is the flat form of `model.attention.type`"),
    ],
)
def test_bad_attention_configs_name_the_nested_key_at_load(overrides, message):
    with pytest.raises(ValueError, match=message):
        configs.load_config("tiny_lm", overrides)


def test_nested_attention_overrides():
    assert configs.load_config("tiny_lm", ["model.attention.head_size=64"]).model.attention == {
        "type": "fixed",
        "head_size": 64,
    }
    collaborative = configs.load_config(
        "tiny_lm", ["model.attention={type: collaborative, head_size: 8, shared_key_dim: 4}"]
    )
    assert collaborative.model.attention == {"type": "collaborative", "head_size": 8, "shared_key_dim": 4}
    # A preset inheriting part of the nested config: head size 32 over bert_d512_p128_h8's fixed attention.
    assert configs.load_config("bert_d512_h8_p32").model.attention == {"type": "fixed", "head_size": 32}
    # null is "not set": switching a fixed preset to standard attention by removing head_size.
    standard = configs.load_config("tiny_lm", ["model.attention.type=standard", "model.attention.head_size=null"])
    assert standard.model.attention == {"type": "standard"}
    assert standard.build_model().blocks[0].attention._head_size == 32 // 4
    # A preset naming another attention type than its base's replaces the base's attention whole.
    assert configs.load_config("distill_minilm_d192_standard").model.attention == {"type": "standard"}
    assert configs.load_config("distill_minilm_d384_standard").model.attention == {"type": "standard"}
    # Student (e) of the distillation table is student (a), started at random as (c) must be.
    fixed, random_start = (
        configs.load_config("distill_minilm_d192_fixed"),
        configs.load_config("distill_minilm_d192_fixed_random"),
    )
    assert random_start.model == fixed.model and random_start.training == fixed.training
    assert (fixed.task.student_init, random_start.task.student_init) == ("teacher", "random")


def test_a_run_directory_with_the_flat_attention_fields_of_earlier_versions_is_refused_in_one_line(tmp_path):
    """A config.json with the flat attention fields: reading it says which field and the nested one to set."""
    from concise_attention.training import artifacts
    from concise_attention.training.run import runs
    from concise_attention.training.tasks import make_task

    config = configs.load_config("tiny_bert_collaborative")
    backbone = config.build_model()
    old = json.loads(json.dumps(config.to_dict() | {"name": config.name}))
    del old["model"]["attention"]
    old["model"].update(attention_type="collaborative", head_size=8, shared_key_dim=8)
    run = runs.RunDirectory(tmp_path)
    files.write_json_atomically(run.file(files.CONFIG), old)
    run.save_models(backbone, make_task(config).build_model(backbone))
    message = "`model.attention_type` is the flat form of `model.attention.type` that earlier versions wrote"
    with pytest.raises(ValueError, match=message):
        artifacts.read(tmp_path)
    with pytest.raises(ValueError, match="model.attention_type"):
        runs.read_run_config(tmp_path)


def test_model_config_round_trips_through_the_builder():
    for name in ("tiny_bert_collaborative", "tiny_lm"):
        config = configs.load_config(name)
        model = config.build_model()
        arguments = {
            key: value for key, value in model.get_config().items() if key not in ("name", "trainable", "dtype")
        }
        assert arguments == dataclasses.asdict(config.model)
        assert type(model)(**model.get_config()).get_config() == model.get_config()


def test_command_line_prints_the_resolved_config(capsys, monkeypatch):
    """`python -m concise_attention.configs` (its __main__ run in this process)."""
    import runpy
    import sys

    monkeypatch.setattr(
        sys, "argv", ["python -m concise_attention.configs", "bert_d512_p128_h8", "--set", "model.num_heads=12"]
    )
    runpy.run_module("concise_attention.configs", run_name="__main__")
    out = capsys.readouterr().out
    assert "num_heads: 12" in out
    parameters = int(out.rsplit("parameters:", 1)[1].replace(",", ""))
    assert parameters == pytest.approx(193e6, rel=0.01)


def test_conversion_to_collaborative_keeps_head_size_and_checks_the_shared_width():
    converted = configs.to_collaborative(configs.load_config("lm1b_standard_d512"), 128)
    assert converted.model.attention == {
        "type": "collaborative",
        "head_size": 64,
        "shared_key_dim": 128,
        "mixing_initializer": "concatenate",
    }
    with pytest.raises(ValueError, match=r"num_heads \* head_size = 512.*shared_key_dim=513"):
        configs.to_collaborative(configs.load_config("lm1b_standard_d512"), 513)
    with pytest.raises(ValueError, match="shared_key_dim=0"):
        configs.to_collaborative(configs.load_config("tiny_bert_fixed"), 0)
    assert configs.to_collaborative(configs.load_config("tiny_bert_fixed"), 64).model.attention["head_size"] == 16


def test_exponent_floats_are_floats():
    config = configs.load_config("tiny_lm", ["training.learning_rate=1e-4", "model.layer_norm_epsilon=1e-12"])
    assert config.training.learning_rate == 1e-4 and config.model.layer_norm_epsilon == 1e-12


def test_every_preset_reads_back_from_json_unchanged():
    """A resume compares the saved config.json with the config again: a value that JSON reads back as
    another type (a tuple becomes a list) would make every resume look like a different run."""
    import json

    for name in configs.preset_names():
        config = configs.load_config(name)
        if config.task is None:
            continue
        written = config.to_dict()
        assert json.loads(json.dumps(written)) == written, name
