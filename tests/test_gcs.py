"""A whole run on gs://, through TensorFlow's own GCS client: train, SIGKILL, resume, finish,
export, serve, against a local Google Cloud Storage (`tests/gcs_fake.py`: gcp-storage-emulator
behind a TLS proxy for www.googleapis.com and storage.googleapis.com).

The killed process and the runs after it work in an empty directory, which must stay empty: nothing
of the run or the export goes through the local filesystem API (temporary files in the system's temp directory
are allowed: Keras' HDF5 weights and the exporter's staging folder are written there first).
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from concise_attention.training.run import runs
from concise_attention.training.run import configs
from gcs_fake import FakeGCS
from in_process import run_main

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN, EXPORT = "gs://bucket/run", "gs://bucket/export"
# Dropout on; 12 steps in 3 epochs: a checkpoint every 4 steps.
OVERRIDES = [
    "model.dropout=0.1",
    "model.attention_dropout=0.1",
    "training.train_steps=12",
    "training.steps_per_epoch=4",
    "training.steps_per_execution=2",
    "training.warmup_steps=2",
    "training.eval_batches=1",
]
TEXTS = ["The cat sat on the mat.", "A second, longer sentence about the weather in the mountains today.", "Hello!"]


def _train_command(run_dir):
    """The run trains its own WordPiece vocabulary into RUN/vocab.txt (a restart reuses it)."""
    command = [
        sys.executable,
        "-m",
        "concise_attention.cli.train",
        "--config",
        "tiny_bert_fixed",
        "--run-dir",
        run_dir,
        "--quiet",
    ]
    for override in OVERRIDES:
        command += ["--set", override]
    return command


def _checkpoint_landed():
    """The CheckpointManager's pointer file names a checkpoint (it is written after the checkpoint's files)."""
    return tf.train.latest_checkpoint(f"{RUN}/checkpoint") is not None


def _weights(run):
    """The task model's weights as `training.artifacts` loads them (through tf.io.gfile: local or gs://)."""
    return [np.asarray(variable) for variable in runs.load(run).task_model.weights]


def _reference_embeddings(run, texts):
    """The local run's encoder on Hugging Face `tokenizers`' WordPiece ids, mean over the tokens."""
    import tokenizers

    loaded = runs.load(run)
    pretrainer, vocabulary = loaded.task_model, loaded.source.vocabulary
    encodings = tokenizers.BertWordPieceTokenizer(str(vocabulary), lowercase=True).encode_batch(texts)
    length = max(len(encoding.ids) for encoding in encodings)
    ids = np.array([encoding.ids + [0] * (length - len(encoding.ids)) for encoding in encodings], "int32")
    mask = (ids != 0).astype("int32")
    sequence = np.asarray(
        pretrainer.encoder(
            {"input_word_ids": ids, "input_mask": mask, "input_type_ids": np.zeros_like(ids)}, training=False
        )["sequence_output"]
    )
    return (sequence * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)


def _kill_after_the_first_checkpoint(command, cwd, env):
    """Starts the run, SIGKILLs it as soon as its first checkpoint is on gs://; what was there then."""
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not _checkpoint_landed() and process.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    running = process.poll() is None
    process.send_signal(signal.SIGKILL)  # no chance to clean up
    process.wait()
    return {
        "running": running,
        "checkpoint": _checkpoint_landed(),
        "finished": tf.io.gfile.exists(f"{RUN}/model.weights.h5"),
    }


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """The fake GCS, with this process pointed at it too (it reads and polls the store)."""
    with FakeGCS(tmp_path_factory.mktemp("fake")) as fake, pytest.MonkeyPatch.context() as patch:
        for name, value in fake.env.items():
            patch.setenv(name, value)
        yield fake


def _gfile_operations(base):
    """What tf.io.gfile's operations give under `base` (a folder), as plain values."""
    gfile, seen = tf.io.gfile, []
    gfile.makedirs(f"{base}/a/b")
    for name, data in (("a/b/x.bin", bytes(range(256)) * 4096), ("a/empty", b""), ("a/t.txt", b"one\ntwo\n")):
        with gfile.GFile(f"{base}/{name}", "wb") as file:
            file.write(data)
    with gfile.GFile(f"{base}/a/t.txt", "a") as file:
        file.write("three\n")
    with gfile.GFile(f"{base}/a/b/x.bin", "rb") as file:
        file.seek(1000)
        seen += [file.read(10).hex(), file.tell()]
    seen.append(
        [
            (gfile.exists(f"{base}/{name}"), gfile.isdir(f"{base}/{name}"))
            for name in ("a", "a/b", "a/b/x.bin", "a/empty", "a/no")
        ]
    )
    seen.append(
        [
            sorted(name.rstrip("/") for name in gfile.listdir(f"{base}/a")),
            sorted(path[len(base) :] for path in gfile.glob(f"{base}/a/*")),
        ]
    )
    seen.append([gfile.stat(f"{base}/{name}").length for name in ("a/b/x.bin", "a/empty", "a/t.txt")])
    gfile.copy(f"{base}/a/t.txt", f"{base}/a/b/t2.txt")
    gfile.rename(f"{base}/a/b/t2.txt", f"{base}/a/empty", overwrite=True)
    with pytest.raises(tf.errors.AlreadyExistsError):
        gfile.rename(f"{base}/a/t.txt", f"{base}/a/empty", overwrite=False)
    with gfile.GFile(f"{base}/a/empty") as file:
        seen.append(file.readlines())
    seen.append(
        sorted(
            (top[len(base) :].rstrip("/"), sorted(d.rstrip("/") for d in dirs), sorted(files))
            for top, dirs, files in gfile.walk(base)
        )
    )
    gfile.rmtree(f"{base}/a/b")
    seen.append([gfile.exists(f"{base}/a/b/x.bin"), sorted(name.rstrip("/") for name in gfile.listdir(f"{base}/a"))])
    return seen


def test_gfile_on_the_fake_gcs_behaves_as_on_the_local_filesystem(gcs, tmp_path):
    """The route (TF's GCS client -> proxy -> emulator) checked against the local filesystem:
    writes, appends, seeks, exists/isdir of objects and prefixes, listdir, glob, stat, copy,
    rename over a file (and its refusal without overwrite), walk, rmtree."""
    assert _gfile_operations("gs://bucket/gfile") == _gfile_operations(str(tmp_path))
    assert "storage.googleapis.com" in {request["host"] for request in gcs.requests()}


@pytest.fixture(scope="module")
def gcs_run(gcs, tmp_path_factory):
    """The run on gs://: killed (SIGKILL) in its own process after its first checkpoint, restarted
    to the end, exported and served from gs://; an uninterrupted local run of the same config beside
    it. Only the killed run needs a process of its own: the rest runs here, through the CLIs' `main`."""
    from concise_attention.cli import export
    from concise_attention.cli import train as train_cli
    from concise_attention.training.trainers.trainer import train

    root = tmp_path_factory.mktemp("gcs")
    cwd, local = root / "cwd", root / "local"
    cwd.mkdir()
    train(configs.load_config("tiny_bert_fixed", OVERRIDES), local / "run", verbose=0)
    requests = {}
    killed = _kill_after_the_first_checkpoint(_train_command(RUN), cwd, {**os.environ, "PYTHONPATH": REPOSITORY})
    requests["first"] = len(gcs.requests())
    printed = run_main(train_cli.main, _train_command(RUN)[3:], cwd, check=True).stdout
    requests["second"] = len(gcs.requests())
    exported = run_main(export.main, ["--run", RUN, "--out", EXPORT], cwd, check=True).stdout
    serving = tf.saved_model.load(f"{EXPORT}/serving/1")  # straight from gs://
    served = serving.signatures["serving_default"](text=tf.constant(TEXTS))["embedding"].numpy()

    weights = {"gs": _weights(RUN), "local": _weights(local / "run")}
    with tf.io.gfile.GFile(f"{RUN}/metrics.json") as file:
        metrics = {"gs": json.loads(file.read())}
    metrics.update(
        {
            "local": json.loads((local / "run" / "metrics.json").read_text()),
            "printed": json.loads(printed[printed.index("{") :]),
        }
    )
    listing = {
        "run": sorted(tf.io.gfile.listdir(RUN)),
        "export": sorted(tf.io.gfile.listdir(EXPORT)),
        "written": json.loads(exported),
    }
    log = gcs.requests()
    return {
        "root": root,
        "cwd": cwd,
        "local": local / "run",
        "killed": killed,
        "weights": weights,
        "metrics": metrics,
        "listing": listing,
        "served": served,
        "log": log,
        "requests": requests,
    }


@pytest.mark.slow
def test_run_killed_on_gcs_resumes_to_the_uninterrupted_local_result_bit_for_bit(gcs_run):
    assert gcs_run["killed"] == {"running": True, "checkpoint": True, "finished": False}
    gs, local = gcs_run["weights"]["gs"], gcs_run["weights"]["local"]
    assert len(gs) == len(local) > 0
    for index, (ours, reference) in enumerate(zip(gs, local)):
        np.testing.assert_array_equal(ours, reference, err_msg=str(index))
    assert gcs_run["metrics"]["gs"] == gcs_run["metrics"]["local"] == gcs_run["metrics"]["printed"]
    assert gcs_run["metrics"]["gs"]["step"] == 12
    # The restarted run read its checkpoint back from gs:// (an object read, not a local copy).
    restarted = gcs_run["log"][gcs_run["requests"]["first"] : gcs_run["requests"]["second"]]
    assert any(
        r["host"] == "storage.googleapis.com" and r["path"].startswith("/bucket/run%2Fcheckpoint%2F") for r in restarted
    )
    # ... and reused the vocabulary the killed one had trained into gs://bucket/run/vocab.txt (its fingerprint matched).
    assert not any("name=run%2Fvocab.txt" in r["path"] for r in restarted)
    assert any(r["path"] == "/bucket/run%2Fvocab.txt.sha256" for r in restarted)


@pytest.mark.slow
def test_export_to_gcs_commits_a_version_that_serves_the_trained_model(gcs_run):
    listing = gcs_run["listing"]
    assert listing["export"] == ["hub/", "serving/"]  # committed: no staging folder or journal left
    assert listing["written"]["serving"] == f"{EXPORT}/serving/1"
    assert {
        "config.json",
        "vocab.txt",
        "backbone.weights.h5",
        "model.weights.h5",
        "metrics.json",
        "checkpoint/",
        "logs/",
    } <= set(listing["run"])
    np.testing.assert_allclose(gcs_run["served"], _reference_embeddings(gcs_run["local"], TEXTS), atol=1e-5)


@pytest.mark.slow
def test_nothing_reached_the_local_filesystem_and_every_request_succeeded(gcs_run):
    assert os.listdir(gcs_run["cwd"]) == []
    log = gcs_run["log"]
    # 404 is how GCS answers "does it exist?"; 308 a resumable upload not finished; "aborted" a request the
    # killed process did not finish sending. Anything else would be an emulator gap the clients retried around.
    expected = (200, 204, 206, 308, 404, "aborted")
    assert all(r["status"] in expected for r in log), [r for r in log if r["status"] not in expected]
    uploads = [r for r in log if r["method"] == "PUT" and "uploadType=resumable" in r["path"]]
    assert uploads and all(r["content_range"] for r in uploads if r["sent"])  # resumable sessions with Content-Range
    assert any("/rewriteTo/" in r["path"] for r in log) and any(r["method"] == "DELETE" for r in log)  # gfile.rename
    assert any(r["range"] for r in log if r["host"] == "storage.googleapis.com")  # ranged object reads
    assert any("delimiter=%2F" in r["path"] for r in log)  # listdir
