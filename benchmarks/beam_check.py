"""The Beam pipeline of `concise_attention.export.beam`, end to end on the DirectRunner, against the export it runs.

    python -m venv beam-env && beam-env/bin/pip install -e . apache-beam==2.77.0
    beam-env/bin/python benchmarks/beam_check.py --export EXPORT [--out results/beam_check.json]

Apache Beam lives in an environment of its own (its protobuf and pillow pins are not ours). The texts are the 3,080
Banking77 test queries shipped with the package (embedded only), written as text lines and as JSON lines; the
pipeline embeds each file into Parquet, and every row is compared with the export's TF Serving model called
directly (`training.inference.encoders.Served`): the ids must be the texts' SHA-256, one row per distinct text
(or the JSON ids, one row per line), and every embedding the served one (cosine). Times both (sentences/s, one
run each on this machine: the pipeline's overhead, not a benchmark of Dataflow). Then each refusal (a malformed JSON
line, a taken output prefix, --batch-size 0, an input matching nothing, an unknown option, a remote runner with
local paths) must exit 2 with one line and leave nothing written.
"""

import argparse
import contextlib
import glob
import hashlib
import io
import json
import pathlib
import sys
import tempfile
import time

import numpy as np
import pyarrow.parquet

from concise_attention.export import beam
from concise_attention.training.inference import encoders
from concise_attention.training.inference import mteb_protocol


def run(export, texts, workdir, jsonl):
    """{id: embedding} the pipeline wrote for `texts`, and its seconds."""
    path = workdir / ("texts.jsonl" if jsonl else "texts.txt")
    lines = [json.dumps({"id": f"q{index}", "text": text}) if jsonl else text for index, text in enumerate(texts)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    output = workdir / ("out_jsonl" if jsonl else "out_text") / "part"
    start = time.perf_counter()
    arguments = ["--model", str(export), "--input", str(path), "--output", str(output)] + ["--jsonl"] * jsonl
    assert beam.main(arguments) == 0
    seconds = time.perf_counter() - start
    table = pyarrow.concat_tables([pyarrow.parquet.read_table(name) for name in glob.glob(f"{output}-*.parquet")])
    ids, vectors = table.column("id").to_pylist(), table.column("embedding").to_pylist()
    expected = len(texts) if jsonl else len(set(texts))  # plain lines: one row per distinct text
    assert len(ids) == len(set(ids)) == expected, (len(ids), len(set(ids)), expected)
    return dict(zip(ids, np.asarray(vectors, np.float32))), seconds


def refusals(export, workdir):
    """{case: the one stderr line} of each input refused with exit 2; nothing may be left under `workdir`/refused."""
    good = workdir / "good.txt"
    good.write_text("A man is playing a guitar.\n", encoding="utf-8")
    bad = workdir / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "fine"}\nnot json\n', encoding="utf-8")
    taken = workdir / "taken"
    taken.mkdir()
    (taken / "part-00000-of-00001.parquet").write_bytes(b"")
    refused = workdir / "refused" / "part"
    cases = {
        "malformed JSON line": ["--input", str(bad), "--jsonl", "--output", str(refused)],
        "output prefix taken": ["--input", str(good), "--output", str(taken / "part")],
        "batch size 0": ["--input", str(good), "--output", str(refused), "--batch-size", "0"],
        "input matches nothing": ["--input", str(workdir / "none-*.txt"), "--output", str(refused)],
        "unknown option": ["--input", str(good), "--output", str(refused), "--jsonlines"],
        "remote runner, local paths": ["--input", str(good), "--output", str(refused), "--runner", "DataflowRunner"],
    }
    lines = {}
    for case, arguments in cases.items():
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), refused_with() as code:
            beam.main(["--model", str(export), *arguments])
        error = [line for line in stderr.getvalue().splitlines() if line.startswith("concise_attention.export.beam")]
        assert code == [2] and len(error) == 1, (case, code, stderr.getvalue()[-2000:])
        assert not (workdir / "refused").exists(), case
        lines[case] = error[0]
    return lines


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
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import provenance

    # one text per line: a query's own line breaks become spaces
    texts = [" ".join(row["text"].split()) for row in mteb_protocol.read_split("Banking77Classification", "test")]
    served = encoders.Served(args.export)
    start = time.perf_counter()
    direct = served.encode(texts)
    direct_seconds = time.perf_counter() - start
    result = {
        **provenance.record(),
        "command": provenance.command_line("benchmarks/beam_check.py", argv or sys.argv[1:]),
    }
    result |= {"texts": len(texts), "direct_sentences_per_second": len(texts) / direct_seconds}
    with tempfile.TemporaryDirectory() as workdir:
        for jsonl in (False, True):
            rows, seconds = run(args.export, texts, pathlib.Path(workdir), jsonl)
            keys = (
                [f"q{index}" for index in range(len(texts))]
                if jsonl
                else [hashlib.sha256(text.encode("utf-8")).hexdigest() for text in texts]
            )
            cosine = min(float(np.dot(rows[key], vector)) for key, vector in zip(keys, direct))
            result["jsonl" if jsonl else "text_lines"] = {
                "cosine_min": cosine,
                "sentences_per_second": len(texts) / seconds,
            }
        result["refused"] = refusals(args.export, pathlib.Path(workdir))
    print(json.dumps(result, indent=1))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
