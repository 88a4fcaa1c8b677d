#!/usr/bin/env bash
# The heads study at the LM1B shape of Bhojanapalli et al. (Figure 1: 6 layers, sequence 256,
# vocabulary 32k): standard attention at width 256, 384 and 512 against fixed head size 32 at
# width 256 with 16, 32 and 70 heads (the presets' parameter counts: 12.9M, 20.6M, 29.0M against
# 14.5M, 17.7M, 25.2M), trained from the same prepared shards of the corpus training.make_corpus
# builds, on a GPU machine that has JAX and no TensorFlow.
#
#   # 1. on a CPU machine with this package installed (TensorFlow): tokenise and pack once
#   bash scripts/gpu_heads_study.sh prepare corpus prepared_lm1b
#   # 2. copy prepared_lm1b/ and this repository to the GPU machine (numpy, keras, jax), then
#   bash scripts/gpu_heads_study.sh train prepared_lm1b runs_lm1b 20000
#
# Every run is resumable (run the same command again); each writes RUN/metrics.json with the
# held-out perplexity per subword and per word. The presets train in mixed_bfloat16.
set -euo pipefail

PRESETS=(lm1b_standard_d256 lm1b_standard_d384 lm1b_standard_d512
         lm1b_fixed_d256_p32_h16 lm1b_fixed_d256_p32_h32 lm1b_fixed_d256_p32_h70)

usage() {
    echo "usage: $0 prepare CORPUS_DIR PREPARED_DIR | train PREPARED_DIR RUNS_DIR STEPS" >&2
    exit 2
}

case "${1:-}" in
    prepare)
        [[ $# -eq 3 ]] || usage
        concise-prepare-data --config lm1b_standard_d256 --out "$3" \
            --set task.dataset=text_files --set "task.data_dir=$2"
        ;;
    train)
        [[ $# -eq 4 && $4 =~ ^[1-9][0-9]*$ ]] || usage
        # This repository is the package `concise_attention`; not installed here (no TensorFlow), it is
        # imported through a folder that holds a link of that name.
        package_parent="$(mktemp -d)"
        trap 'rm -rf "$package_parent"' EXIT
        ln -s "$(cd "$(dirname "$0")/.." && pwd)" "$package_parent/concise_attention"
        export PYTHONPATH="$package_parent${PYTHONPATH:+:$PYTHONPATH}"
        for preset in "${PRESETS[@]}"; do
            KERAS_BACKEND=jax python -m concise_attention.training.shard_trainer --config "$preset" --data "$2" \
                --run-dir "$3/$preset" --set "training.train_steps=$4" --set "tokenizer.vocabulary=$2/vocab.txt" --quiet
        done
        ;;
    *)
        usage
        ;;
esac
