"""The Beam pipeline of `concise_attention.export.beam`, end to end on the DirectRunner, against the export it runs.

    python -m venv beam-env && beam-env/bin/pip install -e . apache-beam==2.77.0
    beam-env/bin/python benchmarks/beam_check.py --export EXPORT --preset PRESET [--out results/beam_check.json]

Apache Beam lives in an environment of its own (its protobuf and pillow pins are not ours). EXPORT is a
`concise-export` of PRESET. The texts are the 3,080 Banking77 test queries shipped with the package (embedded only),
written as text lines, JSON lines, Parquet and TFRecord (tf.train.Example); the pipeline embeds each into 2 Parquet shards, and every row is
compared with the export's TF Serving model called directly (`training.inference.encoders.Served`) and with
`SentenceEncoder.from_preset(PRESET).encode`: the shard names must be the fixed ones, the ids the texts' SHA-256, one
row per distinct text (or the records' ids, one row each), every embedding theirs (cosine). Each is timed once on
this machine (sentences/s: the pipeline's overhead, not a benchmark of Dataflow). Then each refusal (a malformed
JSON line, a Parquet row without an id, a TFRecord Example without a text or without a CRC32C module, a taken output prefix, --batch-size 0, an input matching nothing, an
unknown option, a remote runner with local paths) must exit 2 with one line and leave nothing written.
"""

import argparse
import contextlib
import glob
import hashlib
import importlib.util
import io
import json
import pathlib
import sys
import tempfile
import time

import numpy as np
import pyarrow.parquet
import tensorflow as tf

from concise_attention import SentenceEncoder
from concise_attention.export import beam
from concise_attention.training.inference import encoders
from concise_attention.training.inference import mteb_protocol


def write_input(texts, path, form, ids=None):
    """`texts` as an input file of `form` (text lines, or JSON lines, Parquet or TFRecord with ids q0, q1, ...)."""
    ids = ids or [f"q{index}" for index in range(len(texts))]
    if form == "parquet":
        pyarrow.parquet.write_table(pyarrow.table({"id": ids, "text": texts}), path)
    elif form == "tfrecord":
        with tf.io.TFRecordWriter(str(path)) as writer:
            for key, text in zip(ids, texts):
                features = {name: value.encode("utf-8") for name, value in (("id", key), ("text", text)) if value}
                feature = {
                    name: tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
                    for name, value in features.items()
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    else:
        lines = [json.dumps({"id": i, "text": t}) for i, t in zip(ids, texts)] if form == "jsonl" else texts
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def run(export, texts, workdir, form):
    """{id: embedding} the pipeline wrote for `texts` given in `form`, and its seconds."""
    path = workdir / f"texts.{form}"
    write_input(texts, path, form)
    output = workdir / f"out_{form}" / "part"
    start = time.perf_counter()
    arguments = ["--model", str(export), "--input", str(path), "--output", str(output), "--format", form]
    assert beam.main([*arguments, "--num-shards", "2"]) == 0
    seconds = time.perf_counter() - start
    names = sorted(glob.glob(f"{output}-*.parquet"))
    assert [pathlib.Path(name).name for name in names] == ["part-00000-of-00002.parquet", "part-00001-of-00002.parquet"]
    table = pyarrow.concat_tables([pyarrow.parquet.read_table(name) for name in names])
    ids, vectors = table.column("id").to_pylist(), table.column("embedding").to_pylist()
    expected = len(set(texts)) if form == "text" else len(texts)  # plain lines: one row per distinct text
    assert len(ids) == len(set(ids)) == expected, (len(ids), len(set(ids)), expected)
    return dict(zip(ids, np.asarray(vectors, np.float32))), seconds


def refusals(export, workdir):
    """{case: the one stderr line} of each input refused with exit 2; nothing may be left under `workdir`/refused."""
    good = workdir / "good.txt"
    good.write_text("A man is playing a guitar.\n", encoding="utf-8")
    bad = workdir / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "fine"}\nnot json\n', encoding="utf-8")
    null_id = workdir / "null_id.parquet"
    pyarrow.parquet.write_table(pyarrow.table({"id": ["a", None], "text": ["fine", "no id"]}), null_id)
    no_text = workdir / "no_text.tfrecord"
    write_input(["fine", ""], no_text, "tfrecord", ids=["a", "b"])  # the second Example has no text feature
    taken = workdir / "taken"
    taken.mkdir()
    (taken / "part-00000-of-00002.parquet").write_bytes(b"")
    refused = workdir / "refused" / "part"
    cases = {
        "malformed JSON line": ["--input", str(bad), "--format", "jsonl", "--output", str(refused)],
        "Parquet row without an id": ["--input", str(null_id), "--format", "parquet", "--output", str(refused)],
        "TFRecord Example without a text": ["--input", str(no_text), "--format", "tfrecord", "--output", str(refused)],
        "output prefix taken (1 of 2 shards)": ["--input", str(good), "--output", str(taken / "part")],
        "batch size 0": ["--input", str(good), "--output", str(refused), "--batch-size", "0"],
        "input matches nothing": ["--input", str(workdir / "none-*.txt"), "--output", str(refused)],
        "unknown option": ["--input", str(good), "--output", str(refused), "--jsonlines"],
        "remote runner, local paths": ["--input", str(good), "--output", str(refused), "--runner", "DataflowRunner"],
    }
    cases["TFRecord without a CRC32C module"] = [
        "--input",
        str(no_text),
        "--format",
        "tfrecord",
        "--output",
        str(refused),
    ]
    lines = {}
    for case, arguments in cases.items():
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), refused_with() as code, without_crc(case.endswith("CRC32C module")):
            beam.main(["--model", str(export), *arguments])
        error = [line for line in stderr.getvalue().splitlines() if line.startswith("concise_attention.export.beam")]
        assert code == [2] and len(error) == 1, (case, code, stderr.getvalue()[-2000:])
        assert not (workdir / "refused").exists(), case
        lines[case] = error[0]
    return lines


@contextlib.contextmanager
def without_crc(hidden):
    """While `hidden`, the modules Beam's TFRecord reader needs look uninstalled."""
    found = importlib.util.find_spec
    if hidden:
        importlib.util.find_spec = lambda name, *rest: None if name in beam.TFRECORD_CRC else found(name, *rest)
    try:
        yield
    finally:
        importlib.util.find_spec = found


@contextlib.contextmanager
def refused_with():
    """Catches the SystemExit a refused command raises; yields a list that then holds its code."""
    code = []
    try:
        yield code
    except SystemExit as exit_info:
        code.append(exit_info.code)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export", required=True, help="a concise-export folder")
    parser.add_argument("--preset", required=True, help="what it was exported from, for encode()")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import provenance

    # one text per line: a query's own line breaks become spaces
    texts = [" ".join(row["text"].split()) for row in mteb_protocol.read_split("Banking77Classification", "test")]
    result = {**provenance.header(__file__, argv), "texts": len(texts)}
    served, start = encoders.Served(args.export), time.perf_counter()
    direct = served.encode(texts)
    result["served_directly_sentences_per_second"] = len(texts) / (time.perf_counter() - start)
    keras, start = SentenceEncoder.from_preset(args.preset), time.perf_counter()
    encoded = keras.encode(texts)
    result["encode_sentences_per_second"] = len(texts) / (time.perf_counter() - start)
    result["encode_cosine_min_to_served"] = float(np.min(np.sum(encoded * direct, axis=1)))
    with tempfile.TemporaryDirectory() as workdir:
        for form in beam.FORMATS:
            rows, seconds = run(args.export, texts, pathlib.Path(workdir), form)
            ids = (
                [f"q{index}" for index in range(len(texts))]
                if form != "text"
                else [hashlib.sha256(text.encode("utf-8")).hexdigest() for text in texts]
            )
            result[form] = {
                "cosine_min_to_served": min(float(np.dot(rows[key], vector)) for key, vector in zip(ids, direct)),
                "cosine_min_to_encode": min(float(np.dot(rows[key], vector)) for key, vector in zip(ids, encoded)),
                "sentences_per_second": len(texts) / seconds,
            }
        result["refused"] = refusals(args.export, pathlib.Path(workdir))
    print(json.dumps(result, indent=1))
    if args.out:
        provenance.write(args.out, result)


if __name__ == "__main__":
    main()
