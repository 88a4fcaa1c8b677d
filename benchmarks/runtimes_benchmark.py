"""Our TF Serving export against the CPU runtimes embedding users serve with, on the same weights and texts.

    python benchmarks/runtimes_benchmark.py --runtime-path PEERS [--rounds 3] [--out results/runtimes_benchmark.json]
    python benchmarks/runtimes_benchmark.py --runtime-path PEERS --quality [--out results/runtimes_quality.json]

PEERS is where the peers live, never in the package's environment: the Python executable of a virtual environment
that has them (or a folder for PYTHONPATH), e.g.

    python3 -m venv ENV
    ENV/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
    ENV/bin/pip install torch==2.13.0 "sentence-transformers[onnx,openvino]==5.7.0" openvino==2026.4.1 \\
        onnxruntime==1.32.0 fastembed==0.9.1

(the CPU build of torch first: PyPI's is a CUDA one), then `--runtime-path ENV/bin/python`.
For all-MiniLM-L6-v2 (the teacher) and every concise preset shipped with the package, `concise-export --onnx` writes
the TF Serving model and the ONNX folder of the same weights; then, round after round, each runtime runs in a fresh
process of its own, one after the other, on 32 texts of each length of `serving_benchmark.LENGTHS`, at batch 1 and 32:

  tf_serving        our export's `serving_default` (text in, embedding out), loaded with tf.saved_model.load;
  tf_serving_xla    the same of a `concise-export --xla` of the same weights (a request of one text compiled by XLA);
  tf_serving_1thread  the plain export with one intra-op thread (TF Serving's --tensorflow_intra_op_parallelism=1);
  tf_serving_xla_1thread  the `--xla` export with one intra-op thread;
  onnxruntime       ONNX Runtime on onnx/model.onnx, ids from tokenizer.json by `tokenizers`, mean pooling in numpy;
  onnxruntime_int8  the same after ONNX Runtime's dynamic int8 quantisation (QInt8 weights per channel);
  fastembed         fastembed's TextEmbedding on the folder (its custom-model route: mean pooling, unit length);
  st_pytorch        sentence-transformers on PyTorch, from the teacher's own Hugging Face folder (the teacher only: a
                    concise preset has no PyTorch weights);
  st_onnx           sentence-transformers' ONNX backend on the ONNX folder as it is;
  st_openvino       sentence-transformers' OpenVINO backend on the folder with the ONNX model saved as OpenVINO IR
                    (read by OpenVINO's ONNX reader; `openvino.convert_model` of our ONNX fails on a CPU with
                    AVX-512 in OpenVINO 2026.4: a broadcast in a fused subgraph), inference precision float32;
  st_openvino_bf16  the same at OpenVINO's default precision: bfloat16 on a CPU with AVX512_BF16 or AMX, else
                    float32 (then the same as st_openvino).

Each runtime gets 2 threads: set where it takes a setting (ONNX Runtime, fastembed, torch), the machine's cores
elsewhere (TensorFlow, OpenVINO, sentence-transformers' ONNX backend: run it on 2 cores); the `_1thread` rows one
intra-op thread. `--runtimes` runs some of them (tf_serving, the reference of the cosines, always). A figure is the
best round's median of 3 timed passes (sentences/s); every runtime's embeddings are compared with tf_serving's
(cosine). Results: --out (JSON, with machine and date) and a Markdown table of
sentences/s and of each runtime's ratio to the fastest fp32 runtime running the teacher, per length and batch.

--quality scores each model on each runtime with MTEB's protocols instead (STSBenchmark, Banking77Classification:
`training.inference.mteb_protocol`, texts embedded 32 at a time in order of length), so that what int8
quantisation costs in quality stands beside what it gains in speed; no timing.
"""

import argparse
import atexit
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

RESULTS = pathlib.Path(__file__).parent / "results"
RUNTIMES = (
    "tf_serving",
    "tf_serving_xla",
    "tf_serving_1thread",
    "tf_serving_xla_1thread",
    "onnxruntime",
    "onnxruntime_int8",
    "fastembed",
    "st_pytorch",
    "st_onnx",
    "st_openvino",
    "st_openvino_bf16",
)
FP32 = tuple(runtime for runtime in RUNTIMES if not runtime.endswith(("int8", "bf16")))
PYTORCH_SOURCE = "pytorch_source.txt"  # in an export folder: the Hugging Face folder of the same weights
BATCHES = (1, 32)
THREADS = 2
REPEATS = 3


def _runner(runtime, folder):
    """A function of a list of texts -> unit embeddings (numpy), for `runtime` on the export in `folder`."""
    if runtime.startswith("tf_serving"):
        import tensorflow as tf

        served = folder.with_name(f"{folder.name}-xla") if runtime.startswith("tf_serving_xla") else folder
        serving = tf.saved_model.load(str(served / "serving" / "1")).signatures["serving_default"]
        return lambda texts: serving(text=tf.constant(texts))["embedding"].numpy()
    model_folder = folder / "hub" / "1" / "onnx"
    if runtime == "fastembed":
        return _fastembed(model_folder)
    if runtime.startswith("st_"):
        return _sentence_transformers(runtime, folder, model_folder)
    return _onnxruntime(model_folder, quantized=runtime == "onnxruntime_int8")


def _scratch():
    """A temporary folder of this worker process, removed when it exits."""
    folder = tempfile.mkdtemp()
    atexit.register(shutil.rmtree, folder, True)
    return pathlib.Path(folder)


def _onnxruntime(folder, quantized):
    import onnxruntime
    from tokenizers import Tokenizer

    path = folder / "onnx" / "model.onnx"
    if quantized:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantized_path = _scratch() / "model_int8.onnx"
        quantize_dynamic(str(path), str(quantized_path), weight_type=QuantType.QInt8, per_channel=True)
        path = quantized_path
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id("[PAD]"), pad_token="[PAD]")
    names = {item.name for item in session.get_inputs()}

    def embed(texts):
        encodings = tokenizer.encode_batch(texts)
        ids = np.array([encoding.ids for encoding in encodings], np.int64)
        mask = np.array([encoding.attention_mask for encoding in encodings], np.int64)
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        (hidden,) = session.run(["last_hidden_state"], {name: value for name, value in feed.items() if name in names})
        mean = (hidden * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
        return mean / np.linalg.norm(mean, axis=1, keepdims=True)

    return embed


def _fastembed(folder):
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    width = json.loads((folder / "1_Pooling" / "config.json").read_text())["word_embedding_dimension"]
    name = f"concise-benchmark-{folder.parents[2].name}"
    TextEmbedding.add_custom_model(
        name,
        pooling=PoolingType.MEAN,
        normalization=True,
        sources=ModelSource(hf="unused"),
        dim=width,
        model_file="onnx/model.onnx",
    )
    model = TextEmbedding(name, specific_model_path=str(folder), threads=THREADS)
    return lambda texts: np.array(list(model.embed(texts, batch_size=len(texts))))


def _sentence_transformers(runtime, folder, model_folder):
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(THREADS)
    if runtime == "st_pytorch":
        model = SentenceTransformer((folder / PYTORCH_SOURCE).read_text().strip(), device="cpu")
    elif runtime == "st_onnx":
        model = SentenceTransformer(str(model_folder), backend="onnx", device="cpu")
    else:
        import openvino

        converted = _scratch() / model_folder.name
        shutil.copytree(model_folder, converted, ignore=shutil.ignore_patterns("onnx"))
        onnx_model = openvino.Core().read_model(str(model_folder / "onnx" / "model.onnx"))
        openvino.save_model(onnx_model, str(converted / "openvino" / "openvino_model.xml"), compress_to_fp16=False)
        precision = {} if runtime == "st_openvino_bf16" else {"ov_config": {"INFERENCE_PRECISION_HINT": "f32"}}
        model = SentenceTransformer(str(converted), backend="openvino", device="cpu", model_kwargs=precision)
    return lambda texts: model.encode(texts, batch_size=len(texts), normalize_embeddings=True)


def _runtimes(folder, chosen=RUNTIMES):
    """The runtimes of `chosen` that can run the model exported in `folder` (st_pytorch: only where PyTorch weights
    exist), tf_serving always."""
    return [
        runtime
        for runtime in RUNTIMES
        if (runtime in chosen or runtime == "tf_serving")
        and (runtime != "st_pytorch" or (folder / PYTORCH_SOURCE).is_file())
    ]


def worker(runtime, folder, texts_path, embeddings_path):
    """Times `runtime` on every length and batch of the texts file; prints {length: {batch: [rates]}}, saves the
    embeddings of every text (batch 32) for the comparison."""
    embed = _runner(runtime, pathlib.Path(folder))
    texts, rates, vectors = json.loads(pathlib.Path(texts_path).read_text()), {}, {}
    for length, group in texts.items():
        vectors[length] = embed(group)  # also the warm-up of batch 32
        rates[length] = {}
        for batch in BATCHES:
            embed(group[:batch])
            passes = []
            for _ in range(REPEATS):
                start = time.perf_counter()
                for first in range(0, len(group), batch):
                    embed(group[first : first + batch])
                passes.append(len(group) / (time.perf_counter() - start))
            rates[length][str(batch)] = statistics.median(passes)
    np.savez(embeddings_path, **vectors)
    print(json.dumps(rates))


def quality_worker(runtime, folder):
    """Prints {task: MTEB-protocol score} of `runtime` on the export in `folder`."""
    from concise_attention.training.inference import mteb_protocol

    embed = _runner(runtime, pathlib.Path(folder))

    def batched(texts):
        order = sorted(range(len(texts)), key=lambda index: len(texts[index]))
        vectors = np.concatenate(
            [embed([texts[i] for i in order[start : start + 32]]) for start in range(0, len(texts), 32)]
        )
        return vectors[np.argsort(order)]

    scores = mteb_protocol.evaluate(batched)
    print(json.dumps(mteb_protocol.with_mean(scores)))


def _exports(workdir):
    """{model name: export folder}: the teacher from its Hugging Face folder, each shipped preset by name (and beside
    each, FOLDER-xla: its `--xla` export)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from concise_attention.cli.export import main as export
    from concise_attention.models import presets
    from concise_attention.training.tasks.distill import default_teacher

    sources = {"all-MiniLM-L6-v2": ["--hf-dir", default_teacher()]}
    sources |= {name: ["--preset", name] for name in presets.shipped_presets()}
    folders = {}
    for name, source in sources.items():
        folders[name] = workdir / name
        if not (folders[name] / "hub" / "1" / "onnx").is_dir():
            assert export([*source, "--out", str(folders[name]), "--onnx", "--seq-length", "128"]) == 0
        if not (workdir / f"{name}-xla" / "serving" / "1").is_dir():
            assert export([*source, "--out", str(workdir / f"{name}-xla"), "--xla", "--seq-length", "128"]) == 0
    (folders["all-MiniLM-L6-v2"] / PYTORCH_SOURCE).write_text(default_teacher())
    return folders


def _texts(workdir):
    """The 32 texts of each length of `serving_benchmark`, in a JSON file for the workers."""
    import serving_benchmark
    from concise_attention.training import artifacts
    from concise_attention.training.preprocessing.text import WordPieceModule

    source = artifacts.read(str(serving_benchmark.minilm_folder()))
    tokenizer = WordPieceModule(source.vocabulary, **source.tokenizer)
    chosen = serving_benchmark.texts_by_length(tokenizer, 32)
    path = workdir / "texts.json"
    path.write_text(json.dumps(chosen))
    return path


def _run(runtime, folder, runtime_path, *arguments):
    """The last line of a worker process's output (JSON), `runtime` run in the peers' environment unless ours."""
    peers = not runtime.startswith("tf_serving")
    python = runtime_path if peers and os.path.isfile(runtime_path or "") else sys.executable
    environment = dict(os.environ, OMP_NUM_THREADS=str(THREADS), HF_HUB_OFFLINE="1", TF_CPP_MIN_LOG_LEVEL="3")
    if runtime.endswith("_1thread"):
        environment["TF_NUM_INTRAOP_THREADS"] = "1"
    if peers and python == sys.executable:
        environment["PYTHONPATH"] = runtime_path
    command = [python, __file__, *arguments]
    result = subprocess.run(command, capture_output=True, text=True, env=environment, cwd=folder)
    if result.returncode:
        raise RuntimeError(f"{runtime} on {folder.name} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _run_worker(runtime, folder, texts_path, runtime_path):
    embeddings_path = folder / f"{runtime}.npz"
    rates = _run(runtime, folder, runtime_path, "--worker", runtime, str(folder), str(texts_path), str(embeddings_path))
    return rates, dict(np.load(embeddings_path))


def measure_quality(folders, runtime_path, chosen=RUNTIMES):
    """{model: {runtime: {task: MTEB-protocol score, "mean": ...}}}."""
    rows = {model: {} for model in folders}
    for model, folder in folders.items():
        for runtime in _runtimes(folder, chosen):
            rows[model][runtime] = _run(runtime, folder, runtime_path, "--quality-worker", runtime, str(folder))
            print(f"{model}, {runtime}: {json.dumps(rows[model][runtime])}", flush=True)
    return rows


def quality_table(rows):
    """Markdown: each model's MTEB-protocol scores on each runtime."""
    tasks = list(next(iter(next(iter(rows.values())).values())))
    lines = [f"| model, runtime | {' | '.join(tasks)} |", "|---|" + "---:|" * len(tasks)]
    for model, runtimes in rows.items():
        for runtime, scores in runtimes.items():
            lines.append(f"| {model}, {runtime} | {' | '.join(f'{scores[task]:.4f}' for task in tasks)} |")
    return "\n".join(lines)


def measure(folders, texts_path, runtime_path, rounds, chosen=RUNTIMES):
    """{model: {runtime: {"rates": {length: {batch: best round's median}}, "cosine_min": ...}}}."""
    rows = {
        model: {runtime: {"rounds": []} for runtime in _runtimes(folder, chosen)} for model, folder in folders.items()
    }
    for round_index in range(rounds):
        for model, folder in folders.items():
            for runtime in rows[model]:
                rates, vectors = _run_worker(runtime, folder, texts_path, runtime_path)
                rows[model][runtime]["rounds"].append(rates)
                rows[model][runtime]["vectors"] = vectors
                print(f"round {round_index + 1}, {model}, {runtime}: {json.dumps(rates)}", flush=True)
    for model, runtimes in rows.items():
        reference = runtimes["tf_serving"]["vectors"]
        for runtime, row in runtimes.items():
            vectors = row.pop("vectors")
            row["cosine_min"] = min(float((vectors[key] * reference[key]).sum(1).min()) for key in reference)
            row["rates"] = {
                length: {batch: max(r[length][batch] for r in row["rounds"]) for batch in row["rounds"][0][length]}
                for length in row["rounds"][0]
            }
    return rows


def table(result):
    """Markdown: sentences/s of every model and runtime, and its ratio to the fastest fp32 runtime of the teacher."""
    rows, teacher = result["rows"], "all-MiniLM-L6-v2"
    keys = [(length, batch) for length in rows[teacher]["tf_serving"]["rates"] for batch in map(str, BATCHES)]
    measured = [runtime for runtime in FP32 if runtime in rows[teacher]]
    fastest = {key: max(rows[teacher][runtime]["rates"][key[0]][key[1]] for runtime in measured) for key in keys}
    header = " | ".join(f"{length} b{batch}" for length, batch in keys)
    lines = [f"| model, runtime | cosine | {header} |", "|---|---:|" + "---:|" * len(keys)]
    for model, runtimes in rows.items():
        for runtime, row in runtimes.items():
            cells = [
                f"{row['rates'][length][batch]:.0f} ({row['rates'][length][batch] / fastest[(length, batch)]:.2f}x)"
                for length, batch in keys
            ]
            lines.append(f"| {model}, {runtime} | {row['cosine_min']:.6f} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime-path", required=True, help="PYTHONPATH folder or Python holding the peers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quality", action="store_true", help="MTEB-protocol scores per runtime instead of speed")
    parser.add_argument(
        "--runtimes",
        type=lambda value: value.split(","),
        default=RUNTIMES,
        help=f"comma-separated, of {', '.join(RUNTIMES)} (default: all)",
    )
    parser.add_argument("--workdir", default=str(RESULTS / "cache" / "runtimes"))
    parser.add_argument(
        "--out",
        help="the JSON to write (default results/runtimes_benchmark.json, or with --quality results/runtimes_quality.json)",
    )
    args = parser.parse_args(argv)
    if set(args.runtimes) - set(RUNTIMES):
        parser.error(f"--runtimes: unknown {', '.join(sorted(set(args.runtimes) - set(RUNTIMES)))}")
    args.out = args.out or str(RESULTS / ("runtimes_quality.json" if args.quality else "runtimes_benchmark.json"))
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import provenance

    workdir = pathlib.Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    folders = _exports(workdir)
    if args.quality:
        rows = measure_quality(folders, args.runtime_path, args.runtimes)
    else:
        rows = measure(folders, _texts(workdir), args.runtime_path, args.rounds, args.runtimes)
    result = {**provenance.header(__file__, argv), "threads": THREADS, "rows": rows}
    provenance.write(args.out, result)
    print(f"\n{result['machine']}, {result['date']}\n\n{quality_table(rows) if args.quality else table(result)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(*sys.argv[2:6])
    elif sys.argv[1:2] == ["--quality-worker"]:
        quality_worker(*sys.argv[2:4])
    else:
        main()
