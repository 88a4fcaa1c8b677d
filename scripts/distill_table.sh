#!/usr/bin/env bash
# Issue 22's table of students, the same data, steps and seeds for each, differences paired by seed:
#   (a) distill_minilm_d192_fixed     width 192, fixed head size 64 with 6 heads, feed-forward 384
#   (b) distill_minilm_d192_standard  width 192, standard attention (6 heads of 32), feed-forward 768: (a)'s parameters
#   (c) distill_minilm_d384_standard  width 384, the teacher's shape, from a random start: the papers' "2w"
#   (d) distill_minilm_d128_fixed     width 128, 4 layers, fixed head size 64 with 6 heads, feed-forward 256
#   (e) distill_minilm_d192_fixed_random  (a) from a random start, as (c) starts: (e) - (c) is the papers' claim
#                                     with the same kind of start ((a) - (c) mixes in the teacher's initialisation)
#
#   bash scripts/distill_table.sh RUNS_DIR STEPS [SEED ...]    # seeds 0 1 by default; run from the folder
#                                                              # that holds `corpus` and `general`
# trains every student at every seed (seed by seed, so that a partial table is a whole one for the first
# seeds) as RUNS_DIR/{a,b,c,d}_s{SEED}, each resumable (the same command again continues where it stopped),
# measures each run as soon as it is trained (benchmarks/distill_eval.py, beside the teacher and the
# baselines: the throughput ratio is to the teacher of the same measurement) into RESULTS/{label}_s{seed}.json,
# then prints the table of every file in RESULTS, the paired differences a - b, a - c, e - c, a - e, d - a seed by seed,
# and the README's table: each student's mean over its seeds and each pair's mean difference.
# RESULTS (default benchmarks/results/distill_table_STEPS) is committed: a run measured there is not trained
# or measured again, so that the table grows across machines and sessions (the same command, the same seed,
# gives the same weights bit for bit). Environment: RESULTS, STUDENTS replaces the list ("label:config ..."),
# PYTHON the interpreter (default: python), and any --set KEY=VALUE after the seeds goes to every run (give
# such runs their own RESULTS). A trained run (RUN/metrics.json) is not trained again: another STEPS wants
# another RUNS_DIR.
set -euo pipefail

[ $# -ge 2 ] || { echo "usage: $0 RUNS_DIR STEPS [SEED ...] [--set KEY=VALUE ...]" >&2; exit 2; }
RUNS=$1 STEPS=$2
shift 2
# The table was measured with dropout 0.1 in every student, 150,000 training texts and a peak learning rate of
# 5e-4 (the configs' settings until 2026-11-27, 2026-11-28 and 2026-11-28; the shipped recipe now trains without
# dropout on 300,000 at 1e-3, docs/distillation.md): pinned here so that the same command gives the same runs.
SEEDS=() SETS=(--set model.dropout=0.1 --set model.attention_dropout=0.1 --set task.train_texts=150000 --set training.learning_rate=5.0e-4)
while [ $# -gt 0 ]; do
    case $1 in
        --set) [ $# -ge 2 ] || { echo "$0: --set needs KEY=VALUE" >&2; exit 2; }; SETS+=(--set "$2"); shift 2 ;;
        *) SEEDS+=("$1"); shift ;;
    esac
done
[ ${#SEEDS[@]} -gt 0 ] || SEEDS=(0 1)
STUDENTS=(${STUDENTS:-a:distill_minilm_d192_fixed b:distill_minilm_d192_standard d:distill_minilm_d128_fixed e:distill_minilm_d192_fixed_random c:distill_minilm_d384_standard})
PYTHON=${PYTHON:-python}
HERE=$(cd "$(dirname "$0")/.." && pwd)

RESULTS=${RESULTS:-$HERE/benchmarks/results/distill_table_$STEPS}
mkdir -p "$RESULTS"
for seed in "${SEEDS[@]}"; do
    for student in "${STUDENTS[@]}"; do
        label=${student%%:*} config=${student#*:}
        run="$RUNS/${label}_s${seed}" measured="$RESULTS/${label}_s${seed}.json"
        [ -f "$measured" ] && continue  # trained and measured already, here or in an earlier session
        [ -f "$run/metrics.json" ] || "$PYTHON" -m concise_attention.cli.train --config "$config" --run-dir "$run" \
            --set training.seed="$seed" --set training.train_steps="$STEPS" ${SETS[@]+"${SETS[@]}"}
        "$PYTHON" "$HERE/benchmarks/distill_eval.py" --runs "$run" --data-dir corpus --out "$measured"
    done
done
"$PYTHON" "$HERE/benchmarks/distill_eval.py" --markdown "$RESULTS"/*.json --paired a b --paired a c --paired e c --paired a e --paired d a
