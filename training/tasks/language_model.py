"""Language-modelling tasks: `causal_lm` (next-token) and `masked_lm` (BERT's masked LM).

The TensorFlow pipelines are imported when data is read, not with the module: a process
without TensorFlow (the JAX shard trainer) reads these tasks' settings.
"""

import dataclasses
import math
import typing

import keras

from concise_attention.models.bert import BertPretrainer
from concise_attention.training.data import shards
from concise_attention.training.tasks.base import Task
from concise_attention.training.tasks.base import TaskSettings
from concise_attention.training.tasks.objectives import TokenCrossEntropy


@dataclasses.dataclass(frozen=True)
class LanguageModelSettings(TaskSettings):
    """dataset: "sample" (the shipped corpus), "lm1b" (tensorflow-datasets; data_dir may be
    gs://...), "text_files" (every *.txt under data_dir; every 20th line held out, or the
    folders train/ and heldout/ as the splits when data_dir has both, the layout of
    `scripts/make_corpus.py`) or "prepared" (the shards
    `concise-prepare-data` wrote to data_dir: tokenised and packed once, O(1) resume)."""

    dataset: str = "sample"
    data_dir: typing.Optional[str] = None

    def __post_init__(self):
        if self.dataset not in ("sample", "lm1b", "text_files", "prepared"):
            raise ValueError(
                f"`task.dataset` must be one of sample, lm1b, text_files, prepared. Received: task.dataset={self.dataset!r}"
            )
        if self.dataset in ("text_files", "prepared") and not self.data_dir:
            raise ValueError(f"`task.data_dir` must name the data folder when task.dataset={self.dataset!r}.")


class _TextCorpusTask(Task):
    reports_perplexity = True

    def load_data(self):
        import tensorflow as tf  # on first use: this module stays TensorFlow-free (the JAX route)

        from concise_attention.training.data.pipeline import corpus_splits

        settings = self.settings
        if settings.dataset == "prepared":
            self.manifest = shards.read_manifest(settings.data_dir, tf.io.gfile.GFile)
            shards.check_manifest(self.manifest, settings.data_dir, self.name, self.training.sequence_length)
            return
        self.train_lines, self.eval_lines = corpus_splits(settings.dataset, settings.data_dir)

    def input_files(self):
        if self.settings.dataset != "prepared":
            return {}
        return {"prepared data manifest": f"{self.settings.data_dir.rstrip('/')}/{shards.MANIFEST}"}

    def vocabulary_text(self):
        if self.settings.dataset == "prepared":
            raise ValueError(
                f"task.dataset='prepared' needs the vocabulary the shards were made with: set "
                f"tokenizer.vocabulary={self.settings.data_dir}/{shards.VOCABULARY}."
            )
        return self.train_lines()

    def prepared_datasets(self, tokenizer, skip_batches, mask=None):
        """(train, eval) datasets of the prepared shards, checked against the run's vocabulary."""
        import tensorflow as tf  # on first use: this module stays TensorFlow-free (the JAX route)

        from concise_attention.training.data.pipeline import prepared_dataset

        settings, training = self.settings, self.training
        shards.check_manifest(
            self.manifest,
            settings.data_dir,
            self.name,
            training.sequence_length,
            tokenizer.get_vocabulary(),
            {"lowercase": tokenizer.module.lowercase, "strip_accents": tokenizer.module.strip_accents},
        )
        readers = [
            shards.ShardReader(settings.data_dir, split, tf.io.gfile.GFile, training.seed, self.manifest)
            for split in shards.SPLITS
        ]
        return (
            prepared_dataset(readers[0], training.batch_size, skip_batches, mask),
            prepared_dataset(readers[1], training.batch_size, 0, mask),
        )


class CausalLMTask(_TextCorpusTask):
    """Next-token prediction on tensor2tensor-packed rows; per-subword and per-word perplexity."""

    name, Config, backbone_type = "causal_lm", LanguageModelSettings, "causal_lm"

    def build_model(self, backbone):
        return backbone

    def compile_arguments(self):
        return {
            "loss": TokenCrossEntropy(self.training.label_smoothing),
            "weighted_metrics": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        }

    def row_chunks(self, lines, tokenizer):
        """Packed rows of `lines` for `concise-prepare-data` (the rows `datasets` trains on)."""
        from concise_attention.training.data.pipeline import packed_chunks  # TensorFlow: on first use

        return packed_chunks(lines, tokenizer, self.training.sequence_length)

    def datasets(self, tokenizer, skip_batches):
        from concise_attention.training.data.pipeline import EVAL_WORD_LINES  # TensorFlow: on first use
        from concise_attention.training.data.pipeline import language_model_dataset
        from concise_attention.training.data.pipeline import tokens_per_word

        training = self.training
        if self.settings.dataset == "prepared":
            self.tokens_per_word = self.manifest["tokens_per_word"]
            return self.prepared_datasets(tokenizer, skip_batches)
        self.tokens_per_word = tokens_per_word(
            [line for _, line in zip(range(EVAL_WORD_LINES), self.eval_lines())], tokenizer
        )

        def make(lines, is_training, skip=0):
            return language_model_dataset(
                lines,
                tokenizer,
                training.sequence_length,
                training.batch_size,
                training=is_training,
                seed=training.seed,
                skip_batches=skip,
            )

        return make(self.train_lines, True, skip_batches), make(self.eval_lines, False)

    def profiling_inputs(self, batch_inputs):
        return batch_inputs

    def evaluate(self, model, final):
        results = model.evaluate(final, steps=_batch_count(final), verbose=0, return_dict=True)
        loss = results["loss"]
        return {
            "eval_loss": loss,
            "eval_accuracy": results["accuracy"],
            "eval_subword_perplexity": math.exp(min(loss, 50.0)),
            "eval_word_perplexity": math.exp(min(loss * self.tokens_per_word, 50.0)),
            "tokens_per_word": self.tokens_per_word,
        }


@dataclasses.dataclass(frozen=True)
class MaskedLMSettings(LanguageModelSettings):
    """`mask_rate` of the tokens (at most `max_predictions` per row) are masked 80/10/10."""

    mask_rate: float = 0.15
    max_predictions: int = 20

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 < self.mask_rate < 1.0:
            raise ValueError(f"`task.mask_rate` must be in (0, 1). Received: task.mask_rate={self.mask_rate!r}")
        if self.max_predictions < 1:
            raise ValueError(
                f"`task.max_predictions` must be positive. Received: task.max_predictions={self.max_predictions!r}"
            )


class MaskedLMTask(_TextCorpusTask):
    """BERT's masked LM (tied output embedding) on segment pairs; no next-sentence task."""

    name, Config = "masked_lm", MaskedLMSettings

    def check(self):
        super().check()
        if self.settings.max_predictions > self.training.sequence_length:
            raise ValueError(
                f"task.max_predictions={self.settings.max_predictions} is above "
                f"training.sequence_length={self.training.sequence_length}."
            )

    def build_model(self, backbone):
        return BertPretrainer(backbone)

    compile_arguments = CausalLMTask.compile_arguments

    def row_chunks(self, lines, tokenizer):
        """Unmasked segment-pair rows of `lines` for `concise-prepare-data`."""
        from concise_attention.training.data.pipeline import segment_pair_chunks  # TensorFlow: on first use

        return segment_pair_chunks(lines, tokenizer, self.training.sequence_length)

    def datasets(self, tokenizer, skip_batches):
        from concise_attention.training.data.pipeline import masked_examples  # TensorFlow: on first use
        from concise_attention.training.data.pipeline import masked_lm_dataset

        training, settings = self.training, self.settings
        if settings.dataset == "prepared":
            mask = masked_examples(
                tokenizer,
                training.sequence_length,
                training.batch_size,
                settings.max_predictions,
                settings.mask_rate,
                training.seed,
            )
            return self.prepared_datasets(tokenizer, skip_batches, mask)

        def make(lines, is_training, skip=0):
            return masked_lm_dataset(
                lines,
                tokenizer,
                training.sequence_length,
                training.batch_size,
                settings.max_predictions,
                settings.mask_rate,
                training=is_training,
                seed=training.seed,
                skip_batches=skip,
            )

        return make(self.train_lines, True, skip_batches), make(self.eval_lines, False)

    def evaluate(self, model, final):
        results = model.evaluate(final, steps=_batch_count(final), verbose=0, return_dict=True)
        return {
            "eval_loss": results["loss"],
            "eval_accuracy": results["accuracy"],
            "eval_subword_perplexity": math.exp(min(results["loss"], 50.0)),
        }


def _batch_count(batches):
    """The batches of a finite tf.data dataset (the kept held-out ones: cached), counted, so that `model.evaluate`
    with steps_per_execution > 1 stops at the last one; None for a generator (read to its end)."""
    return sum(1 for _ in batches) if hasattr(batches, "cardinality") else None
