"""YAML presets -> frozen dataclasses -> builders, with no renaming on the way.

A preset is `configs/<name>.yaml` (or any YAML path):

    description: what it is
    base: another_preset        # optional: start from that preset, then override
    model_type: bert            # bert | causal_lm: which builder
    model:                      # exactly the builder's constructor arguments
      hidden_size: 512
      attention: {type: fixed, head_size: 128}   # the attention variant and its own arguments
      ...

The model dataclasses are generated from the builders' signatures, so a config field is
a builder argument by construction. Unknown keys and values of the wrong type are errors
that name the key. `--set model.num_heads=16` style overrides apply after the YAML
(`--set model.attention.head_size=64` reaches into the nested attention config).

    python -m concise_attention.configs bert_d512_p128_h8 --set model.num_heads=12   # resolved config + parameters
"""

import argparse
import contextlib
import dataclasses
import math
import json
import inspect
import pathlib
import types
import typing

import yaml

from concise_attention.models import BUILDERS
from concise_attention.models.attention import attention_config
from concise_attention.models.attention import make_attention
from concise_attention.models.attention import check_nested_attention
from concise_attention.models.bert import BertEncoder
from concise_attention.models.lm import CausalLM
from concise_attention.models.transformer import head_size_of
from concise_attention.training.tasks import default_task_name
from concise_attention.training.tasks import task_class

PRESET_DIRECTORY = pathlib.Path(__file__).resolve().parents[2] / "configs"  # the YAML presets (package data)


def _field_type(parameter):
    """The type a field accepts: the builder's annotation, else read off its default value."""
    if parameter.annotation is not inspect.Parameter.empty:
        return parameter.annotation
    default = parameter.default
    if default is inspect.Parameter.empty:
        return int  # every required builder argument is a size
    if default is None:
        return typing.Optional[typing.Union[int, str]]
    if isinstance(default, bool):
        return bool
    if isinstance(default, float):
        return float
    return type(default)


def _model_dataclass(name, builder):
    fields = []
    for parameter in inspect.signature(builder.__init__).parameters.values():
        if parameter.name not in builder.config_arguments():
            continue
        field_type = _field_type(parameter)
        if parameter.default is inspect.Parameter.empty:
            fields.append((parameter.name, field_type))
        else:
            fields.append((parameter.name, field_type, dataclasses.field(default=parameter.default)))
    fields.sort(key=lambda field: len(field) == 3)  # required fields first
    return dataclasses.make_dataclass(name, fields, frozen=True, namespace={"__post_init__": _check_model})


# The model settings' domains beyond their types (a builder would accept some of these and train to NaN or fail
# to allocate after the run directory is written): fractions in [0, 1), and positive settings with their upper bounds.
MODEL_FRACTIONS = ("dropout", "attention_dropout")
MODEL_POSITIVES = {
    "layer_norm_epsilon": None,
    "initializer_range": None,
    "vocab_size": 10_000_000,
    "hidden_size": 65_536,
    "intermediate_size": 1_048_576,
    "max_sequence_length": 1_048_576,
    "num_layers": 1_024,
    "num_heads": 4_096,
    "position_offset": 1_024,
    "relative_attention_max_distance": 1_048_576,
    "stem_width": 65_536,
    "stem_heads": 4_096,
    "stem_intermediate_size": 1_048_576,
}
MODEL_COUNTS = {"type_vocab_size": 1_024, "relative_attention_buckets": 1_024, "stem_layers": 1_024}  # 0: none


def _check_model(model):
    """Each model setting in its domain (`MODEL_FRACTIONS`, `MODEL_POSITIVES`, `MODEL_COUNTS`), then the attention
    config (`_check_attention`)."""
    for name in MODEL_FRACTIONS:
        value = getattr(model, name, None)
        if value is not None and not isinstance(value, bool) and not 0.0 <= value < 1.0:
            raise ValueError(f"`model.{name}` must be in [0, 1). Received: model.{name}={value!r}")
    for name, high in MODEL_POSITIVES.items():
        value = getattr(model, name, None)
        if (
            value is not None
            and not isinstance(value, bool)
            and not (isinstance(value, (int, float)) and value > 0 and (high is None or value <= high))
        ):
            domain = "a number > 0" + (f" and <= {high:,}" if high is not None else "")
            raise ValueError(f"`model.{name}` must be {domain}. Received: model.{name}={value!r}")
    for name, high in MODEL_COUNTS.items():
        value = getattr(model, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high):
            raise ValueError(
                f"`model.{name}` must be an integer >= 0 and <= {high:,}. Received: model.{name}={value!r}"
            )
    _check_relative_bias(model)
    _check_attention(model)


def _check_relative_bias(model):
    """MPNet's relative position bias (`models.embedding.RelativePositionBias`): none, or an even number of buckets,
    at least 4, and a distance above a quarter of them."""
    buckets, distance = (
        getattr(model, "relative_attention_buckets", 0),
        getattr(model, "relative_attention_max_distance", None),
    )
    if buckets and (buckets < 4 or buckets % 2):
        raise ValueError(f"`model.relative_attention_buckets` must be 0 or an even number >= 4. Received: {buckets!r}")
    if buckets and distance is not None and distance <= buckets // 4:
        raise ValueError(
            f"`model.relative_attention_max_distance` must exceed relative_attention_buckets / 4 = {buckets // 4}. "
            f"Received: {distance!r}"
        )


def _check_attention(model):
    """Holds the nested attention config in its canonical form, checked (errors name `model.attention.*`).

    The variant is also constructed once (no weights: cheap), so that its constructor checks
    the values now, before a run directory is written, not when the trainer builds the model.
    """
    object.__setattr__(model, "attention", attention_config(model.attention, prefix="model.attention"))
    try:
        make_attention(model.attention, model.num_heads)
    except (ValueError, TypeError) as error:
        raise ValueError(f"model.attention={model.attention!r}: {error}") from error


MODEL_CONFIGS = {
    "bert": _model_dataclass("BertConfig", BertEncoder),
    "causal_lm": _model_dataclass("CausalLMConfig", CausalLM),
}


STRATEGIES = ("auto", "cpu", "mirrored", "multi_worker", "tpu")
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
SECTIONS = ("description", "model_type", "model", "task", "tokenizer", "training")


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """How a model trains; the defaults are the paper's tensor2tensor LM recipe.

    The learning rate rises linearly to `learning_rate` over `warmup_steps` (or `warmup_fraction`
    of the steps), then `decay` is "rsqrt" (1/sqrt(step)), "linear" (to 0 at the last step) or
    "constant". AdamW with decoupled weight decay. `train_epochs` (passes over the
    training examples), when set, replaces `train_steps`. A checkpoint is saved every `steps_per_epoch`
    steps and on SIGTERM; the last `keep_checkpoints` are kept. `precision`: the Keras dtype
    policy, "float32", "mixed_bfloat16" or "mixed_float16". `clip_norm`, when set, scales each step's
    gradient (summed over replicas) to a global norm of at most `clip_norm` (BERT clips at 1.0).
    """

    sequence_length: int = 256
    batch_size: int = 64
    train_steps: int = 10000
    train_epochs: typing.Optional[float] = None
    steps_per_epoch: int = 500
    eval_batches: int = 20
    learning_rate: float = 1e-3
    warmup_steps: int = 1000
    warmup_fraction: typing.Optional[float] = None
    decay: str = "rsqrt"
    adam_beta_1: float = 0.9
    adam_beta_2: float = 0.98
    adam_epsilon: float = 1e-9
    weight_decay: float = 0.01
    label_smoothing: float = 0.0
    steps_per_execution: int = 10
    jit_compile: bool = True
    strategy: str = "auto"
    tpu: typing.Optional[str] = None
    seed: int = 0
    precision: str = "float32"
    keep_checkpoints: int = 3
    clip_norm: typing.Optional[float] = None

    def __post_init__(self):
        for name in (
            "learning_rate",
            "weight_decay",
            "label_smoothing",
            "adam_beta_1",
            "adam_beta_2",
            "adam_epsilon",
            "train_epochs",
            "warmup_fraction",
            "clip_norm",
        ):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"`training.{name}` must be a finite number. Received: training.{name}={value!r}")
        for name, allowed in (
            ("strategy", STRATEGIES),
            ("decay", ("rsqrt", "linear", "constant")),
            ("precision", PRECISIONS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"`training.{name}` must be one of {allowed}. Received: training.{name}={getattr(self, name)!r}"
                )
        for name in (
            "sequence_length",
            "batch_size",
            "train_steps",
            "steps_per_epoch",
            "eval_batches",
            "steps_per_execution",
            "keep_checkpoints",
        ):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"`training.{name}` must be positive. Received: training.{name}={getattr(self, name)!r}"
                )
        optional = tuple(name for name in ("train_epochs", "clip_norm") if getattr(self, name) is not None)
        for name in ("adam_epsilon",) + optional:
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"`training.{name}` must be positive. Received: training.{name}={getattr(self, name)!r}"
                )
        for name in ("learning_rate", "warmup_steps", "weight_decay", "label_smoothing", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"`training.{name}` must be >= 0. Received: training.{name}={getattr(self, name)!r}")
        for name in ("adam_beta_1", "adam_beta_2", "label_smoothing") + (
            ("warmup_fraction",) if self.warmup_fraction is not None else ()
        ):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(
                    f"`training.{name}` must be in [0, 1). Received: training.{name}={getattr(self, name)!r}"
                )
        self._check_schedule()

    def _check_schedule(self):
        fixed_warmup = self.train_epochs is None and self.warmup_fraction is None
        if self.decay == "linear" and fixed_warmup and self.train_steps <= self.warmup_steps:
            raise ValueError(
                f"Linear decay needs training.train_steps > training.warmup_steps. "
                f"Received: train_steps={self.train_steps}, warmup_steps={self.warmup_steps}"
            )


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    """The WordPiece tokenizer, with the semantics of BERT's (google-research/bert).

    vocabulary: a vocab.txt; by default the `task.init` model's, else WordPiece trained on
        the task's text and cached in the run directory.
    lowercase, strip_accents: BERT's do_lower_case and strip_accents (None: as lowercase).
        Left None they come from the `task.init` model (tokenizer_config.json of a Hugging
        Face folder, or the run's config); set, they must agree with it.
    """

    vocabulary: typing.Optional[str] = None
    lowercase: typing.Optional[bool] = None
    strip_accents: typing.Optional[bool] = None


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """A resolved preset: which builder, its arguments, the task and how to train it.

    `model` is None only while `task.init` is to supply the architecture (see
    `training.trainers.trainer.resolve_config`).
    """

    name: str
    model_type: typing.Optional[str]
    model: typing.Any
    task: typing.Any
    description: str = ""
    training: typing.Optional[TrainingConfig] = None
    tokenizer: TokenizerConfig = TokenizerConfig()

    def build_model(self, **kwargs):
        """The backbone this config describes (`kwargs` go to the builder, e.g. `dtype`)."""
        return BUILDERS[self.model_type](**dataclasses.asdict(self.model), **kwargs)

    def to_dict(self):
        config = {
            "description": self.description,
            "model_type": self.model_type,
            "model": dataclasses.asdict(self.model) if self.model is not None else None,
            "task": dataclasses.asdict(self.task),
            "tokenizer": dataclasses.asdict(self.tokenizer),
        }
        if self.training is not None:
            config["training"] = dataclasses.asdict(self.training)
        return config


def count_parameters(config):
    """Parameters of the model `config` describes, from shapes alone: no weights are allocated.

    Builds under a stateless scope, then clears the Keras session (keeping the dtype
    policy) so that the never-initialised variables are dropped, not initialised later by
    the next scope that initialises deferred variables.
    """
    import keras  # on first use: reading and validating a config stays quick (no backend import)

    policy = keras.config.dtype_policy()
    with keras.StatelessScope(initialize_variables=False):
        count = config.build_model().count_params()
    keras.utils.clear_session(free_memory=False)
    keras.config.set_dtype_policy(policy)
    return count


def to_collaborative(config, shared_key_dim, mixing_initializer="concatenate"):
    """The same model with collaborative attention of shared key width `shared_key_dim`.

    The heads keep their size (so their softmax temperature): head_size is the source's
    (width / heads for standard attention). A shared width above num_heads * head_size
    would exceed the rank of the concatenated heads, so it is refused.
    """
    model = config.model
    if model.attention["type"] == "collaborative":
        raise ValueError(f"Config {config.name!r} already uses collaborative attention.")
    head_size = head_size_of(model)
    exact = model.num_heads * head_size
    if isinstance(shared_key_dim, bool) or not isinstance(shared_key_dim, int) or not 1 <= shared_key_dim <= exact:
        raise ValueError(
            f"`shared_key_dim` must be an integer in [1, num_heads * head_size = {exact}] when converting {config.name!r}. "
            f"Received: shared_key_dim={shared_key_dim!r}"
        )
    attention = {
        "type": "collaborative",
        "head_size": head_size,
        "shared_key_dim": shared_key_dim,
        "mixing_initializer": mixing_initializer,
    }
    collaborative = dataclasses.replace(model, attention=attention)
    return dataclasses.replace(config, name=f"{config.name}_collaborative_k{shared_key_dim}", model=collaborative)


def preset_names():
    return sorted(path.stem for path in PRESET_DIRECTORY.glob("*.yaml"))


def _read(name_or_path, seen=()):
    path = pathlib.Path(name_or_path)
    if not path.suffix:
        path = PRESET_DIRECTORY / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ValueError(f"No such config file or preset: {str(name_or_path)!r}. Presets: {', '.join(preset_names())}")
    if path.resolve() in seen:
        raise ValueError(f"Config {path.name} inherits from itself through `base`.")
    try:
        # JSON is YAML, but PyYAML reads JSON's 1e-06 as a string: parse .json as JSON.
        raw = (json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())) or {}
    except json.JSONDecodeError as error:
        raise ValueError(
            f"Config {path} is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})."
        ) from None
    except yaml.YAMLError as error:
        raise ValueError(f"Config {path} is not valid YAML ({_yaml_problem(error)}).") from None
    if not isinstance(raw, dict):
        raise ValueError(f"Config {path} must be a YAML mapping. Received: {type(raw).__name__}")
    base = raw.pop("base", None)
    if base is None:
        return raw
    sibling = path.parent / f"{base}.yaml"  # a preset name: the file beside this one, else the shipped preset
    merged = _read(
        base if pathlib.Path(str(base)).suffix else sibling if sibling.is_file() else str(base), (*seen, path.resolve())
    )
    merged.pop("description", None)
    return _merge(merged, raw)


def _yaml_problem(error):
    """One line of a PyYAML error: its problem and where (line and column counted from 1)."""
    mark = getattr(error, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(str(getattr(error, "problem", None) or error).split()) + where


def _merge(base, override):
    merged = dict(base)
    for key, value in override.items():
        if (
            key == "attention"
            and isinstance(value, dict)
            and isinstance(merged.get(key), dict)
            and value.get("type", merged[key].get("type")) != merged[key].get("type")
        ):
            merged[key] = value  # another attention type: its base's arguments (head_size...) do not apply
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


ENVIRONMENT_EXIT_CODE = 3  # the machine, not the input: a read-only folder, a full disk, a missing permission


def environment_errors():
    """The exceptions that mean the environment failed (OSError, and TensorFlow's file-system errors)."""
    import tensorflow as tf  # on first use: this module stays TensorFlow-free (the JAX shard trainer's route)

    return (OSError, tf.errors.PermissionDeniedError, tf.errors.ResourceExhaustedError, tf.errors.UnavailableError)


def path_errors():
    """TensorFlow's errors for a path that cannot be what it is asked to be (under a file, missing, already there):
    bad input, as a ValueError is."""
    import tensorflow as tf  # on first use, as environment_errors: this module stays TensorFlow-free

    return (tf.errors.FailedPreconditionError, tf.errors.NotFoundError, tf.errors.AlreadyExistsError)


def environment_error(error):
    """One line for an OSError (or TensorFlow's file errors): what failed, on which file."""
    name = getattr(error, "filename", None)
    reason = getattr(error, "strerror", None) or getattr(error, "message", None) or str(error)
    return f"{name}: {reason}" if name else " ".join(str(reason).split())


@contextlib.contextmanager
def one_line_errors(parser, program):
    """A command's errors as one line naming `program`, no traceback: bad input (ValueError, a path TensorFlow
    refuses: path_errors) exits 2, the environment (environment_errors) exits 3."""
    try:
        yield
    except ValueError as error:
        parser.exit(2, f"{program}: error: {error}\n")
    except path_errors() as error:
        parser.exit(2, f"{program}: error: {environment_error(error)}\n")
    except environment_errors() as error:
        parser.exit(ENVIRONMENT_EXIT_CODE, f"{program}: error: {environment_error(error)}\n")


def parse_override(text):
    """`a.b=value` -> (["a", "b"], value parsed as YAML)."""
    key, separator, value = text.partition("=")
    if not separator or not key:
        raise ValueError(f"An override must look like key.subkey=value. Received: {text!r}")
    try:
        return key.strip().split("."), yaml.safe_load(value)
    except yaml.YAMLError as error:
        raise ValueError(f"--set {text!r}: the value is not valid YAML ({_yaml_problem(error)}).") from None


def _check_type(key, value, expected):
    origin = typing.get_origin(expected)
    allowed = typing.get_args(expected) if origin in (typing.Union, types.UnionType) else (expected,)
    if value is None and type(None) in allowed:
        return value
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if float in allowed and isinstance(value, str):
        try:  # YAML 1.1 reads 1e-4 (no dot) as a string
            return float(value)
        except ValueError:
            pass
    if isinstance(value, bool) and bool not in allowed:
        raise ValueError(f"`{key}` must be of type {expected}. Received: {key}={value!r}")
    if not isinstance(value, tuple(t for t in allowed if t is not type(None))):
        names = " or ".join(t.__name__ for t in allowed if t is not type(None))
        raise ValueError(f"`{key}` must be of type {names}. Received: {key}={value!r}")
    if isinstance(value, float) and not math.isfinite(value):  # no setting of this schema means nan or inf
        raise ValueError(f"`{key}` must be a finite number. Received: {key}={value!r}")
    return value


def _to_dataclass(cls, values, prefix):
    if not isinstance(values, dict):
        raise ValueError(f"`{prefix}` must be a mapping. Received: {prefix}={values!r}")
    fields = {field.name: field for field in dataclasses.fields(cls)}
    for key in values:
        if key not in fields:
            raise ValueError(f"Unknown config key `{prefix}.{key}`. Known keys: {', '.join(sorted(fields))}")
    missing = [name for name, field in fields.items() if name not in values and field.default is dataclasses.MISSING]
    if missing:
        raise ValueError(f"Missing config key(s): {', '.join(f'{prefix}.{name}' for name in missing)}")
    return cls(**{key: _check_type(f"{prefix}.{key}", value, fields[key].type) for key, value in values.items()})


# Counts a config may give directly or derive, the derivation winning where both are set: an override of the
# count alone clears the file's derivation, so `--set training.train_steps=4` trains 4 steps whatever the file says.
COUNT_DERIVATIONS = {("training", "train_steps"): "train_epochs", ("training", "warmup_steps"): "warmup_fraction"}


def load_config(name_or_path, overrides=()):
    """Reads a preset name or YAML path, applies `key=value` overrides, validates. An override of
    training.train_steps (warmup_steps) alone clears the file's train_epochs (warmup_fraction): `COUNT_DERIVATIONS`.

    Args:
        name_or_path: a preset name (see `preset_names()`) or a path to a YAML file.
        overrides: strings like "model.num_heads=16".

    Returns:
        A frozen `ExperimentConfig`.
    """
    raw, overridden = _read(name_or_path), set()
    for text in overrides:
        keys, value = parse_override(text)
        target = raw
        for key in keys[:-1]:
            target = target.setdefault(key, {})
            if not isinstance(target, dict):
                raise ValueError(f"Cannot override `{text}`: `{key}` is not a mapping.")
        target[keys[-1]] = value
        overridden.add(tuple(keys))
    for (section, count), derivation in COUNT_DERIVATIONS.items():
        # a count named on the command line wins over the file's way to derive it (e.g. glue_base's train_epochs: 3)
        if (
            (section, count) in overridden
            and (section, derivation) not in overridden
            and isinstance(raw.get(section), dict)
        ):
            raw[section][derivation] = None
    return config_from_dict(raw, pathlib.Path(str(name_or_path)).stem)


def config_from_dict(raw, name):
    """An `ExperimentConfig` from a config mapping (a preset's YAML or a run's config.json)."""
    unknown = set(raw) - set(SECTIONS) - {"name"}
    if unknown:
        raise ValueError(f"Unknown config key(s): {', '.join(sorted(unknown))}. Known keys: {', '.join(SECTIONS)}")
    task = dict(raw.get("task") or {})
    model_type = raw.get("model_type")
    if model_type is not None and model_type not in MODEL_CONFIGS:
        raise ValueError(f"`model_type` must be one of {sorted(MODEL_CONFIGS)}. Received: model_type={model_type!r}")
    task.setdefault("name", default_task_name(model_type) if model_type else None)
    task_settings = _to_dataclass(task_class(task["name"]).Config, task, "task")
    if raw.get("model") is not None and model_type is None:
        raise ValueError(f"`model_type` must be one of {sorted(MODEL_CONFIGS)}. Received: model_type=None")
    return ExperimentConfig(
        name=name,
        model_type=model_type,
        model=_model_config(model_type, raw.get("model")),
        task=task_settings,
        description=raw.get("description", ""),
        training=_to_dataclass(TrainingConfig, raw["training"], "training")
        if raw.get("training") is not None
        else None,
        tokenizer=_to_dataclass(TokenizerConfig, raw.get("tokenizer") or {}, "tokenizer"),
    )


def _model_config(model_type, model):
    if model is None:
        return None
    if not isinstance(model, dict):
        raise ValueError(f"`model` must be a mapping. Received: model={model!r}")
    return _to_dataclass(MODEL_CONFIGS[model_type], check_nested_attention(model), "model")


def add_config_arguments(parser):
    """Adds `--config NAME_OR_PATH` and repeatable `--set key=value` to an argparse parser."""
    parser.add_argument(
        "--config", required=True, help=f"preset name or YAML path; presets: {', '.join(preset_names())}"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. model.num_heads=16"
    )
    return parser


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m concise_attention.configs", description="Print a resolved config and its parameter count."
    )
    parser.add_argument("config", help=f"preset name or YAML path; presets: {', '.join(preset_names())}")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. model.num_heads=16"
    )
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.set)
    except ValueError as error:
        parser.exit(2, f"python -m concise_attention.configs: error: {error}\n")
    print(yaml.safe_dump(config.to_dict(), sort_keys=False).rstrip())
    if config.model is None:
        print("parameters: those of the model task.init names (the config has no model section)")
    else:
        print(f"parameters: {count_parameters(config):,}")
