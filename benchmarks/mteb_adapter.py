"""Run the `mteb` package itself on any of our encoders: an adapter to its encoder protocol.

Its environment is its own (mteb pulls PyTorch, sentence-transformers and datasets; none is a dependency of the
package). From the repository root, with internet for mteb's task data:

    python3 -m venv mteb-env && mteb-env/bin/pip install torch==2.13.0 mteb==2.26.24 && mteb-env/bin/pip install -e .
    mteb-env/bin/python benchmarks/mteb_adapter.py --encoder concise-minilm-d192 --tasks STSBenchmark Banking77Classification

or in Python, `mteb.evaluate(MtebEncoder("concise-minilm-d192"), mteb.get_tasks(["SICK-R"]))`. Offline,
`--local` runs mteb's own task classes on the package's copies of STSBenchmark and Banking77
(`training/data/mteb`) instead of its downloads: mteb's protocol code, our data, and prints both scores, which
checks `concise-evaluate --encoder` against mteb's implementation.
"""

import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


class MtebEncoder:
    """mteb's `EncoderProtocol` for an encoder the project loads (`training.inference.encoders.load_encoder`):
    `encode` takes mteb's batches of {"text": [...]}, gives float32 unit rows; similarity is cosine."""

    def __init__(self, spec, revision=None, **kwargs):
        from concise_attention.training.inference import encoders

        self.encoder, self.spec = encoders.load_encoder(spec), str(spec)

    def encode(self, inputs, *, task_metadata=None, hf_split=None, hf_subset=None, prompt_type=None, **kwargs):
        texts = [text for batch in inputs for text in batch["text"]]
        return self.encoder.encode(texts)

    def similarity(self, embeddings1, embeddings2):
        return _unit(embeddings1) @ _unit(embeddings2).T

    def similarity_pairwise(self, embeddings1, embeddings2):
        return np.sum(_unit(embeddings1) * _unit(embeddings2), axis=-1)

    @property
    def mteb_model_meta(self):
        from mteb.models import ModelMeta

        return ModelMeta(
            loader=None,
            name=f"concise-attention/{self.encoder.name}",
            revision="local",
            release_date=None,
            languages=["eng-Latn"],
            n_parameters=None,
            memory_usage_mb=None,
            max_tokens=None,
            embed_dim=self.encoder.width,
            license=None,
            open_weights=True,
            public_training_code=None,
            public_training_data=None,
            similarity_fn_name="cosine",
            framework=["TensorFlow"],
            reference=None,
            use_instructions=False,
            training_datasets=None,
        )


def _unit(rows):
    rows = np.asarray(rows, np.float64)
    return rows / np.maximum(np.linalg.norm(rows, axis=-1, keepdims=True), 1e-12)


def local_task(name):
    """mteb's task class `name` with its dataset replaced by the package's copy of it."""
    import datasets
    import mteb

    from concise_attention.training.inference import mteb_protocol

    task = mteb.get_task(name)
    if name == "STSBenchmark":
        splits = {"test": mteb_protocol.read_split(name, "test")}
    else:
        splits = {split: mteb_protocol.read_split(name, split) for split in ("train", "test")}
    task.dataset = {
        "default": datasets.DatasetDict({split: datasets.Dataset.from_list(rows) for split, rows in splits.items()})
    }
    task.data_loaded = True
    return task


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoder", required=True)
    parser.add_argument("--tasks", nargs="+", default=["STSBenchmark", "Banking77Classification"])
    parser.add_argument(
        "--local", action="store_true", help="mteb's task code on the package's copies of the data (offline)"
    )
    args = parser.parse_args(argv)
    import mteb

    from concise_attention.training.inference import mteb_protocol

    model = MtebEncoder(args.encoder)
    tasks = [local_task(name) for name in args.tasks] if args.local else mteb.get_tasks(tasks=args.tasks)
    results = mteb.evaluate(model, tasks, overwrite_strategy="always", cache=None)
    for result in results.task_results if hasattr(results, "task_results") else results:
        line = f"{result.task_name}: mteb {result.get_score():.4f}"
        if args.local:
            line += f", concise-evaluate {mteb_protocol.evaluate(model.encoder.encode, [result.task_name])[result.task_name]:.4f}"
        print(line)


if __name__ == "__main__":
    main()
