"""The papers' claims at small scale: held-out perplexity of scaled-down LM1B-study models.

Three studies, every run a normal `concise-train` run of an LM1B preset scaled down (same
trainer, same data order, same steps), so each is resumable: kill this script at any moment
and run it again, finished runs are skipped and the ones in flight resume from their last
checkpoint (bit-identically). A model that two studies share is trained once.

  heads          Bhojanapalli et al. (2020), Figures 1 and 3a: standard attention at width
                 w and wider (head size w/h), and fixed head size p at width w with more
                 heads; perplexity against parameters and against the number of heads.
  collaborative  Cordonnier et al. (2020): collaborative attention trained from scratch at
                 shared key width D~k = D_k/4 and D_k/8 against the concatenated baseline.
  depth          Liu et al. (2021): deep single-head (h*L layers of 1 head) vs shallow
                 multi-head (L layers of h heads), post-LN, with and without Admin.
  tokens         issue 26: the heads study's pair (fixed p=16 w=64 h=32 vs standard w=128) and a fixed
                 model whose head size is the sequence length (p=64, 8 heads: the same parameters) at
                 400, 1500, 6000 and 12000 steps (about 0.3M to 9.5M tokens, one pass at most, the
                 schedule scaled to each); the seed-paired gap against log tokens, fitted (`trend`).
  width          the pair at w = 32, 64, 128 against standard attention at 2w, parameters matched.
  head_size      Bhojanapalli et al. (2020), Table 2B / Figure 3b: width 64, 4 heads, head size 16 to 128.

Two corpora:
  (default)      the shipped 31k-word sample: each run sees it ~22 times (memorisation counts): a quick
                 rehearsal, results in benchmarks/results/cache/studies_sample/ (not committed: a
                 rehearsal's figures are not results).
  --corpus DIR   a corpus built by `python scripts/make_corpus.py`: prepared once into shards
                 (benchmarks/results/cache/), each run reads 3% of its training split (one pass),
                 evaluated on the whole held-out split; results in benchmarks/results/studies_large/.

A finished run is not trained again: to regenerate a table with new code, move its CSV aside and delete
its runs (benchmarks/results/cache/studies_large/ or studies/). Each CSV row records the run's data
(steps, tokens seen, passes, whether a token was seen twice), date, machine and commit; `--plot-only` redraws the plots, `--markdown` prints the docs/results.md
tables, `--check` re-runs each table's first row from scratch and says whether it still reproduces.
`--jobs N` trains N runs at once, each on cpu_count / N threads (on 2 cores, 2 jobs of 1 thread gave
~1.2x the runs per hour; a run's last bits depend on its thread count).

    python benchmarks/studies.py                                   # shipped sample, seeds 0, 1, 2
    python benchmarks/studies.py --corpus corpus --jobs 2
    python benchmarks/studies.py --study heads --seeds 0           # one study, one seed
    python benchmarks/studies.py --corpus corpus --markdown
    python benchmarks/studies.py --corpus corpus --check --jobs 2  # the committed tables, still true?
"""

import argparse
import concurrent.futures
import csv
import dataclasses
import hashlib
import itertools
import json
import multiprocessing
import os
import pathlib
import shutil
import sys
import textwrap
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import provenance  # noqa: E402  (benchmarks/, beside this script)

RESULTS = pathlib.Path(__file__).parent / "results"
CACHE = RESULTS / "cache"
# The shipped 31k-word sample (~22 passes per run; its tables retired, not committed) and a corpus built by
# `python scripts/make_corpus.py` (--corpus DIR: one pass at most, held out by document).
STUDIES_DIR = CACHE / "studies_sample"
LARGE_STUDIES_DIR = RESULTS / "studies_large"
# Vocabulary of the large corpus: WordPiece trained on one training line in VOCABULARY_EVERY
# (a sample of every package, not the first packages in name order).
VOCABULARY_EVERY = 3
# `--check`: a committed row re-run from scratch must give its perplexity within this share (issue 27).
CHECK_TOLERANCE = 0.005
# The guard of the checked tables (issue 27): a table's models of distinct code paths (attention types, norm
# positions, Admin; "concatenate w=64 h=4" is "standard w=64 h=4", trained once), cut to CANARY_OVERRIDES
# (2 layers, no XLA: seconds each, not minutes) and trained CANARY_STEPS steps on the shipped sample prepared
# into shards (the large tables' path: WordPiece training, packing, shards). `--check` records their held-out
# losses in check.json beside the re-run row; tests/test_results.py trains them again: another loss means the code has changed the
# numbers since the table was checked, and the check is due again.
CANARY_STEPS = 10
CANARY_OVERRIDES = ["model.num_layers=2", "training.jit_compile=false"]
CANARIES = {
    "heads": ["standard w=64 h=4", "fixed p=16 w=64 h=8"],
    "collaborative": ["concatenate w=64 h=4", "collaborative w=64 D~k=16 (D_k/4)"],
    "depth": ["deep 16 layers x 1 head, Admin"],
    "tokens": ["fixed p=64 w=64 h=8 @400"],
    "width": ["fixed p=16 w=32 h=24"],
    "head_size": ["fixed p=128 w=64 h=4"],
}

WIDTH = 64  # w: the scaled-down counterpart of the paper's 256
HEAD_SIZE = 16  # p: w/4, as the paper's 32 is 256/8
SEQUENCE_LENGTH = 64
COMMON = [
    "model.vocab_size=2000",
    "model.num_layers=4",
    "model.intermediate_size=256",
    f"model.max_sequence_length={SEQUENCE_LENGTH}",
    f"training.sequence_length={SEQUENCE_LENGTH}",
    "training.batch_size=16",
    "training.train_steps=1500",
    # One epoch: one evaluation before the final one (an epoch end changes no weight: identical runs).
    "training.steps_per_epoch=1500",
    "training.learning_rate=0.002",
    "training.warmup_steps=150",
    "training.steps_per_execution=50",
    "training.jit_compile=true",
    # The LM1B presets train in mixed_bfloat16 (TPU); on a CPU float32 is the faster and exact choice.
    "training.precision=float32",
]


def _standard(width, heads):
    return ("lm1b_standard_d256", [f"model.hidden_size={width}", f"model.num_heads={heads}"])


def _fixed(width, heads, head_size=HEAD_SIZE):
    return (
        "lm1b_fixed_d256_p32_h8",
        [f"model.hidden_size={width}", f"model.num_heads={heads}", f"model.attention.head_size={head_size}"],
    )


def _collaborative(width, heads, shared_key_dim):
    preset, overrides = _standard(width, heads)
    return preset, overrides + [
        f"model.attention={{type: collaborative, head_size: {width // heads}, "
        f"shared_key_dim: {shared_key_dim}, mixing_initializer: random}}"
    ]


def _depth(layers, heads, admin):
    preset = "lm1b_deep_single_head_admin" if admin else "lm1b_shallow_multi_head"
    return preset, [
        f"model.hidden_size={WIDTH}",
        f"model.num_layers={layers}",
        f"model.num_heads={heads}",
        f"model.attention={{type: fixed, head_size: {HEAD_SIZE}}}",
        f"model.intermediate_size={256 * heads // 4}",
        "model.norm_position=post",
        f"model.residual_scaling={'admin' if admin else 'none'}",
    ]


# Issue 26: the fixed-head-size gap against the tokens a run sees (steps of 16 x 64, the schedule scaled to each
# budget: warm-up a tenth, one evaluation), against width, and the head-size ablation.
TREND_STEPS = (400, 1500, 6000, 12000)  # about 0.3M, 1.2M, 4.8M and 9.5M tokens of the 36M-token corpus
# The pair of the heads study and a fixed model whose head size is the sequence length (64), its heads (8) chosen
# so that its parameters are those of "fixed p=16 w=64 h=32" (the same query/key/value widths, 512), within
# 0.5% of the standard w=128 model's.
TREND_MODELS = {
    "standard w=128 h=8": _standard(128, 8),
    "fixed p=16 w=64 h=32": _fixed(64, 32),
    "fixed p=64 w=64 h=8": _fixed(64, 8, 64),
}


HEAD_SIZES = (HEAD_SIZE, 32, SEQUENCE_LENGTH, 128)  # the head-size study's: w/4 up to past the sequence length
WIDTH_PAIRS = {32: 24, 64: 32, 128: 48}  # width w of the fixed model: its heads (its partner is standard at 2w)


ONE_EPOCH_UP_TO = 6000  # budgets up to this many steps run as one epoch (their measured runs keep their directories)
CHECKPOINT_STEPS = 2000  # longer ones checkpoint this often, so that a stopped session resumes them (an epoch end
# changes no weight: the same run either way)


def _budget(steps):
    per_epoch = steps if steps <= ONE_EPOCH_UP_TO else CHECKPOINT_STEPS
    return [
        f"training.train_steps={steps}",
        f"training.steps_per_epoch={per_epoch}",
        f"training.warmup_steps={steps // 10}",
    ]


STUDIES = {
    "heads": {
        **{f"standard w={WIDTH} h={h}": _standard(WIDTH, h) for h in (1, 2, 4, 8, 16)},
        **{f"fixed p={HEAD_SIZE} w={WIDTH} h={h}": _fixed(WIDTH, h) for h in (8, 16, 32)},
        **{f"standard w={w} h={w // HEAD_SIZE}": _standard(w, w // HEAD_SIZE) for w in (96, 128)},
    },
    "collaborative": {f"concatenate w={w} h={w // HEAD_SIZE}": _standard(w, w // HEAD_SIZE) for w in (WIDTH, 128)}
    | {
        f"collaborative w={w} D~k={w // ratio} (D_k/{ratio})": _collaborative(w, w // HEAD_SIZE, w // ratio)
        for w in (WIDTH, 128)
        for ratio in (4, 8)
    },
    "depth": {
        "shallow 4 layers x 4 heads": _depth(4, 4, admin=False),
        "deep 16 layers x 1 head, no Admin": _depth(16, 1, admin=False),
        "deep 16 layers x 1 head, Admin": _depth(16, 1, admin=True),
    },
    "tokens": {
        f"{label} @{steps}": (preset, [*overrides, *_budget(steps)])
        for steps in TREND_STEPS
        for label, (preset, overrides) in TREND_MODELS.items()
    },
    # Fixed head size 16 at width w against standard attention at 2w (head size 16), the heads chosen so that the
    # parameters match within 2% (WIDTH_PAIRS; at w=64 the heads study's pair); the feed-forward stays COMMON's 256.
    "width": {
        label: model
        for w, h in WIDTH_PAIRS.items()
        for label, model in (
            (f"standard w={2 * w} h={2 * w // HEAD_SIZE}", _standard(2 * w, 2 * w // HEAD_SIZE)),
            (f"fixed p={HEAD_SIZE} w={w} h={h}", _fixed(w, h)),
        )
    },
    # Bhojanapalli et al. (2020), Table 2B and Figure 3b: width 64, 4 heads, the head size alone varied.
    "head_size": {f"fixed p={p} w={WIDTH} h=4": _fixed(WIDTH, 4, p) for p in HEAD_SIZES},
}
# The seed-paired verdicts below the width and head-size tables: (model, partner) pairs, the perplexity gap; the
# head sizes against 16 (standard attention's w/4) and a head larger than the sequence (128 > 64) against one equal to it.
PAIRED = {
    "width": [
        (f"fixed p={HEAD_SIZE} w={w} h={h}", f"standard w={2 * w} h={2 * w // HEAD_SIZE}")
        for w, h in WIDTH_PAIRS.items()
    ],
    "head_size": [
        *((f"fixed p={p} w={WIDTH} h=4", f"fixed p={HEAD_SIZE} w={WIDTH} h=4") for p in HEAD_SIZES[1:]),
        (f"fixed p={HEAD_SIZES[-1]} w={WIDTH} h=4", f"fixed p={SEQUENCE_LENGTH} w={WIDTH} h=4"),
    ],
}


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Where a set of studies reads its data and writes its results.

    name: "sample" (the shipped corpus) or "large" (built by scripts/make_corpus.py).
    overrides: the config overrides selecting the data (and the evaluation batches).
    results: folder of the CSVs and plots. runs: folder of the run directories.
    train: {"rows", "tokens"} of the packed training split (for the passes over it).
    sha256: the corpus' own sha256 (its make_corpus manifest's `corpus_sha256`; "" for the sample or an older build).
    """

    name: str
    overrides: tuple
    results: pathlib.Path
    runs: pathlib.Path
    train: dict
    sha256: str = ""


def _prepared(config_overrides, out, vocabulary=None):
    """Prepares (once) the data of `config_overrides` into `out`; returns its manifest."""
    from concise_attention.training.trainers import prepare_data
    from concise_attention.training.data import shards
    from concise_attention.training.run import configs

    if not (out / shards.MANIFEST).is_file():
        if out.exists():
            shutil.rmtree(out)  # an interrupted preparation: start it again
        overrides = [*COMMON, *config_overrides] + ([f"tokenizer.vocabulary={vocabulary}"] if vocabulary else [])
        prepare_data.prepare(configs.load_config("lm1b_standard_d256", overrides), str(out))
    return shards.read_manifest(str(out))


def _large_vocabulary(corpus_dir, path):
    """WordPiece vocabulary of the large corpus, trained on one training line in VOCABULARY_EVERY."""
    from concise_attention.training.trainers.trainer import VOCABULARY_TRAINING_LINES
    from concise_attention.training.data.pipeline import corpus_splits
    from concise_attention.training.preprocessing.tokenizer import tokenizer_settings
    from concise_attention.training.preprocessing.tokenizer import train_wordpiece
    from concise_attention.training.run import configs

    if not path.is_file():
        config = configs.load_config("lm1b_standard_d256", COMMON)
        sampled = (
            line
            for index, line in enumerate(corpus_splits("text_files", str(corpus_dir))[0]())
            if index % VOCABULARY_EVERY == 0
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        train_wordpiece(
            list(itertools.islice(sampled, VOCABULARY_TRAINING_LINES)),
            config.model.vocab_size,
            path,
            **tokenizer_settings(config),
        )
    return path


def corpus(corpus_dir=None, cache=CACHE):
    """The Corpus of the shipped sample (None) or of a corpus folder built by scripts/make_corpus.py, its
    prepared data, vocabulary and runs in `cache`."""
    if corpus_dir is None:
        # The sample runs read the text pipeline; the same rows, prepared once, give the counts.
        manifest = _prepared(["task.dataset=sample"], cache / "prepared_sample")
        return Corpus(
            "sample",
            ("task.dataset=sample", "training.eval_batches=20"),
            STUDIES_DIR,
            cache / "studies",
            manifest["splits"]["train"],
        )
    corpus_dir = pathlib.Path(corpus_dir).resolve()
    if not (corpus_dir / "manifest.json").is_file() or not (corpus_dir / "heldout").is_dir():
        raise SystemExit(
            f"studies.py: error: --corpus {corpus_dir} is not a corpus built by scripts/make_corpus.py "
            "(no manifest.json or heldout/)"
        )
    prepared = cache / "prepared_large"
    vocabulary = _large_vocabulary(corpus_dir, cache / "large_vocab.txt")
    manifest = _prepared(["task.dataset=text_files", f"task.data_dir={corpus_dir}"], prepared, vocabulary)
    # The whole held-out split is evaluated.
    eval_batches = manifest["splits"]["eval"]["rows"] // 16
    built = json.loads((corpus_dir / "manifest.json").read_text())
    return Corpus(
        "large",
        (
            "task.dataset=prepared",
            f"task.data_dir={prepared}",
            f"tokenizer.vocabulary={prepared / 'vocab.txt'}",
            f"training.eval_batches={eval_batches}",
        ),
        LARGE_STUDIES_DIR,
        cache / "studies_large",
        manifest["splits"]["train"],
        built.get("corpus_sha256", ""),
    )


def _config(corpus, preset, overrides, seed):
    from concise_attention.training.run import configs

    return configs.load_config(preset, [*COMMON, *corpus.overrides, *overrides, f"training.seed={seed}"])


def run_directory(corpus, preset, overrides, seed):
    """One run directory per distinct configuration: a model of two studies is trained once."""
    key = hashlib.sha256(json.dumps([preset, overrides]).encode()).hexdigest()[:12]
    return corpus.runs / f"{key}_seed{seed}"


def _die_with_parent():
    """Worker initializer: a worker gets SIGTERM when the parent dies (Linux), instead of going on
    alone with the runs queued for it (the trainer checkpoints on SIGTERM)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def train_run(corpus, preset, overrides, seed, threads=None):
    """Trains (or resumes, or reads the finished) run; returns its metrics."""
    if threads:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    from concise_attention.training.trainers.trainer import train
    from concise_attention.training.run.checkpoints import Preempted

    config = _config(corpus, preset, overrides, seed)
    run_dir = run_directory(corpus, preset, overrides, seed)
    metrics_path = run_dir / "metrics.json"
    if metrics_path.is_file() and json.loads(metrics_path.read_text())["step"] >= config.training.train_steps:
        return json.loads(metrics_path.read_text())
    start, began = time.perf_counter(), provenance.record()
    try:
        metrics = train(config, run_dir, verbose=0)
    except Preempted:
        os._exit(75)  # SIGTERM (the parent died): the step reached is checkpointed; run the script again
    metrics["seconds"] = time.perf_counter() - start
    metrics.update(provenance.record(since=began))  # date, machine, the commit trained from, clean throughout
    provenance.write(metrics_path, metrics)
    return metrics


def make_row(corpus, study, label, seed, metrics):
    """The CSV row of a finished run: the model, the data seen, the held-out perplexity, where and when."""
    from concise_attention.models.transformer import head_size_of
    from concise_attention.training.run import configs

    preset, overrides = STUDIES[study][label]
    config = _config(corpus, preset, overrides, seed)
    model, training = config.model, config.training
    parameters = configs.count_parameters(config)
    passes = metrics["step"] * training.batch_size / corpus.train["rows"]
    return {
        "study": study,
        "label": label,
        "seed": seed,
        "preset": preset,
        "attention": model.attention["type"],
        "width": model.hidden_size,
        "layers": model.num_layers,
        "heads": model.num_heads,
        "head_size": head_size_of(model),
        "shared_key_dim": model.attention.get("shared_key_dim", ""),
        "admin": model.residual_scaling == "admin",
        "parameters": parameters,
        "non_embedding_parameters": parameters - model.vocab_size * model.hidden_size,
        "steps": metrics["step"],
        "eval_loss": round(metrics["eval_loss"], 5),
        "eval_subword_perplexity": round(metrics["eval_subword_perplexity"], 3),
        "eval_word_perplexity": round(metrics["eval_word_perplexity"], 3),
        "seconds": round(metrics.get("seconds", 0.0), 1),
        "date": metrics.get("date", "unknown"),
        "machine": metrics.get("machine", "unknown"),
        "commit": metrics.get("commit", "unknown"),
        "clean": metrics.get("clean", ""),
        "corpus": corpus.name,
        "corpus_sha256": corpus.sha256,
        "train_split_tokens": corpus.train["tokens"],
        "tokens_seen": round(passes * corpus.train["tokens"]),
        "passes": round(passes, 4),
        "seen_twice": passes > 1,
    }


def write_rows(results, study, rows):
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{study}.csv"
    temporary = path.with_suffix(".csv.tmp")
    with temporary.open("w", newline="") as file:
        # Every row's columns (rows older than a column have none: "unknown").
        writer = csv.DictWriter(
            file, fieldnames=list(dict.fromkeys(key for row in rows for key in row)), restval="unknown"
        )
        writer.writeheader()
        writer.writerows(rows)
    os.replace(temporary, path)


def read_rows(study, results=STUDIES_DIR):
    path = results / f"{study}.csv"
    if not path.is_file():
        return []
    with path.open() as file:
        return list(csv.DictReader(file))


def _mean_by_label(rows):
    import numpy as np

    grouped = {}
    for row in rows:
        grouped.setdefault(row["label"], []).append(row)
    return {
        label: {
            **group[0],
            "perplexity": float(np.mean([float(r["eval_subword_perplexity"]) for r in group])),
            "low": min(float(r["eval_subword_perplexity"]) for r in group),
            "high": max(float(r["eval_subword_perplexity"]) for r in group),
            "seeds": len(group),
        }
        for label, group in grouped.items()
    }


def _save(figure, path):
    temporary = path.with_suffix(".tmp.png")
    figure.savefig(temporary, dpi=110)
    os.replace(temporary, path)


def _commit(row):
    """The short commit a row was measured with, marked where tracked code differed from it ("-": rows measured
    before rows recorded their commit)."""
    head = row.get("commit") or "-"
    return "-" if head in ("-", "unknown") else head[:7] + ("" if row.get("clean") == "True" else " + changes")


def _span(values):
    values = sorted(set(values))
    return values[0] if len(values) == 1 else f"{values[0]} to {values[-1]}"


def caption(study, rows):
    """The data, where and when of the plotted runs, read from the rows themselves."""
    passes = max(float(row["passes"]) for row in rows)
    data = (
        "shipped 31k-word corpus"
        if rows[0]["corpus"] == "sample"
        else f"{int(rows[0]['train_split_tokens']) / 1e6:.0f}M-token corpus held out by document"
    )
    return (
        f"{study}: {data}, {_span(int(row['steps']) for row in rows)} steps of 16 x 64 (at most {passes:.2g} passes); "
        f"{' / '.join(sorted({row['machine'] for row in rows}))}; {_span(row['date'] for row in rows)}"
    )


TREND_BASELINE = "standard w=128 h=8"


def paired_gaps(rows, label, baseline):
    """[(seed, tokens seen, gap %)] of `label` against `baseline` for each seed both have: the gap is
    100 * (perplexity / the baseline's perplexity of the same seed - 1)."""
    runs = {(row["label"], int(row["seed"])): row for row in rows}
    return [
        (
            seed,
            int(row["tokens_seen"]),
            100 * (float(row["eval_subword_perplexity"]) / float(runs[baseline, seed]["eval_subword_perplexity"]) - 1),
        )
        for (name, seed), row in sorted(runs.items())
        if name == label and (baseline, seed) in runs
    ]


def _budget_gaps(rows, label):
    """{budget (steps): [(seed, tokens, gap %)]} of the TREND_STEPS budgets where `label` and TREND_BASELINE share a seed
    (keyed by steps, not tokens: two builds of the corpus give one budget's seeds slightly different token counts)."""
    gaps = {budget: paired_gaps(rows, f"{label} @{budget}", f"{TREND_BASELINE} @{budget}") for budget in TREND_STEPS}
    return {budget: points for budget, points in gaps.items() if points}


def trend(rows, label, steps=TREND_STEPS):
    """The gap of TREND_MODELS' `label` to TREND_BASELINE against tokens: {"points": [(tokens, seed, gap %)], "slope",
    "intercept" (gap % = intercept + slope * log10 tokens, least squares over the seed-paired points), their standard
    errors and covariance, "closes_at" (the tokens where the fitted line reaches 0, when it falls from above; else
    None)}, over the budgets `steps`. The gap is 100 * (perplexity / the baseline's perplexity of the same seed and budget - 1)."""
    import numpy as np

    points = [
        (tokens, seed, gap)
        for budget in steps
        for seed, tokens, gap in paired_gaps(rows, f"{label} @{budget}", f"{TREND_BASELINE} @{budget}")
    ]
    result = {"points": points, "slope": None, "intercept": None, "closes_at": None}
    if len({tokens for tokens, _, _ in points}) < 2 or len(points) < 4:
        return result  # a line through fewer points has no uncertainty
    x, y = np.log10([p[0] for p in points]), np.array([p[2] for p in points])
    (slope, intercept), covariance = np.polyfit(x, y, 1, cov=True)
    result.update(
        slope=float(slope),
        intercept=float(intercept),
        slope_se=float(np.sqrt(covariance[0, 0])),
        intercept_se=float(np.sqrt(covariance[1, 1])),
        covariance=float(covariance[0, 1]),
    )
    if slope < 0 < intercept + slope * x.min():
        result["closes_at"] = float(10 ** (-intercept / slope))
    return result


def _plot_trend(axes, rows):
    import numpy as np

    for (label, _), marker in zip([m for m in TREND_MODELS.items() if m[0] != TREND_BASELINE], "so"):
        fit = trend(rows, label)
        if not fit["points"]:
            continue
        tokens, _, gaps = zip(*fit["points"])
        color = axes.scatter(
            tokens, gaps, marker=marker, label=f"{label} vs {TREND_BASELINE} (paired by seed)"
        ).get_facecolor()[0]
        budgets = _budget_gaps(
            rows, label
        ).values()  # the seeds' mean at each budget, joined: where the straight line misleads, this shows it
        axes.plot(
            [np.mean([t for _, t, _ in points]) for points in budgets],
            [np.mean([g for _, _, g in points]) for points in budgets],
            color=color,
            linestyle=":",
            linewidth=1,
            label="mean over seeds",
        )
        if fit["slope"] is not None:
            x = np.linspace(np.log10(min(tokens)) - 0.3, np.log10(max(tokens)) + 1.0, 50)
            line = fit["intercept"] + fit["slope"] * x
            spread = np.sqrt(fit["intercept_se"] ** 2 + (x * fit["slope_se"]) ** 2 + 2 * x * fit["covariance"])
            axes.plot(
                10**x,
                line,
                color=color,
                label=f"fit: {fit['slope']:+.2f} ± {fit['slope_se']:.2f} % per decade of tokens",
            )
            axes.fill_between(10**x, line - spread, line + spread, color=color, alpha=0.2)
    axes.axhline(0, color="black", linewidth=0.8)
    axes.set_xscale("log")
    axes.set_xlabel("tokens seen per run (one pass at most)")
    axes.set_ylabel("perplexity gap to the standard model (%)")
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:  # no pair measured yet: no legend
        axes.legend(fontsize=8)


def _errorbars(axes, series, x, name, marker, note=None):
    """One line of mean perplexities over seeds at `x`, with min-max bars; `note(point)` labels each point."""
    y = [p["perplexity"] for p in series]
    errors = [[p["perplexity"] - p["low"] for p in series], [p["high"] - p["perplexity"] for p in series]]
    axes.errorbar(x, y, yerr=errors, marker=marker, capsize=3, label=name)
    for p, xi, yi in zip(series, x, y) if note else ():
        axes.annotate(note(p), (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")


def _plot_pairs(axes, study, points):
    """head_size: perplexity against the head size at width 64, 4 heads (the paper's Figure 3b); width: the fixed
    model at w and standard attention at 2w against their (matched) parameters, one line each."""
    if study == "head_size":
        series = sorted(points.values(), key=lambda p: int(p["head_size"]))
        _errorbars(
            axes,
            series,
            [int(p["head_size"]) for p in series],
            f"fixed head size, width {WIDTH}, 4 heads",
            "s",
            lambda p: f"{int(p['non_embedding_parameters']) / 1e3:.0f}k",
        )
        axes.axvline(
            SEQUENCE_LENGTH,
            color="grey",
            linestyle=":",
            label="the sequence length (a head this size can express any attention pattern)",
        )
        axes.set_xscale("log", base=2)
        axes.set_xlabel("head size (annotated: non-embedding parameters)")
    else:
        for attention, name, marker in (
            ("fixed", f"fixed head size {HEAD_SIZE} at width w", "s"),
            ("standard", f"standard attention at width 2w (head size {HEAD_SIZE})", "o"),
        ):
            series = sorted((p for p in points.values() if p["attention"] == attention), key=lambda p: int(p["width"]))
            _errorbars(
                axes,
                series,
                [int(p["parameters"]) / 1e3 for p in series],
                name,
                marker,
                lambda p: f"w{p['width']} h{p['heads']}",
            )
        axes.set_xscale("log")
        axes.set_xlabel("parameters (thousands; each pair matched within 2%)")
    axes.set_ylabel("held-out perplexity per subword")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)


def _plot_heads(plt, points):
    """The heads study's two panels: perplexity against parameters and against the head count."""
    standard_w = sorted(
        (p for p in points.values() if p["attention"] == "standard" and int(p["width"]) == WIDTH),
        key=lambda p: int(p["heads"]),
    )
    fixed_w = [p for p in points.values() if p["attention"] == "fixed"] + [
        p for p in standard_w if int(p["head_size"]) == HEAD_SIZE
    ]
    fixed_w.sort(key=lambda p: int(p["heads"]))
    standard_p = sorted(
        (p for p in points.values() if p["attention"] == "standard" and int(p["head_size"]) == HEAD_SIZE),
        key=lambda p: int(p["width"]),
    )
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for series, name, marker in (
        (standard_p, f"standard, head size {HEAD_SIZE}, width {WIDTH}..128", "o"),
        (fixed_w, f"fixed head size {HEAD_SIZE}, width {WIDTH}, more heads", "s"),
    ):
        _errorbars(
            axes[0],
            series,
            [int(p["non_embedding_parameters"]) / 1e3 for p in series],
            name,
            marker,
            lambda p: f"w{p['width']} h{p['heads']}",
        )
    axes[0].set_xlabel("non-embedding parameters (thousands)")
    axes[0].set_ylabel("held-out perplexity per subword")
    axes[0].set_title("Perplexity vs parameters (their Figure 1)", fontsize=10)
    for series, name, marker in (
        (standard_w, f"standard, width {WIDTH} (head size {WIDTH}/h)", "o"),
        (fixed_w, f"fixed head size {HEAD_SIZE}, width {WIDTH}", "s"),
    ):
        _errorbars(axes[1], series, [int(p["heads"]) for p in series], name, marker)
    axes[1].set_xscale("log", base=2)
    axes[1].set_xlabel("number of heads")
    axes[1].set_title("Perplexity vs heads (their Figure 3a)", fontsize=10)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return figure


def _plot_bars(plt, points):
    """A study's perplexities as horizontal bars with their ranges."""
    ordered = sorted(points.values(), key=lambda p: (int(p["width"]), -int(p["layers"]), p["label"]))
    figure, axes = plt.subplots(figsize=(8, 0.5 + 0.45 * len(ordered) + 1.2))
    labels = [p["label"] for p in ordered]
    values = [p["perplexity"] for p in ordered]
    errors = [[p["perplexity"] - p["low"] for p in ordered], [p["high"] - p["perplexity"] for p in ordered]]
    axes.barh(labels, values, xerr=errors, capsize=3, color="tab:blue", alpha=0.8)
    for index, p in enumerate(ordered):
        axes.annotate(
            f"{p['perplexity']:.1f}  ({int(p['parameters']) / 1e3:.0f}k params)",
            (p["high"], index),
            xytext=(6, -3),
            textcoords="offset points",
            fontsize=8,
        )
    axes.set_xlabel("held-out perplexity per subword")
    axes.invert_yaxis()
    axes.grid(alpha=0.3, axis="x")
    axes.set_xlim(0, max(values) * 1.35)
    return figure


def plot(study, rows, results=STUDIES_DIR):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return
    points = _mean_by_label(rows)
    if study == "tokens":
        figure, axes = plt.subplots(figsize=(8, 4.5))
        _plot_trend(axes, rows)
    elif study == "heads":
        figure = _plot_heads(plt, points)
    elif study in ("head_size", "width"):
        figure, axes = plt.subplots(figsize=(8, 4.5))
        _plot_pairs(axes, study, points)
    else:
        figure = _plot_bars(plt, points)
    figure.suptitle(textwrap.fill(caption(study, rows), 120), fontsize=9)
    figure.tight_layout()
    _save(figure, results / f"{study}.png")
    plt.close(figure)


def markdown(study, rows):
    """The docs/results.md table of a study: one line per configuration, mean (min-max) over seeds, with
    the data each run saw (steps, tokens, whether a token was seen twice) and where and when."""
    import numpy as np

    points = sorted(
        _mean_by_label(rows).values(),
        key=lambda p: (
            p["attention"] != "standard",
            int(p["width"]),
            int(p["heads"]),
            int(p["head_size"]),
            int(p["steps"]),
            p["label"],
        ),
    )
    lines = [
        "| model | attention | width | layers x heads | head size | D~k | parameters (non-embedding) | seeds | "
        "held-out perplexity per subword (min-max) | per word | steps | tokens seen | seen twice | minutes per run | date | machine | commit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        group = [r for r in rows if r["label"] == p["label"]]
        spread = f" ({p['low']:.1f}-{p['high']:.1f})" if p["seeds"] > 1 else ""
        minutes = sum(float(r["seconds"]) for r in group) / p["seeds"] / 60
        word = float(np.mean([float(r["eval_word_perplexity"]) for r in group]))
        tokens = _span(f"{int(r['tokens_seen']):,}" for r in group)
        twice = f"yes ({float(group[0]['passes']):.0f} passes)" if group[0]["seen_twice"] == "True" else "no"
        lines.append(
            f"| {p['label']} | {p['attention']}{' + Admin' if p['admin'] == 'True' else ''} | {p['width']} | "
            f"{p['layers']} x {p['heads']} | {p['head_size']} | {p['shared_key_dim'] or '-'} | "
            f"{int(p['parameters']):,} ({int(p['non_embedding_parameters']):,}) | {p['seeds']} | {p['perplexity']:.2f}{spread} | "
            f"{word:,.0f} | {_span(r['steps'] for r in group)} | {tokens} | {twice} | "
            f"{minutes:.1f} | {_span(r['date'] for r in group)} | {' / '.join(sorted({r['machine'] for r in group}))} | "
            f"{' / '.join(sorted({_commit(r) for r in group}))} |"
        )
    if study == "tokens":
        lines += ["", *(_trend_verdict(rows, label) for label in TREND_MODELS if label != TREND_BASELINE)]
    if study in PAIRED:
        lines += ["", *(_paired_verdict(rows, label, baseline) for label, baseline in PAIRED[study])]
    return "\n".join(lines)


def _paired_verdict(rows, label, baseline):
    gaps = [gap for _, _, gap in paired_gaps(rows, label, baseline)]
    if not gaps:
        return f"- {label} against {baseline}: no seed measured for both."
    side = "behind at every seed" if min(gaps) > 0 else "ahead at every seed" if max(gaps) < 0 else "on both sides"
    return (
        f"- {label} against {baseline}: perplexity {', '.join(f'{gap:+.1f}%' for gap in gaps)} seed by seed "
        f"(mean {sum(gaps) / len(gaps):+.1f}%), {side}."
    )


def _trend_verdict(rows, label):
    import numpy as np

    fit = trend(rows, label)
    if fit["slope"] is None:
        return f"- {label}: {len(fit['points'])} paired points, too few for a trend."
    where = (
        f"the line reaches 0 at about {fit['closes_at']:.2g} tokens (extrapolated)"
        if fit["closes_at"]
        else "the line does not fall to 0 from above"
    )
    means = {budget: np.mean([gap for _, _, gap in points]) for budget, points in _budget_gaps(rows, label).items()}
    line = (
        f"- {label} against {TREND_BASELINE}: gap {fit['intercept']:+.1f} % {fit['slope']:+.2f} ± {fit['slope_se']:.2f} % "
        f"per decade of tokens ({len(fit['points'])} paired points); {where}. Mean gap at "
        + ", ".join(f"{budget} steps {mean:+.1f}%" for budget, mean in means.items())
    )
    recent = trend(rows, label, list(means)[-2:]) if len(means) > 2 else {"slope": None}
    if recent["slope"] is not None:
        flat = abs(recent["slope"]) < 2 * recent["slope_se"]
        line += f"; over the last two budgets alone {recent['slope']:+.2f} ± {recent['slope_se']:.2f} % per decade" + (
            ", not distinguishable from no change (within two standard errors)"
            if flat
            else f", reaching 0 at about {recent['closes_at']:.2g} tokens"
            if recent["closes_at"]
            else ""
        )
    return line + "."


def _pending(corpus, seeds, studies):
    """{run directory: [(study, label, seed), ...]} of the runs with no CSV row yet, every seed of a model before
    the next model (the tokens study's smaller budgets first: a trend with its seed pairs before the larger runs)."""
    pending = {}
    for study in studies:
        done = {(row["label"], int(row["seed"])) for row in read_rows(study, corpus.results)}
        for label, (preset, overrides) in STUDIES[study].items():
            for seed in seeds:
                if (label, seed) not in done:
                    pending.setdefault(run_directory(corpus, preset, overrides, seed), []).append((study, label, seed))
    return pending


def _record(corpus, uses, metrics):
    for study, label, seed in uses:
        row = make_row(corpus, study, label, seed, metrics)
        rows = [r for r in read_rows(study, corpus.results) if (r["label"], int(r["seed"])) != (label, seed)] + [row]
        write_rows(corpus.results, study, rows)
        plot(study, read_rows(study, corpus.results), corpus.results)  # as strings, like every row read back
        print(
            f"{study:13s} {label:40s} seed {seed}: perplexity {row['eval_subword_perplexity']:8.2f} "
            f"({row['parameters']:,} params, {row['seconds']:.0f} s, {row['passes']:.3g} passes)",
            flush=True,
        )


def _train_all(arguments, jobs):
    """Yields (key, metrics) of `train_run(*arguments[key])` for every key as each run finishes, `jobs` at a
    time, each process on cpu_count / jobs threads."""
    if jobs == 1:
        for key, argument in arguments.items():
            yield key, train_run(*argument)
        return
    threads = max(1, (os.cpu_count() or 1) // jobs)
    with concurrent.futures.ProcessPoolExecutor(
        jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_die_with_parent
    ) as pool:
        futures = {pool.submit(train_run, *argument, threads): key for key, argument in arguments.items()}
        for future in concurrent.futures.as_completed(futures):
            yield futures[future], future.result()


def canary(study, label, prepared):
    """Held-out loss of the model of `label`, cut to CANARY_OVERRIDES, after CANARY_STEPS steps (seed 0) on
    the shipped sample prepared into `prepared` (once): what today's code gives the study, to 6 decimals."""
    import tempfile

    from concise_attention.training.trainers.trainer import train
    from concise_attention.training.run import configs

    manifest = _prepared(["task.dataset=sample"], pathlib.Path(prepared))
    preset, overrides = STUDIES[study][label]
    config = configs.load_config(
        preset,
        [
            *COMMON,
            *overrides,
            "task.dataset=prepared",
            f"task.data_dir={prepared}",
            f"tokenizer.vocabulary={pathlib.Path(prepared) / 'vocab.txt'}",
            f"training.eval_batches={min(4, manifest['splits']['eval']['rows'] // 16)}",
            f"training.train_steps={CANARY_STEPS}",
            f"training.steps_per_epoch={CANARY_STEPS}",
            "training.warmup_steps=5",
            "training.steps_per_execution=5",
            *CANARY_OVERRIDES,
            "training.seed=0",
        ],
    )
    with tempfile.TemporaryDirectory() as run_dir:
        return round(train(config, run_dir, verbose=0)["eval_loss"], 6)


def canary_losses(study, prepared, losses):
    """{label: `canary` loss} of the CANARIES of `study`; `losses` ({model: loss}) keeps those trained
    already, so that a model of two tables is trained once."""
    keys = {label: json.dumps(STUDIES[study][label]) for label in CANARIES[study]}
    for label, key in keys.items():
        if key not in losses:
            losses[key] = canary(study, label, prepared)
    return {label: losses[key] for label, key in keys.items()}


def run_studies(corpus, seeds, studies, jobs):
    """Trains every pending run and records each as it finishes; a model shared by two studies is trained once."""
    pending = _pending(corpus, seeds, studies)
    first = {run_dir: uses[0] for run_dir, uses in pending.items()}
    arguments = {run_dir: (corpus, *STUDIES[study][label], seed) for run_dir, (study, label, seed) in first.items()}
    for run_dir, metrics in _train_all(arguments, jobs):
        _record(corpus, pending[run_dir], metrics)


def same_build(row, corpus):
    """Whether a results row was trained on this build of the corpus: its corpus_sha256 where it records one, else
    (rows written before it) its training split's token count, which two builds of different packages do not share."""
    if corpus.name == "sample":
        return True
    recorded = row.get("corpus_sha256", "unknown")
    if recorded not in ("", "unknown"):
        return recorded == corpus.sha256
    return int(row["train_split_tokens"]) == corpus.train["tokens"]


def same_build_reference(row, previous, corpus):
    """(perplexity, where) that a re-run of the table's first `row` on `corpus` is judged against: the row itself when
    it was trained on this build; else an earlier check's re-run of it on this build (`previous`, its check.json entry,
    committed with the build's manifest); else None (another build: the difference is cross-build variance)."""
    if same_build(row, corpus):
        return float(row["eval_subword_perplexity"]), "table"
    if (
        previous.get("corpus_sha256")
        and previous["corpus_sha256"] == corpus.sha256
        and (previous.get("label"), previous.get("seed")) == (row["label"], int(row["seed"]))
    ):
        return float(previous["rerun"]), f"check.json re-run of {previous['date']} at {previous['commit'][:7]}"
    return None


def check_tables(corpus, studies, jobs):
    """Re-runs the first committed row of each table with today's code, `corpus` prepared from scratch
    (main() gives it a scratch cache), and compares its held-out perplexity with the committed one; records
    each in RESULTS/check.json as it is known, then the CANARIES' losses. A row trained on another build is judged
    against an earlier re-run on this build where check.json holds one (`same_build_reference`). Returns whether
    every table reproduced within CHECK_TOLERANCE (relative)."""
    from concise_attention.training.files import write_bytes_atomically

    committed = {study: read_rows(study, corpus.results)[0] for study in studies}
    arguments = {study: (corpus, *STUDIES[study][row["label"]], int(row["seed"])) for study, row in committed.items()}
    path = corpus.results / "check.json"
    record = json.loads(path.read_text()) if path.is_file() else {}
    for study, metrics in _train_all(arguments, jobs):
        row = committed[study]
        rerun = make_row(corpus, study, row["label"], int(row["seed"]), metrics)
        before, now = float(row["eval_subword_perplexity"]), rerun["eval_subword_perplexity"]
        relative = now / before - 1
        same_corpus, reference = same_build(row, corpus), same_build_reference(row, record.get(study, {}), corpus)
        to_reference = None if reference is None else now / reference[0] - 1
        record[study] = {
            "label": row["label"],
            "seed": int(row["seed"]),
            "committed": before,
            "committed_commit": row.get("commit", "unknown"),
            "rerun": now,
            "relative": round(relative, 5),
            # like with like: on another build of the corpus the difference is cross-build variance, not staleness
            "same_corpus": same_corpus,
            "reference": None if reference is None else {"perplexity": reference[0], "from": reference[1]},
            "relative_to_reference": None if reference is None else round(to_reference, 5),
            "reproduced": None if reference is None else abs(to_reference) <= CHECK_TOLERANCE,
            "cross_build_relative": None if same_corpus else round(relative, 5),
            "committed_corpus_sha256": row.get("corpus_sha256", ""),
            "corpus_sha256": corpus.sha256,
            "committed_train_split_tokens": int(row["train_split_tokens"]),
            "train_split_tokens": corpus.train["tokens"],
            **{key: rerun[key] for key in ("date", "machine", "commit", "clean", "seconds")},
        }
        write_bytes_atomically(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
        verdict = (
            f"{'reproduced' if record[study]['reproduced'] else 'STALE'} ({reference[1]}: {reference[0]:.3f})"
            if reference
            else "another corpus build: cross-build difference"
        )
        print(
            f"{study:13s} {row['label']:40s} seed {row['seed']}: committed {before:.3f}, today {now:.3f} "
            f"({100 * relative:+.2f}%): {verdict}",
            flush=True,
        )
    losses = {}
    for study in committed:
        record[study]["canaries"] = canary_losses(study, corpus.runs.parent / "prepared_sample", losses)
    write_bytes_atomically(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return all(record[study]["reproduced"] is not False for study in committed)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", choices=[*STUDIES, "all"], default="all")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--corpus", help="a corpus folder built by `python scripts/make_corpus.py` (default: the shipped sample)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="runs trained at once, each on cpu_count / jobs threads")
    parser.add_argument("--plot-only", action="store_true", help="redraw the plots from the CSVs, train nothing")
    parser.add_argument(
        "--markdown", action="store_true", help="print the docs/results.md tables from the CSVs, train nothing"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="re-run each table's first row from scratch with today's code and "
        "compare its perplexity with the committed one (results in check.json; exit 1 if a table is stale)",
    )
    args = parser.parse_args()
    studies = list(STUDIES) if args.study == "all" else [args.study]
    results = LARGE_STUDIES_DIR if args.corpus else STUDIES_DIR
    if args.markdown or args.plot_only:
        for study in studies:
            rows = read_rows(study, results)
            if args.markdown:
                print(f"\n{study}:\n{markdown(study, rows)}" if rows else f"\n{study}: no results yet")
            elif rows:
                plot(study, rows, results)
        return
    if args.check:
        if args.study == "all":  # the tables there are (a study not run yet has none to check)
            studies = [study for study in studies if read_rows(study, results)]
        missing = [study for study in studies if not read_rows(study, results)]
        if missing:  # before anything is prepared or trained
            print(f"studies.py: error: --check: no {', '.join(missing)} table in {results}", file=sys.stderr)
            raise SystemExit(2)
        scratch = CACHE / f"check_{'large' if args.corpus else 'sample'}"
        shutil.rmtree(scratch, ignore_errors=True)  # from scratch: nothing prepared or trained before is reused
        raise SystemExit(0 if check_tables(corpus(args.corpus, scratch), studies, args.jobs) else 1)
    run_studies(corpus(args.corpus), args.seeds, studies, args.jobs)


if __name__ == "__main__":
    main()
