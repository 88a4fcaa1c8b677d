#!/usr/bin/env bash
# The heads study at the LM1B shape of Bhojanapalli et al. (Figure 1: 6 layers, sequence 256,
# vocabulary 32k): standard attention at width 256, 384 and 512 against fixed head size 32 at
# width 256 with 16, 32 and 70 heads (the presets' parameter counts: 12.9M, 20.6M, 29.0M against
# 14.5M, 17.7M, 25.2M), trained from the same prepared shards of the corpus scripts/make_corpus.py
# builds, on a GPU machine that has JAX and no TensorFlow.
#
#   # 1. on a CPU machine with this package installed (TensorFlow): tokenise and pack once
#   bash scripts/gpu_heads_study.sh prepare corpus prepared_lm1b
#   python scripts/prepared_archive.py pack prepared_lm1b lm1b.tar.xz     # 29 MB instead of 380
#   # 2. copy lm1b.tar.xz and this repository to the GPU machine (numpy, keras, jax), then
#   python scripts/prepared_archive.py unpack lm1b.tar.xz prepared_lm1b  # checks every shard's hash
#   bash scripts/gpu_heads_study.sh train prepared_lm1b runs_lm1b 20000 [--set KEY=VALUE ...]
#   # 3. every run's settings, epoch logs (held-out loss per epoch) and final metrics in one file, and
#   #    provenance.json beside it (the commit the runs trained from, whether the tree was clean, date, GPU)
#   bash scripts/gpu_heads_study.sh collect runs_lm1b study.json
#
# Every run is resumable (run the same command again); each writes RUN/metrics.json with the
# held-out perplexity per subword and per word. The presets train in mixed_bfloat16. The
# --set overrides go to every run (a short budget wants, e.g., training.warmup_steps scaled).
# Environment: PRESETS (space-separated) replaces the list below; JOBS=N trains N runs at once
# on the one GPU (small models leave most of a GPU idle; with N > 1 each run takes GPU memory as
# it needs it instead of JAX's default 75%: at batch 64 the 70-head model alone needs ~40 GB);
# TRAIN_SECONDS stops every run after that many seconds (a run keeps its last epoch's
# checkpoint, whose logs `collect` reads: the runs are then compared at the last epoch all reached).
set -euo pipefail

DEFAULT_PRESETS=(lm1b_standard_d256 lm1b_standard_d384 lm1b_standard_d512
                 lm1b_fixed_d256_p32_h16 lm1b_fixed_d256_p32_h32 lm1b_fixed_d256_p32_h70)
PRESETS=(${PRESETS:-${DEFAULT_PRESETS[*]}})
JOBS=${JOBS:-1}
TRAIN_SECONDS=${TRAIN_SECONDS:-0}

usage() {
    echo "usage: $0 prepare CORPUS_DIR PREPARED_DIR | train PREPARED_DIR RUNS_DIR STEPS [--set KEY=VALUE ...]" \
         "| collect RUNS_DIR OUT_JSON | provenance RUNS_DIR" >&2
    exit 2
}

import_checkout() {
    # This repository is the package `concise_attention`; not installed here (no TensorFlow), it is
    # imported through a folder that holds a link of that name.
    package_parent="$(mktemp -d)"
    trap 'rm -rf "$package_parent"' EXIT
    ln -s "$(cd "$(dirname "$0")/.." && pwd)" "$package_parent/concise_attention"
    export PYTHONPATH="$package_parent${PYTHONPATH:+:$PYTHONPATH}"
}

record_provenance() {  # RUNS_DIR: RUNS_DIR/provenance.json, the code the runs train from, where and when
    # This checkout's own git, read as every results row reads it (benchmarks/provenance.py: tracked files decide
    # "clean"); a copy of the tree without .git (a lent GPU machine's) takes its commit from the launcher:
    # STUDY_COMMIT=$(git rev-parse HEAD) [STUDY_CLEAN=true|false]. Training again from another commit (a resumed
    # study) adds it under "later".
    python3 - "$(cd "$(dirname "$0")/.." && pwd -P)" "$1/provenance.json" <<'PYTHON'
import json, os, re, subprocess, sys, time
repo, out = sys.argv[1:]
sys.path.insert(0, os.path.join(repo, "benchmarks"))
import provenance  # the standard library only
commit, clean = provenance.commit()
if commit != "unknown":
    clean = str(clean).lower()
else:
    commit, clean = os.environ.get("STUDY_COMMIT", "unknown"), os.environ.get("STUDY_CLEAN", "unknown")
    if commit != "unknown" and not re.fullmatch(r"[0-9a-f]{40}", commit):
        print(f"STUDY_COMMIT must be a full 40-character commit hash. Received: STUDY_COMMIT={commit!r}", file=sys.stderr)
        sys.exit(2)
try:
    gpus = [line.split(" (UUID")[0] for line in subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout.splitlines()]
except (OSError, subprocess.CalledProcessError):
    gpus = []
record = {"commit": commit, "clean": clean, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
          "device": "; ".join(gpus) or "unknown"}
if os.path.exists(out):
    first = json.load(open(out))
    if record["commit"] == first["commit"]:
        sys.exit(0)
    record = {**first, "later": first.get("later", []) + [record]}
with open(f"{out}.tmp-{os.getpid()}", "w") as file:
    json.dump(record, file, indent=1)
os.replace(f"{out}.tmp-{os.getpid()}", out)
PYTHON
}

train_one() {  # PRESET PREPARED_DIR RUNS_DIR STEPS [--set ...]
    local preset=$1 data=$2 runs=$3 steps=$4
    shift 4
    timeout --signal=TERM "$TRAIN_SECONDS" env KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE="$preallocate" \
        python3 -m concise_attention.training.backends.shard_trainer --config "$preset" --data "$data" \
        --run-dir "$runs/$preset" --set "training.train_steps=$steps" --set "tokenizer.vocabulary=$data/vocab.txt" \
        "$@" --quiet >"$runs/$preset.log" 2>&1 || echo "$preset: stopped with status $? (see $runs/$preset.log)" >&2
}

case "${1:-}" in
    prepare)
        [[ $# -eq 3 ]] || usage
        concise-prepare-data --config lm1b_standard_d256 --out "$3" \
            --set task.dataset=text_files --set "task.data_dir=$2"
        ;;
    train)
        [[ $# -ge 4 && $4 =~ ^[1-9][0-9]*$ && $JOBS =~ ^[1-9][0-9]*$ && $TRAIN_SECONDS =~ ^[0-9]+$ ]] || usage
        import_checkout
        mkdir -p "$3"
        record_provenance "$3"
        preallocate=$( ((JOBS == 1)) && echo true || echo false)
        data=$2 runs=$3 steps=$4
        shift 4
        running=0
        for preset in "${PRESETS[@]}"; do
            train_one "$preset" "$data" "$runs" "$steps" "$@" &
            running=$((running + 1))
            if ((running >= JOBS)); then wait -n || true; running=$((running - 1)); fi
        done
        wait
        ;;
    provenance)  # what `train` records first; for runs started otherwise
        [[ $# -eq 2 && -d $2 ]] || usage
        record_provenance "$2"
        ;;
    collect)
        [[ $# -eq 3 ]] || usage
        python3 - "$2" "$3" <<'PYTHON'
import json, os, pathlib, sys
import numpy as np
runs, study = pathlib.Path(sys.argv[1]), {}
for run in sorted(path for path in runs.iterdir() if (path / "config.json").exists()):
    entry = {"config": json.loads((run / "config.json").read_text())}
    if (run / "metrics.json").exists():
        entry["metrics"] = json.loads((run / "metrics.json").read_text())
    elif (run / "checkpoint" / "state.npz").exists():
        with np.load(run / "checkpoint" / "state.npz", allow_pickle=False) as saved:
            entry["history"] = json.loads(str(saved["history"]))
    study[run.name] = entry
out = pathlib.Path(sys.argv[2])
written, provenance = {out: json.dumps(study, indent=1)}, out.with_name("provenance.json")
if (runs / "provenance.json").exists():  # which code trained them: beside the study, for the report
    written[provenance] = (runs / "provenance.json").read_text()
elif provenance.exists():  # another study's: not these runs'
    provenance.unlink()
for path, text in written.items():
    temporary = path.with_name(f"{path.name}.tmp-{os.getpid()}")  # rewritten while runs train: never half-written
    temporary.write_text(text)
    os.replace(temporary, path)
print(f"{len(study)} runs -> {sys.argv[2]}")
PYTHON
        ;;
    *)
        usage
        ;;
esac
