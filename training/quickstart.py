"""`concise-quickstart`: the main job end to end, on the shipped corpus, in a few minutes on a CPU.

1. pretrain a tiny fixed-head-size BERT (width 32, 4 heads of size 16) with the masked-LM
   task on the shipped sample corpus (`tiny_bert_fixed`);
2. export it: TF-Hub encoder + preprocessor, tarball, TF Serving model;
3. load the exported serving model back from disk and print the embeddings of a few
   sentences and their cosine similarities.

    concise-quickstart --out my_first_export [--set training.train_steps=1000]
"""

import argparse
import pathlib
import sys
import time

SENTENCES = (
    "The module provides functions for reading and writing files.",
    "This function reads a file and returns its contents.",
    "Attention heads with a fixed size stay expressive.",
)


def read_back(serving_dir, sentences=SENTENCES):
    """Embeddings of `sentences` through the exported serving model's `serving_default`."""
    import numpy as np
    import tensorflow as tf

    serve = tf.saved_model.load(str(serving_dir)).signatures["serving_default"]
    return np.asarray(serve(text=tf.constant(list(sentences)))["embedding"])


def main(argv=None):
    parser = argparse.ArgumentParser(prog="concise-quickstart", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="concise-quickstart", help="folder for the run (OUT/run) and the export (OUT/export)")
    parser.add_argument("--config", default="tiny_bert_fixed", help="a BERT preset or YAML with a training section")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override, e.g. training.train_steps=1000")
    args = parser.parse_args(argv)
    import numpy as np

    import configs
    from export.savedmodels import export_run
    from training.trainer import train

    out = pathlib.Path(args.out).resolve()
    start = time.time()
    try:
        config = configs.load_config(args.config, args.set)
        if config.model_type != "bert":
            raise ValueError(f"The quickstart pretrains a BERT. Received: model_type={config.model_type!r} ({args.config})")
        print(f"[1/3] pretraining {config.name} (masked LM) on the shipped corpus -> {out / 'run'}", flush=True)
        metrics = train(config, out / "run")
        print(f"      step {metrics['step']}: eval MLM loss {metrics['eval_loss']:.3f}, accuracy {metrics['eval_accuracy']:.3f}", flush=True)
        print(f"[2/3] exporting -> {out / 'export'}", flush=True)
        written = export_run(out / "run", out / "export")
    except ValueError as error:
        parser.exit(2, f"concise-quickstart: error: {error}\n")
    print(f"[3/3] embeddings read back through {written['serving']} (serving_default):", flush=True)
    embeddings = read_back(written["serving"])
    np.set_printoptions(precision=3, suppress=True, linewidth=120)
    for sentence, embedding in zip(SENTENCES, embeddings):
        print(f"  {sentence!r}\n    dim {embedding.shape[0]}: {embedding[:8]} ...")
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    print("  cosine similarities:\n", unit @ unit.T)
    print(f"\nDone in {time.time() - start:.0f} s. Artifacts (version {written['version']}):")
    for key in ("encoder", "preprocess", "tarball", "serving", "models_config"):
        print(f"  {key:14s}{written[key]}")
    print(f"Serve it: docker run -p 8501:8501 -v {out / 'export' / 'serving'}:/models/{config.name} "
          f"-e MODEL_NAME={config.name} tensorflow/serving")
    return 0


if __name__ == "__main__":
    sys.exit(main())
