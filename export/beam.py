"""`python -m concise_attention.export.beam`: embed a corpus with an export's TF Serving model on Apache Beam.

    python -m concise_attention.export.beam --model EXPORT --input 'texts/*.txt' --output embeddings/part
    python -m concise_attention.export.beam --model gs://b/export --input 'gs://b/docs/*.jsonl' --jsonl \\
        --output gs://b/embeddings/part --runner DataflowRunner --project P --region R \\
        --temp_location gs://b/tmp --extra_package dist/concise_attention-0.1.0-py3-none-any.whl

Reads every file matching --input (one text per line; with --jsonl one JSON object per line with "id" and "text"),
embeds the texts with the `serving_default` signature of EXPORT's newest `serving/<version>/` (what TF Serving
serves: the same tokenizer, chunking and pooling) through Beam's RunInference, in batches of at most --batch-size
texts, and writes Parquet files OUTPUT-<shard>-of-<count>.parquet with two columns: `id` (the JSON id, or the
SHA-256 of a plain line's text: a text that recurs is embedded once) and `embedding` (float32, unit length).
Blank lines are skipped. Other arguments are Beam's pipeline options (the DirectRunner by default; Dataflow, Flink or Spark with theirs). Beam's file sink
writes to temporary files and renames them when the pipeline succeeds; a failed run leaves nothing (its temporary
files are removed), and a malformed JSON line fails it with one line naming it.

Apache Beam is not a dependency of the package (its pins of protobuf and pillow differ from ours): install it in
an environment of its own beside the package, `pip install concise-attention apache-beam`.
"""

import argparse
import hashlib
import importlib.util
import json
import logging
import os
import sys

import numpy as np
import tensorflow as tf

from concise_attention.training.inference import encoders
from concise_attention.training.run import configs


def keyed_text(line, jsonl):
    """(id, text) of one input line, or None for a blank line; a JSON line without a string "id" and "text" is a
    ValueError naming what is missing."""
    if not line.strip():
        return None
    if not jsonl:
        return hashlib.sha256(line.encode("utf-8")).hexdigest(), line
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        record = None
    if not isinstance(record, dict) or not all(isinstance(record.get(key), str) for key in ("id", "text")):
        raise ValueError(f'--jsonl: each line needs a string "id" and "text". Received: {line[:200]!r}')
    return record["id"], record["text"]


def model_handler(model, batch_size):
    """A Beam ModelHandler (keyed: (id, text) in, (id, PredictionResult) out) of the export `model`."""
    from apache_beam.ml.inference.base import KeyedModelHandler  # optional: Beam's own environment
    from apache_beam.ml.inference.base import ModelHandler
    from apache_beam.ml.inference.base import PredictionResult

    class ServedEmbeddings(ModelHandler):
        def load_model(self):
            return encoders.Served(model)

        def run_inference(self, batch, served, inference_args=None):
            return [PredictionResult(text, vector) for text, vector in zip(batch, served.encode(list(batch)))]

        def batch_elements_kwargs(self):
            return {"min_batch_size": 1, "max_batch_size": batch_size}

        def get_num_bytes(self, batch):
            return sum(len(text.encode("utf-8")) for text in batch)

    return KeyedModelHandler(ServedEmbeddings())


def build(pipeline, model, input_pattern, output, jsonl=False, batch_size=64):
    """Adds the read -> RunInference -> Parquet steps to `pipeline`."""
    import apache_beam as beam  # optional: Beam's own environment
    import pyarrow
    from apache_beam.ml.inference.base import RunInference

    schema = pyarrow.schema([("id", pyarrow.string()), ("embedding", pyarrow.list_(pyarrow.float32()))])
    texts = (
        pipeline
        | "Read" >> beam.io.ReadFromText(input_pattern)
        | "Key" >> beam.Map(keyed_text, jsonl)
        | "NotBlank" >> beam.Filter(lambda keyed: keyed is not None)
    )
    if not jsonl:
        texts = texts | "Distinct" >> beam.Distinct()  # a text's id is its hash: one row per distinct text
    return (
        texts
        | "Embed" >> RunInference(model_handler(model, batch_size))
        | "Row" >> beam.MapTuple(lambda key, result: {"id": key, "embedding": np.asarray(result.inference).tolist()})
        | "Write" >> beam.io.WriteToParquet(output, schema, file_name_suffix=".parquet")
    )


def check(model, input_pattern, output, batch_size):
    """Refuses what would fail after the pipeline started, or overwrite a result: one ValueError naming it."""
    from apache_beam.io.filesystems import FileSystems  # optional: Beam's own environment

    if encoders.serving_version(model) is None:
        raise ValueError(f"--model {model}: no serving/<version>/ SavedModel (a concise-export folder is needed)")
    if not FileSystems.match([input_pattern])[0].metadata_list:
        raise ValueError(f"--input {input_pattern}: no file matches")
    if FileSystems.match([f"{output}-*"])[0].metadata_list:
        raise ValueError(f"--output {output}: files {output}-* exist; choose another prefix or remove them")
    if batch_size < 1:
        raise ValueError(f"--batch-size must be a positive integer. Received: --batch-size={batch_size}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a concise-export folder (local or gs://)")
    parser.add_argument("--input", required=True, help="a file pattern: text lines, or JSON lines with --jsonl")
    parser.add_argument("--output", required=True, help="the prefix of the Parquet files to write")
    parser.add_argument("--jsonl", action="store_true", help='input lines are JSON objects with "id" and "text"')
    parser.add_argument("--batch-size", type=int, default=64, help="texts per inference call, at most")
    args, beam_arguments = parser.parse_known_args(argv)
    with configs.one_line_errors(parser, "concise_attention.export.beam"):
        if importlib.util.find_spec("apache_beam") is None:
            raise ValueError("apache_beam is not installed: pip install apache-beam (in an environment of its own)")
        import apache_beam as beam  # optional: Beam's own environment
        from apache_beam.options.pipeline_options import PipelineOptions

        check(args.model, args.input, args.output, args.batch_size)
        logging.getLogger("apache_beam.runners.common").setLevel(logging.CRITICAL)  # the error is raised below
        folder_existed = tf.io.gfile.exists(os.path.dirname(args.output) or ".")
        try:
            with beam.Pipeline(options=PipelineOptions(beam_arguments)) as pipeline:
                build(pipeline, args.model, args.input, args.output, args.jsonl, args.batch_size)
        except Exception as error:  # a runner wraps a worker's error in its own type: the input's is one line
            _remove_temporary(args.output, folder_existed)
            start = str(error).find("--jsonl:")
            if start < 0:
                raise
            raise ValueError(str(error)[start:].split(" [while running")[0]) from None
    return 0


def _remove_temporary(output, folder_existed):
    """Deletes what Beam's file sink left of a failed run: its beam-temp-* folders beside `output`, and the output's
    folder if the run made it and it is empty."""
    folder, name = os.path.split(output)
    for path in tf.io.gfile.glob(os.path.join(folder or ".", f"beam-temp-{name}-*")):
        tf.io.gfile.rmtree(path)
    if folder and not folder_existed and tf.io.gfile.isdir(folder) and not tf.io.gfile.listdir(folder):
        tf.io.gfile.rmtree(folder)


if __name__ == "__main__":
    sys.exit(main())
