#!/usr/bin/env bash
# Flash attention's default forward and backward in several source trees, side by side in one device call: each
# tree's frost first on PYTHONPATH, the trees alternated ROUNDS times (default 2) so that the machine's drift falls
# on all of them, then the flash kernels' GPU tests of every tree after the first (its own tests, where the tree has
# them). A tree is a folder holding frost/ (and tests/): make one from a branch with
#   mkdir -p .data/trees/NAME && git archive BRANCH frost tests/conftest.py tests/accel pyproject.toml \
#       | tar -x -C .data/trees/NAME && rm .data/trees/NAME/frost/data/cifar10_sample.npz   (64 MiB a call)
# and carry .data/trees to the device machine.
# Results in OUTDIR (flash_ab_{forward,backward}_NAME-ROUND.json, tests_NAME.txt).
# Usage: [ROUNDS=2] [LENGTHS="2048 4096"] [PASSES="forward backward"] bash benchmarks/gpu_trees_ab.sh OUTDIR TREE...
#        (the cuDNN frontend on PYTHONPATH; run from the repository root)
set -u
out=${1:?usage: bash benchmarks/gpu_trees_ab.sh OUTDIR TREE...}
shift
[ $# -ge 1 ] || { echo "gpu_trees_ab.sh: name at least one tree" >&2; exit 2; }
mkdir -p "$out"
export PYTHONUNBUFFERED=1
root=$PWD
base_path=${PYTHONPATH:-}
for tree in "$@"; do
    [ -d "$tree/frost" ] || { echo "gpu_trees_ab.sh: $tree has no frost/ folder" >&2; exit 2; }
done
for round in $(seq 1 "${ROUNDS:-2}"); do
    for tree in "$@"; do
        dir=$(cd "$tree" && pwd)
        name=$(basename "$dir")
        (cd "$root/benchmarks" && PYTHONPATH="$dir${base_path:+:$base_path}" timeout 150 python3 flash_ab.py \
            --label "$name-$round" --head-dims 128 --lengths ${LENGTHS:-2048 4096} \
            --passes ${PASSES:-forward backward} --out-dir "$out" 2>&1 | grep -E "$name-$round|rror|needs" | tail -12)
    done
done
shift   # the first tree is the baseline: its tests are the main suite's
for tree in "$@"; do
    dir=$(cd "$tree" && pwd)
    name=$(basename "$dir")
    tests=$dir/tests
    [ -d "$tests" ] || tests=$root/tests
    (cd "$dir" && PYTHONPATH="$dir${base_path:+:$base_path}" timeout 200 python3 -m pytest -m cuda -n 8 \
        "$tests/accel/test_flash_attention_kernels.py" -p no:cacheprovider -o addopts="" -q --timeout 150 -rfE \
        > "$out/tests_$name.txt" 2>&1)
    echo "$name: $(grep -E "passed|failed|error" "$out/tests_$name.txt" | tail -1)"
done
