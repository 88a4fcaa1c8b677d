"""What every task feeds the trainer. Static shapes and int32 ids (what a TPU needs), and the
data position of every fine-tuning task: a run resumed after `k` batches reads what an
uninterrupted run reads from batch `k` on (the trainer resumes through
`task.data(tokenizer, skip_batches=k)`). Together with the SIGKILL + restart test of a
classification run (tests/test_reproducibility.py), whose model-side restore is the same for
every task, this covers the resume of GLUE single-sentence and pair tasks, STS-B and SQuAD."""

import dataclasses

import numpy as np
import pytest

from concise_attention.training.run import configs
from test_finetuning import SHORT
from test_finetuning import TINY_BERT
from test_finetuning import _write_mrpc
from test_span_qa import _write_squad
from concise_attention.training.trainers import trainer
from concise_attention.training.preprocessing.tokenizer import tokenizer_settings
from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer
from concise_attention.training.tasks import make_task

SKIP, COMPARED = 3, 4  # batches consumed before the resume, batches compared after it


def _task(preset, minilm_dir, *overrides, model=TINY_BERT):
    config = configs.load_config(
        preset, [*model, *SHORT, f"tokenizer.vocabulary={minilm_dir / 'vocab.txt'}", *overrides]
    )
    config, _ = trainer.resolve_config(config)
    task = make_task(config)
    task.check()
    task.read()
    return dataclasses.replace(config, task=task.settings), task


def _batches(dataset, count):
    return [[np.asarray(part) for part in _flatten(batch)] for batch in dataset.take(count)]


def _flatten(structure):
    if isinstance(structure, dict):
        return [leaf for key in sorted(structure) for leaf in _flatten(structure[key])]
    if isinstance(structure, (tuple, list)):
        return [leaf for item in structure for leaf in _flatten(item)]
    return [structure]


def _assert_resumes_where_it_stopped(config, task, minilm_dir):
    tokenizer = wordpiece_tokenizer(minilm_dir / "vocab.txt", **tokenizer_settings(config))
    uninterrupted = _batches(task.data(tokenizer, skip_batches=0).train, SKIP + COMPARED)
    resumed = _batches(task.data(tokenizer, skip_batches=SKIP).train, COMPARED)
    assert len(resumed) == COMPARED
    for expected, actual in zip(uninterrupted[SKIP:], resumed):
        assert len(expected) == len(actual)
        for left, right in zip(expected, actual):
            np.testing.assert_array_equal(left, right)
    # The stream moves: a resume that restarted from batch 0 would not pass.
    assert any(not np.array_equal(a, b) for a, b in zip(_flatten(uninterrupted[0]), _flatten(uninterrupted[SKIP])))


@pytest.mark.parametrize("preset", ["glue_sst2", "glue_stsb"])
def test_glue_tasks_on_mock_data_resume_at_the_batch_they_stopped(preset, minilm_dir):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=40):
        config, task = _task(preset, minilm_dir)
        _assert_resumes_where_it_stopped(config, task, minilm_dir)


def test_a_pair_task_from_the_original_tsv_files_resumes_at_the_batch_it_stopped(tmp_path, minilm_dir):
    _write_mrpc(tmp_path / "MRPC")
    config, task = _task("glue_mrpc", minilm_dir, "task.dataset=glue_tsv/mrpc", f"task.data_dir={tmp_path / 'MRPC'}")
    _assert_resumes_where_it_stopped(config, task, minilm_dir)


def test_span_qa_resumes_at_the_batch_it_stopped(tmp_path, minilm_dir):
    _write_squad(tmp_path / "squad")
    config, task = _task(
        "squad_v1",
        minilm_dir,
        "task.dataset=squad_json",
        f"task.data_dir={tmp_path / 'squad'}",
        "training.batch_size=2",
        "task.max_query_length=8",
        "task.doc_stride=8",
    )
    _assert_resumes_where_it_stopped(config, task, minilm_dir)


def _assert_static_int32(dataset, name):
    import tensorflow as tf

    specs = _flatten(dataset.element_spec)
    assert all(spec.shape.is_fully_defined() for spec in specs), (name, dataset.element_spec)
    assert all(spec.dtype in (tf.int32, tf.float32) for spec in specs), (name, dataset.element_spec)


@pytest.mark.parametrize(
    "preset, overrides",
    [
        ("tiny_lm", ["model.vocab_size=30522", "model.max_sequence_length=64"]),
        ("tiny_bert_fixed", ["model.vocab_size=30522", "model.max_sequence_length=64"]),
        ("glue_mrpc", ["task.dataset=glue_tsv/mrpc"]),
        ("glue_stsb", ["task.dataset=glue_tsv/stsb"]),
        ("squad_v1", ["task.dataset=squad_json", "task.max_query_length=8", "task.doc_stride=8"]),
    ],
)
def test_every_task_feeds_static_shapes_and_int32_ids(preset, overrides, tmp_path, minilm_dir):
    """The TPU strategy path: every training and evaluation tensor has a fully defined shape
    (drop_remainder, fixed length) and ids are int32."""
    _write_mrpc(tmp_path / "MRPC")
    (tmp_path / "STS-B").mkdir()
    rows = ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"]
    rows += [f"{i}\tmain\tf\t2012\t{i}\ts\ts\ta cat sat {i}\ta dog ran {i}\t{i % 5}.0" for i in range(40)]
    for split in ("train", "dev"):
        (tmp_path / "STS-B" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    _write_squad(tmp_path / "squad")
    data_dirs = {"glue_mrpc": tmp_path / "MRPC", "glue_stsb": tmp_path / "STS-B", "squad_v1": tmp_path / "squad"}
    data_dir = [f"task.data_dir={data_dirs[preset]}"] if preset in data_dirs else []
    config, task = _task(
        preset, minilm_dir, *overrides, *data_dir, model=[] if preset.startswith("tiny") else TINY_BERT
    )
    tokenizer = wordpiece_tokenizer(minilm_dir / "vocab.txt", **tokenizer_settings(config))
    train, evaluation, _ = task.data(tokenizer)
    _assert_static_int32(train, f"{preset} train")
    _assert_static_int32(evaluation, f"{preset} eval")
