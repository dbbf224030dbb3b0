#!/usr/bin/env bash
# compute-sanitizer's racecheck over the GPU tests of Frost's own kernels, one test file at a time (racecheck slows a
# kernel by orders of magnitude: over all of tests/kernel at once it did not finish in 140 s), each with its own
# time limit, the summaries in OUTDIR/racecheck.txt. Usage: bash benchmarks/gpu_sanitize.sh OUTDIR [SECONDS] [FILE...]
# Default files: every test file of Frost's kernels that has cuda tests; SECONDS a file (default 60). A file that
# runs out of time is named as such, with what racecheck had reported by then.
set -u
out=${1:?usage: bash benchmarks/gpu_sanitize.sh OUTDIR [SECONDS] [FILE...]}
limit=${2:-60}
shift $(( $# < 2 ? $# : 2 ))
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
    files=(tests/kernel/test_kernel_gpu.py tests/kernel/test_kernel_agreement_gpu.py
           tests/kernel/test_kernel_consts_and_scopes.py tests/kernel/test_kernel_grid_sync.py
           tests/kernel/test_kernel_pdl.py tests/kernel/test_kernel_wgmma.py tests/accel/test_dropout_kernels.py
           tests/accel/test_gelu_kernels.py tests/accel/test_layer_norm_kernels.py tests/ops/test_loss_kernels.py
           tests/ops/test_norm_kernels.py tests/accel/test_flash_attention_kernels.py tests/data/test_png_device.py)
fi
mkdir -p "$out"
export PYTHONUNBUFFERED=1
report="$out/racecheck.txt"
: > "$report"
for f in "${files[@]}"; do
    log="$out/racecheck_$(basename "$f" .py).log"
    timeout "$limit" compute-sanitizer --tool racecheck --racecheck-report hazard --report-api-errors no \
        python3 -m pytest -m cuda "$f" -p no:cacheprovider -o addopts="" -q -x > "$log" 2>&1
    rc=$?
    summary=$(grep -E "RACECHECK SUMMARY|ERROR SUMMARY|passed|failed" "$log" | tail -3 | tr '\n' ' ')
    if [ $rc -eq 124 ]; then
        echo "$f: TIMED OUT after ${limit}s; $(grep -c 'Race reported\|Error: Race' "$log") hazards reported by then" \
            >> "$report"
    else
        echo "$f: exit $rc; $summary" >> "$report"
    fi
done
cat "$report"
