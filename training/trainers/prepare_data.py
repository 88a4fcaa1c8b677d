"""`concise-prepare-data`: tokenise and pack a language-model corpus once, into `.npy` shards; or, for a
`distill` config, compute the teacher's outputs of the run's texts once, beside a manifest.

    concise-prepare-data --config lm1b_fixed_d256_p32_h16 --out gs://BUCKET/lm1b_prepared \
        --set task.data_dir=gs://BUCKET/tensorflow_datasets
    concise-train --config lm1b_fixed_d256_p32_h16 --run-dir RUN --set task.dataset=prepared \
        --set task.data_dir=gs://BUCKET/lm1b_prepared --set tokenizer.vocabulary=gs://BUCKET/lm1b_prepared/vocab.txt

Reads the config's task corpus (`task.dataset`: sample, lm1b, text_files), takes the
vocabulary as the trainer would (tokenizer.vocabulary, task.init's, else WordPiece trained
on the corpus) and writes the rows the trainer's text pipeline would pack, in the format
of `training.data.shards`, through tf.io.gfile (local or gs://): each shard whole under a
temporary name then renamed, the manifest last. The same corpus and vocabulary give
byte-identical files.

    concise-prepare-data --config distill_minilm_d192_fixed --out gs://BUCKET/distill_prepared
    concise-train --config distill_minilm_d192_fixed --run-dir RUN --set task.cache_dir=gs://BUCKET/distill_prepared

A distill config's folder holds the teacher's unit embeddings of the training and held-out texts the run
draws, one .npy per split named by the fingerprint of what they depend on (the teacher's weights and
vocabulary, the tokenizer settings, the sequence length and the texts) with its SHA-256 beside it, and the
manifest last; the run reads them (hash-checked) instead of running the teacher.
"""

import argparse
import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile

import numpy as np
import tensorflow as tf
from tqdm import tqdm

from concise_attention.training import files
from concise_attention.training.trainers.trainer import prepare_vocabulary
from concise_attention.training.trainers.trainer import resolve_config
from concise_attention.training.data import shards
from concise_attention.training.data.pipeline import EVAL_WORD_LINES
from concise_attention.training.data.pipeline import tokens_per_word
from concise_attention.training.preprocessing.text import read_vocabulary
from concise_attention.training.preprocessing.tokenizer import tokenizer_settings
from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer
from concise_attention.training.run import configs
from concise_attention.training.run import runs
from concise_attention.training.tasks import distill
from concise_attention.training.tasks import make_task

DEFAULT_ROWS_PER_SHARD = 8192
# Bucket files of the two-pass shuffle of the training rows (memory: the rows / SHUFFLE_BUCKETS).
SHUFFLE_BUCKETS = 64
# The shuffle's local folder: WORK_PREFIX + the owner's process id + a random tail, in the temporary folder.
WORK_PREFIX = "concise-prepare-data-"


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def work_directory(root=None):
    """A fresh local folder for the shuffle, removed when the block ends. A process killed outright
    (SIGKILL, power loss) cannot remove its own: such folders, whose owner process has ended, are
    removed here first, so at most the folders of running processes are ever left."""
    root = root or tempfile.gettempdir()
    for name in os.listdir(root):
        owner = name[len(WORK_PREFIX) :].split("-", 1)[0]
        if name.startswith(WORK_PREFIX) and owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=f"{WORK_PREFIX}{os.getpid()}-", dir=root)


def _row_arrays(chunks, fields, counts):
    """(rows, fields, T) int32 arrays of the chunks (dicts of (rows, T) arrays); counts tokens."""
    for chunk in chunks:
        counts["tokens"] += int(np.count_nonzero(chunk["segment_ids"] if "positions" in fields else chunk["token_ids"]))
        yield np.stack([chunk[name] for name in fields], axis=1).astype(np.int32)


def _shuffled(arrays, seed, buckets=SHUFFLE_BUCKETS):
    """The rows of `arrays` in a uniformly random order seeded by `seed`, holding one bucket in
    memory at a time: each row goes to a random bucket file (local temporary folder), then each
    bucket is permuted."""
    rng = np.random.default_rng([seed, buckets])
    with work_directory() as work:
        paths = [os.path.join(work, f"{bucket}.bin") for bucket in range(buckets)]
        shape = None
        with contextlib.ExitStack() as stack:
            files = [stack.enter_context(open(path, "wb")) for path in paths]
            for rows in arrays:
                shape = rows.shape[1:]
                assignment = rng.integers(buckets, size=len(rows))
                for bucket in np.unique(assignment):
                    files[bucket].write(rows[assignment == bucket].tobytes())
        for bucket, path in enumerate(paths if shape else []):
            rows = np.fromfile(path, np.int32).reshape(-1, *shape)
            yield rows[np.random.default_rng([seed, buckets, bucket]).permutation(len(rows))]


def _write_shards(out_dir, split, arrays, rows_per_shard):
    """Writes the rows of `arrays` as shards of `rows_per_shard` rows; returns their list."""
    pending, written = [], []

    def flush(rows):
        files.write_bytes_atomically(
            files.join(out_dir, shards.shard_name(split, len(written))), shards.shard_bytes(rows)
        )
        written.append({"file": shards.shard_name(split, len(written)), "rows": len(rows)})

    for rows in arrays:
        pending.append(rows)
        while sum(len(part) for part in pending) >= rows_per_shard:
            stacked = np.concatenate(pending)
            flush(stacked[:rows_per_shard])
            pending = [stacked[rows_per_shard:]]
    remainder = np.concatenate(pending) if pending else []
    if len(remainder):
        flush(remainder)
    return written


def _counted(lines, counts, progress, split):
    for line in tqdm(lines, desc=f"{split} lines", unit=" lines", disable=not progress, mininterval=2.0):
        counts["lines"] += 1
        yield line


def prepare(config, out_dir, rows_per_shard=DEFAULT_ROWS_PER_SHARD, shuffle_seed=0, progress=True):
    """Writes the prepared shards of `config`'s language-model task to `out_dir` (a distill config's
    teacher outputs: `prepare_teacher_outputs`).

    The training rows are stored in a random order seeded by `shuffle_seed` (a two-pass
    shuffle through local temporary files as large as the corpus's rows).

    Returns:
        The manifest (a dict).
    """
    config, source = resolve_config(config)
    if config.task.name == "distill":
        return prepare_teacher_outputs(config, out_dir)
    if config.task.name not in shards.FIELDS or config.task.dataset == "prepared":
        raise ValueError(
            f"concise-prepare-data reads the text corpus of a causal_lm, masked_lm or distill task. Received: "
            f"task.name={config.task.name!r}, task.dataset={config.task.dataset!r}"
        )
    if isinstance(rows_per_shard, bool) or not isinstance(rows_per_shard, int) or rows_per_shard < 1:
        raise ValueError(f"--rows-per-shard must be a positive integer. Received: {rows_per_shard!r}")
    out = _unprepared(out_dir)
    task = make_task(config)
    task.check()
    task.read()
    tf.io.gfile.makedirs(out.path)
    vocabulary = prepare_vocabulary(config, out, task, source)
    settings = tokenizer_settings(config)
    tokenizer = wordpiece_tokenizer(vocabulary, **settings)
    fields = shards.FIELDS[config.task.name]
    splits = {}
    for split, lines in (("train", task.train_lines), ("eval", task.eval_lines)):
        counts = {"lines": 0, "tokens": 0}
        arrays = _row_arrays(task.row_chunks(_counted(lines(), counts, progress, split), tokenizer), fields, counts)
        # Training rows are stored in a seeded random order, so that a shard (and a batch) is a
        # sample of the whole corpus; held-out rows keep the corpus order.
        written = _write_shards(
            out.path, split, _shuffled(arrays, shuffle_seed) if split == "train" else arrays, rows_per_shard
        )
        splits[split] = {"shards": written, "rows": sum(shard["rows"] for shard in written), **counts}
    ratio = tokens_per_word([line for _, line in zip(range(EVAL_WORD_LINES), task.eval_lines())], tokenizer)
    tokens = read_vocabulary(vocabulary)
    manifest = {
        "format": shards.FORMAT,
        "task": config.task.name,
        "fields": list(fields),
        "sequence_length": config.training.sequence_length,
        "rows_per_shard": rows_per_shard,
        "shuffle_seed": shuffle_seed,
        "vocabulary_sha256": shards.vocabulary_sha256(tokens),
        "vocabulary_size": len(tokens),
        "tokenizer": settings,
        "source": {"dataset": config.task.dataset, "data_dir": config.task.data_dir},
        "splits": splits,
        "tokens_per_word": ratio,
    }
    files.write_bytes_atomically(out.file(shards.MANIFEST), shards.manifest_bytes(manifest))
    return manifest


def _unprepared(out_dir):
    """The output folder, checked writable and not yet prepared."""
    out = runs.RunDirectory(out_dir)
    out.check_writable()
    if tf.io.gfile.exists(out.file(shards.MANIFEST)):
        raise ValueError(f"{out.file(shards.MANIFEST)} exists: the folder is already prepared; choose another --out.")
    return out


def prepare_teacher_outputs(config, out_dir):
    """Writes the teacher's outputs of a distill config's training and held-out texts to `out_dir`, then
    its manifest (format, teacher and its weights' SHA-256, tokenizer, texts and file of each split).

    Returns:
        The manifest (a dict).
    """
    out = _unprepared(out_dir)
    task = make_task(dataclasses.replace(config, task=dataclasses.replace(config.task, cache_dir=out.path)))
    task.check()
    task.read()
    splits = {}
    for split, texts in (("train", task.train_texts), ("eval", task.eval_texts)):
        vectors = distill.teacher_outputs(task, task.tokenizer, texts)
        splits[split] = {
            "texts": len(texts),
            "width": int(vectors.shape[1]),
            "file": distill.cache_fingerprint(task, task.tokenizer, texts) + ".npy",
        }
    manifest = {
        "format": distill.TEACHER_OUTPUTS_FORMAT,
        "task": "distill",
        "teacher": config.task.teacher or distill.DEFAULT_TEACHER_PACKAGE,
        "teacher_sha256": task.teacher_digest,
        "sequence_length": config.training.sequence_length,
        "tokenizer": tokenizer_settings(config),
        "splits": splits,
        "source": {"dataset": config.task.dataset, "data_dir": config.task.data_dir},
    }
    files.write_bytes_atomically(out.file(shards.MANIFEST), shards.manifest_bytes(manifest))
    return manifest


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="concise-prepare-data",
        description="Tokenise and pack a config's language-model corpus once into .npy shards, or compute a distill "
        "config's teacher outputs once (local or gs://).",
        epilog="Then train with --set task.dataset=prepared --set task.data_dir=OUT --set tokenizer.vocabulary=OUT/vocab.txt "
        "(a distill config: --set task.cache_dir=OUT)",
    )
    configs.add_config_arguments(parser)
    parser.add_argument("--out", required=True, help="output folder (local or gs://): manifest.json, vocab.txt, shards")
    parser.add_argument("--rows-per-shard", type=int, default=DEFAULT_ROWS_PER_SHARD, help="rows in each shard file")
    parser.add_argument("--shuffle-seed", type=int, default=0, help="seed of the stored order of the training rows")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    with configs.one_line_errors(parser, "concise-prepare-data"):
        config = configs.load_config(args.config, args.set)
        manifest = prepare(config, args.out, args.rows_per_shard, args.shuffle_seed, progress=not args.quiet)
    counts = {
        split: {key: value for key, value in values.items() if key not in ("shards", "file")}
        for split, values in manifest["splits"].items()
    }
    print(f"{args.out}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
