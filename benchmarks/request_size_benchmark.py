"""Peak memory and cost per string of one served request, by the number of strings in it.

    python benchmarks/request_size_benchmark.py [--strings 100000] [--export DIR]

Exports all-MiniLM-L6-v2 (`concise-export --hf-dir`, sequence length 128) unless `--export` names an
export, then serves, each in a fresh process (so that ru_maxrss is that request's peak): 32 ordinary
sentences of the shipped corpus, and `--strings` copies of "hello world" (the hostile audit's request:
1.3 MB of text). Reports the peak RSS of each process after the request, the rise over the same process
after loading the model, and the seconds per string; the reliability target is a 100,000-string request
within 3x the 32-sentence request's peak memory and 3x its cost per string.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import provenance  # noqa: E402  (benchmarks/, beside this script)

RESULTS = pathlib.Path(__file__).parent / "results"

REQUEST = r"""
import json, resource, sys, time
import tensorflow as tf
serving_dir, texts_path = sys.argv[1], sys.argv[2]
texts = json.load(open(texts_path))
serve = tf.saved_model.load(serving_dir).signatures["serving_default"]
serve(text=tf.constant(["warm up"]))
loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
rows = serve(text=tf.constant(texts))["embedding"].shape[0]
seconds = time.perf_counter() - start
assert rows == len(texts)
print(json.dumps({"strings": len(texts), "seconds": seconds, "loaded_kb": loaded,
                  "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def serve_in_fresh_process(serving_dir, texts):
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "texts.json")
        with open(path, "w", encoding="utf-8") as file:
            json.dump(texts, file)
        result = subprocess.run(
            [sys.executable, "-c", REQUEST, str(serving_dir), path], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise SystemExit(f"the request failed: {result.stderr.strip().splitlines()[-1:]}")
        return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strings", type=int, default=100_000)
    parser.add_argument(
        "--export", help="an export folder (its serving/1 is served); default: all-MiniLM-L6-v2 exported here"
    )
    parser.add_argument("--out", default=str(RESULTS / "request_size_benchmark.json"))
    args = parser.parse_args(argv)
    from concise_attention.training.data.packing import read_lines

    sentences = [line.split(". ")[0].strip() + "." for line in read_lines() if len(line.split()) >= 12][:32]
    with tempfile.TemporaryDirectory() as workdir:
        export = args.export
        if export is None:
            from concise_attention.export.savedmodels import export_run
            from concise_attention.training.tasks.distill import default_teacher

            export = str(
                pathlib.Path(
                    export_run(default_teacher(), os.path.join(workdir, "minilm"), seq_length=128)["serving"]
                ).parents[1]
            )
        serving = pathlib.Path(export) / "serving" / "1"
        small = serve_in_fresh_process(serving, sentences)
        large = serve_in_fresh_process(serving, ["hello world"] * args.strings)
    result = {
        **provenance.header(__file__, argv),
        "small": small,
        "large": large,
        "peak_ratio": large["peak_kb"] / small["peak_kb"],
        "cost_per_string_ratio": (large["seconds"] / large["strings"]) / (small["seconds"] / small["strings"]),
    }
    provenance.write(args.out, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
