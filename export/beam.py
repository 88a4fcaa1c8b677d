"""`python -m concise_attention.export.beam`: embed a corpus with an export's TF Serving model on Apache Beam.

    python -m concise_attention.export.beam --model EXPORT --input 'texts/*.txt' --output embeddings/part
    python -m concise_attention.export.beam --model gs://b/export --input 'gs://b/docs/*.jsonl' --format jsonl \\
        --output gs://b/embeddings/part --runner DataflowRunner --project P --region R \\
        --temp_location gs://b/tmp --extra_package dist/concise_attention-0.1.0-py3-none-any.whl   # apache-beam[gcp]

Reads every file matching --input (`--format text`: one text per line; `jsonl`: one JSON object per line with a
string "id" and "text"; `parquet`: the string columns `id` and `text`; `tfrecord`: serialized `tf.train.Example`s
with one UTF-8 bytes value each in the features `id` and `text`), embeds the texts with the `serving_default`
signature of EXPORT's newest `serving/<version>/` (resolved once: a version exported during the run does not mix
in) through Beam's RunInference, in batches of at most --batch-size texts, and writes snappy Parquet files
OUTPUT-<shard>-of-<count>.parquet (--num-shards of them; 0: as many as the runner chooses) with the columns `id`
(the record's, or the SHA-256 of a plain line's text, each distinct text embedded once) and `embedding` (float32,
unit length). Blank texts are skipped. Other arguments are Beam's pipeline options (the DirectRunner by default;
Dataflow, Flink or Spark with theirs, whose workers need --model, --input and --output on shared storage such as
gs://). Paths: local or gs://.

Refused before the pipeline starts, in one line with exit 2 and nothing written: an export without a TF Serving
model, an input pattern matching nothing, an output prefix with files under it, an argument neither ours nor
Beam's, TFRecord input where Beam finds no CRC32C module (`apache-beam[tfrecord]` installs one). Beam's file sink
writes temporary files and renames them when the pipeline succeeds; when it fails they are removed, a malformed
record is one line naming it (exit 2), any other error is raised with its traceback.

Apache Beam is not a dependency of the package (its pins of protobuf and pillow differ from ours): install it in
an environment of its own beside the package, `pip install concise-attention apache-beam` (`apache-beam[gcp]` for
gs:// and Dataflow, `apache-beam[tfrecord]` for TFRecord input).
"""

import argparse
import difflib
import hashlib
import importlib.util
import json
import logging
import os
import re
import sys

import numpy as np
import tensorflow as tf
from google.protobuf import message

from concise_attention.models.checks import check_integer
from concise_attention.training.inference import encoders
from concise_attention.training.run import configs


def keyed_text(record, form):
    """(id, text) of one input record (a line of a text or JSON-lines file, a Parquet row as a dict, a TFRecord's
    bytes), or None for a blank text; a record without a string id and text is a ValueError naming it."""
    if form == "text":
        return (hashlib.sha256(record.encode("utf-8")).hexdigest(), record) if record.strip() else None
    shown = str(record)[:200]
    if form == "jsonl":
        if not record.strip():
            return None
        try:
            record = json.loads(record)
        except json.JSONDecodeError:
            raise ValueError(f"{MALFORMED} not a JSON line: {shown!r}") from None
    if form == "tfrecord":
        record = example_fields(record, shown)
    if not isinstance(record, dict) or not all(isinstance(record.get(key), str) for key in ("id", "text")):
        raise ValueError(f'{MALFORMED} a record needs a string "id" and "text". Received: {shown!r}')
    return (record["id"], record["text"]) if record["text"].strip() else None


def example_fields(serialized, shown):
    """{"id": str, "text": str} of a serialized `tf.train.Example` holding one UTF-8 value in each of its bytes
    features `id` and `text`; else a ValueError naming the feature and the record (`shown`)."""
    try:
        features = tf.train.Example.FromString(serialized).features.feature
    except message.DecodeError:
        raise ValueError(f"{MALFORMED} not a serialized tf.train.Example: {shown!r}") from None
    fields = {}
    for key in ("id", "text"):
        values = features[key].bytes_list.value if key in features else []
        try:
            fields[key] = values[0].decode("utf-8") if len(values) == 1 else None
        except UnicodeDecodeError:
            fields[key] = None
        if fields[key] is None:
            raise ValueError(
                f"{MALFORMED} a tf.train.Example needs one UTF-8 value in its bytes feature {key!r}. Received: {shown!r}"
            )
    return fields


MALFORMED = "--input:"  # how a malformed record's error starts (found again in the runner's wrapped error)
FORMATS = ("text", "jsonl", "parquet", "tfrecord")


def model_handler(saved_model, batch_size):
    """A Beam ModelHandler (keyed: (id, text) in, (id, PredictionResult) out) of the SavedModel `saved_model`."""
    from apache_beam.ml.inference.base import KeyedModelHandler  # optional: Beam's own environment
    from apache_beam.ml.inference.base import ModelHandler
    from apache_beam.ml.inference.base import PredictionResult

    class ServedEmbeddings(ModelHandler):
        def load_model(self):
            return encoders.Served(saved_model)

        def run_inference(self, batch, served, inference_args=None):
            return [PredictionResult(text, vector) for text, vector in zip(batch, served.encode(list(batch)))]

        def batch_elements_kwargs(self):
            return {"min_batch_size": 1, "max_batch_size": batch_size}

        def get_num_bytes(self, batch):
            return sum(len(text.encode("utf-8")) for text in batch)

    return KeyedModelHandler(ServedEmbeddings())


def build(pipeline, saved_model, input_pattern, output, form="text", batch_size=64, num_shards=0):
    """Adds the read -> RunInference -> Parquet steps to `pipeline`."""
    import apache_beam as beam  # optional: Beam's own environment
    import pyarrow
    from apache_beam.ml.inference.base import RunInference

    schema = pyarrow.schema([("id", pyarrow.string()), ("embedding", pyarrow.list_(pyarrow.float32()))])
    if form == "parquet":
        records = pipeline | "Read" >> beam.io.ReadFromParquet(input_pattern, columns=["id", "text"])
    elif form == "tfrecord":
        records = pipeline | "Read" >> beam.io.ReadFromTFRecord(input_pattern)
    else:
        records = pipeline | "Read" >> beam.io.ReadFromText(input_pattern)
    texts = records | "Key" >> beam.Map(keyed_text, form) | "NotBlank" >> beam.Filter(lambda keyed: keyed is not None)
    if form == "text":
        texts = texts | "Distinct" >> beam.Distinct()  # a text's id is its hash: one row per distinct text
    return (
        texts
        | "Embed" >> RunInference(model_handler(saved_model, batch_size))
        | "Row" >> beam.MapTuple(lambda key, result: {"id": key, "embedding": np.asarray(result.inference).tolist()})
        | "Write"
        >> beam.io.WriteToParquet(output, schema, codec="snappy", file_name_suffix=".parquet", num_shards=num_shards)
    )


def check(args, beam_arguments):
    """Refuses what would fail after the pipeline started, or overwrite a result: one ValueError naming it."""
    from apache_beam.io.filesystems import FileSystems  # optional: Beam's own environment

    check_integer("--batch-size", args.batch_size)
    check_integer("--num-shards", args.num_shards, least=0)
    unknown = unknown_options(beam_arguments)
    if unknown:
        ours = difflib.get_close_matches(unknown[0].split("=")[0], OUR_OPTIONS, n=1)
        hint = f" (did you mean {ours[0]}?)" if ours else ""
        raise ValueError(f"{unknown[0]}: neither an option of this command nor of Beam's pipelines{hint}")
    if remote_runner(beam_arguments):
        for name in ("model", "input", "output"):
            if "://" not in getattr(args, name):
                raise ValueError(f"--{name} {getattr(args, name)}: a remote runner's workers need a path such as gs://")
    if args.format == "tfrecord" and not crc32c_available():
        raise ValueError(
            "--format tfrecord: Beam checks TFRecords with python-snappy, google-crc32c or crcmod, none installed: "
            "pip install 'apache-beam[tfrecord]'"
        )
    if encoders.serving_version(args.model) is None:
        raise ValueError(f"--model {args.model}: no serving/<version>/ SavedModel (a concise-export folder is needed)")
    if not FileSystems.match([args.input])[0].metadata_list:
        raise ValueError(f"--input {args.input}: no file matches")
    taken = [match.path for match in FileSystems.match([f"{args.output}-*"])[0].metadata_list]
    if taken:
        count = re.search(r"-of-(\d+)\.parquet$", taken[0])
        partial = count and len(taken) < int(count.group(1))
        what = f"{len(taken)} of {int(count.group(1))} shards of an unfinished run" if partial else "files"
        raise ValueError(
            f"--output {args.output}: {what} exist ({args.output}-*); remove them or choose another prefix"
        )


CRC32C_MODULES = ("google_crc32c", "crcmod")  # where Beam's TFRecord reader finds a CRC32C, besides python-snappy
TFRECORD_CRC = ("snappy", *CRC32C_MODULES)  # every module it may take one from


def crc32c_available():
    """Whether Beam's TFRecord reader finds its CRC32C here, as it looks (apache_beam.io.tfrecordio): python-snappy
    holding one, else google-crc32c, else crcmod. (On a remote runner the workers need it too.)"""
    if any(importlib.util.find_spec(name) for name in CRC32C_MODULES):
        return True
    if importlib.util.find_spec("snappy") is None:
        return False
    import snappy  # optional: found just above; Beam takes its CRC32C from it only if it holds one

    return bool(getattr(snappy, "_crc32c", None) or getattr(getattr(snappy, "_snappy", None), "_crc32c", None))


OUR_OPTIONS = ["--model", "--input", "--output", "--format", "--batch-size", "--num-shards"]


def unknown_options(beam_arguments):
    """The arguments Beam's pipeline options do not know (Beam itself only logs and drops them)."""
    from apache_beam.options.pipeline_options import PipelineOptions  # optional: Beam's own environment

    dropped = []

    class Catch(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("Discarding unparseable args"):
                dropped.extend(record.args[0] if isinstance(record.args, tuple) else [])

    logger, handler = logging.getLogger("apache_beam.options.pipeline_options"), Catch()
    logger.addHandler(handler)
    try:
        PipelineOptions(beam_arguments).get_all_options()
    finally:
        logger.removeHandler(handler)
    return [argument for argument in dropped if argument.startswith("-")] or dropped


def remote_runner(beam_arguments):
    """Whether the pipeline options name a runner whose workers are other machines."""
    from apache_beam.options.pipeline_options import PipelineOptions  # optional: Beam's own environment
    from apache_beam.options.pipeline_options import StandardOptions

    runner = PipelineOptions(beam_arguments).view_as(StandardOptions).runner or "DirectRunner"
    return runner not in ("DirectRunner", "PrismRunner", "direct", "prism")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a concise-export folder (local or gs://)")
    parser.add_argument("--input", required=True, help="a file pattern (local or gs://)")
    parser.add_argument("--output", required=True, help="the prefix of the Parquet files to write")
    parser.add_argument("--format", choices=FORMATS, default="text", help="of the input files (default: text lines)")
    parser.add_argument("--batch-size", type=int, default=64, help="texts per inference call, at most")
    parser.add_argument("--num-shards", type=int, default=0, help="output files (default 0: the runner chooses)")
    args, beam_arguments = parser.parse_known_args(argv)
    with configs.one_line_errors(parser, "concise_attention.export.beam"):
        if importlib.util.find_spec("apache_beam") is None:
            raise ValueError("apache_beam is not installed: pip install apache-beam (in an environment of its own)")
        check(args, beam_arguments)
        run(args, beam_arguments)
    return 0


def run(args, beam_arguments):
    """Runs the pipeline; on failure removes what it left, and raises a malformed input line as one ValueError."""
    import apache_beam as beam  # optional: Beam's own environment
    from apache_beam.options.pipeline_options import PipelineOptions

    folder_existed = tf.io.gfile.exists(os.path.dirname(args.output) or ".")
    saved_model = encoders.serving_version(args.model)
    step_log = logging.getLogger("apache_beam.runners.common")  # logs a failing step's traceback, raised below too
    level = step_log.level
    step_log.setLevel(logging.CRITICAL)
    try:
        with beam.Pipeline(options=PipelineOptions(beam_arguments)) as pipeline:
            build(pipeline, saved_model, args.input, args.output, args.format, args.batch_size, args.num_shards)
    except Exception as error:
        _remove_temporary(args.output, folder_existed)
        message = str(error)
        if MALFORMED not in message:
            raise RuntimeError(f"the pipeline failed: {type(error).__name__}") from error
        line = message[message.find(MALFORMED) :].splitlines()[0]
        raise ValueError(line.split(" [while running")[0]) from None
    finally:
        step_log.setLevel(level)


def _remove_temporary(output, folder_existed):
    """Deletes what Beam's file sink left of a failed run (its beam-temp-* folders beside `output`, the output's folder
    if the run made it and it is empty); a failure to clean up is logged, never raised over the run's own error."""
    folder, name = os.path.split(output)
    try:
        for path in tf.io.gfile.glob(os.path.join(folder or ".", f"beam-temp-{name}-*")):
            tf.io.gfile.rmtree(path)
        if folder and not folder_existed and tf.io.gfile.isdir(folder) and not tf.io.gfile.listdir(folder):
            tf.io.gfile.rmtree(folder)
    except (OSError, tf.errors.OpError) as error:
        logging.warning("could not remove the failed run's temporary files beside %s: %s", output, error)


if __name__ == "__main__":
    sys.exit(main())
