#!/usr/bin/env bash
# compute-sanitizer over the GPU tests of Frost's own kernels, one test file at a time (racecheck slows a kernel by
# orders of magnitude: over all of tests/kernel at once it did not finish in 140 s), each with its own time limit, the
# summaries in OUTDIR/TOOL.txt. TOOL (environment; default racecheck) is any of compute-sanitizer's tools: racecheck,
# memcheck, initcheck, synccheck; TOGETHER=1 runs the files in one pytest (the faster tools: memcheck, synccheck).
# Usage: [TOOL=memcheck] [TOGETHER=1] bash benchmarks/gpu_sanitize.sh OUTDIR [SECONDS] [FILE...]
# Default files: the test files with CUDA tests of Frost's kernels (each @kernel of frost/ runs in one of them);
# SECONDS a file (default 60). A file that runs out of time is named as such, with what racecheck had reported by
# then. TEST_SECONDS (default 60) bounds one test, so that a test slowed past it by the tool fails alone instead of
# stalling the rest. The files are independent: a caller with time for one device call runs several of this script
# at once, each with its own OUTDIR (one file each).
# Reading the reports (H100, compute-sanitizer 2025.3, gpu_sanitizers_h100_b38b235.json): racecheck flags cuBLASLt's
# and cuDNN's own kernels (nvjet_sm90_*, strided dgrad), and initcheck flags every read of a bf16 product that
# cuBLASLt wrote (the tool seems not to see its stores: the same read of CuPy's float32 sgemm output reports
# nothing, and the values read are right); a report counts when a Frost kernel did the racing access or wrote the
# memory read. Exit 9 with no pytest summary is a killed process: racecheck over the conv kernels' tests
# (test_conv_fprop_mma, test_conv_wgrad_mma) and over test_gpu_autocast_conv_bn_conv_chain_stays_bf16 ended so on an
# H100 and an H200, and the H100's kernel log showed its OOM killer stopping a python3 of 130 GB; test_conv_wgrad
# ran past 320 s. Run those alone with SELECT (environment), a pytest -k expression of small shapes, e.g.
# SELECT='candidates_and_conv2d and 64-64-8' for test_conv_fprop_mma.py, 'odd_shapes' for test_conv_wgrad.py.
# initcheck does not see stores made by the copy engine (cp.async.bulk / TMA from shared to global memory):
# benchmarks/initcheck_probe.py's bulk_store mode is reported 4,064 times for 4,096 floats, every value right (H100,
# gpu_initcheck_probe_h100_e38bbd6.json), while a kernel first run in a CUDA-graph capture is not. cuBLASLt's and
# cuDNN's Hopper kernels store that way, so its reports of reads of their outputs (test_conv_fprop_mma's, the bf16
# products) are not unwritten memory; the check to trust for that is pytest --poison-gpu-memory (every allocation
# NaN-filled), which the whole GPU suite passes.
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
           tests/ops/test_norm_kernels.py tests/accel/test_flash_attention_kernels.py tests/data/test_png_device.py
           tests/accel/test_png_inflate_kernels.py
           tests/accel/test_add_kernels.py tests/accel/test_bias_kernels.py tests/accel/test_cast_kernels.py
           tests/accel/test_grad_norm_kernels.py tests/accel/test_matmul_kernels.py
           tests/accel/test_resized_crop_kernels.py tests/accel/test_transformer_fusions.py
           tests/ops/test_conv_fprop_mma.py tests/ops/test_conv_wgrad.py tests/ops/test_conv_wgrad_mma.py
           tests/ops/test_head.py tests/accel/test_philox.py tests/optim/test_flat_kernels.py tests/optim/test_lion.py
           tests/optim/test_sgd.py tests/optim/test_adafactor.py tests/optim/test_lamb.py tests/optim/test_sophia.py
           tests/accel/test_augment_kernels.py)
fi
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# cuDNN's plans are library code, and timing eight of them in CUDA graph replays under racecheck took a test past
# 150 s (and one process past 128 GB of host memory when 14 files ran at once); one plan still runs Frost's kernels
export FROST_CUDNN_TUNE_PLANS=${FROST_CUDNN_TUNE_PLANS:-1}
tool=${TOOL:-racecheck}
extra=()
[ "$tool" = racecheck ] && extra=(--racecheck-report hazard)
report="$out/$tool.txt"
: > "$report"
runs=("${files[@]}")
[ "${TOGETHER:-0}" = 1 ] && runs=("${files[*]}")
for f in "${runs[@]}"; do
    name=$(basename "${f%% *}" .py)
    [ "$f" != "${f%% *}" ] && name=together
    log="$out/${tool}_$name.log"
    # $f unquoted: with TOGETHER=1 it is every file, space-separated (test paths have no spaces)
    # shellcheck disable=SC2086
    timeout "$limit" compute-sanitizer --tool "$tool" ${extra[@]+"${extra[@]}"} --report-api-errors no \
        python3 -m pytest -m cuda $f ${SELECT:+-k "$SELECT"} -p no:cacheprovider -o addopts="" -q \
        --timeout "${TEST_SECONDS:-60}" > "$log" 2>&1
    rc=$?
    summary=$(grep -E "SUMMARY|passed|failed" "$log" | tail -3 | tr '\n' ' ')
    if [ $rc -eq 124 ]; then
        echo "$f: TIMED OUT after ${limit}s; $(grep -c 'Race reported\|Error: Race\|^========= [A-Z]' "$log") reports by then" \
            >> "$report"
    else
        echo "$f: exit $rc; $summary" >> "$report"
    fi
done
cat "$report"
