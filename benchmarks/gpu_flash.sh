#!/usr/bin/env bash
# Flash attention on a Hopper GPU in one device call of under ten minutes: the GPU suite (among its tests the flash
# kernels against float64, the tensor-map copies and the bulk reductions on the hardware), the forward alone at each
# tile setting at head dim 128 (benchmarks/flash_forward_tiles.py: tensor-map and arrange_kv feeds beside cuDNN and
# PyTorch), then the backward alone (benchmarks/flash_backward.py: the two kernels and the fused one), and Nsight
# Compute's speed-of-light, warp-stall, memory and source-line sections over one forward and one fused backward (its
# statistics, main and dQ-convert kernels) at 8 x 16 x 2048 x 128, where both trail cuDNN most
# (benchmarks/flash_profile.py). The L2 bytes test whether the forward is bound by L2 bandwidth (128-query tiles read
# their head's whole K and V: 128 flops a byte); the timings argue against it (the same bytes a flop at every length,
# yet 530, 611 and 652 TFLOP/s at 2048, 4096 and 8192 queries on an H100, tree 015f5f3), pointing at a fixed cost of
# about 9 us a block instead.
# Results in OUTDIR. PARTS picks the stages (default all: "tests tiles backward ncu"), for a lease with less time.
# Usage: [PARTS="tests ncu"] bash benchmarks/gpu_flash.sh OUTDIR   (the cuDNN frontend on PYTHONPATH)
set -u
out=${1:?usage: bash benchmarks/gpu_flash.sh OUTDIR}
parts=" ${PARTS:-tests tiles backward ncu} "
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
if [[ $parts == *" tests "* ]]; then
    timeout 150 python3 -m pytest -m cuda -n 8 tests -p no:cacheprovider -o addopts="" -q --timeout 100 -rfE \
        > "$out/gpu_tests.txt" 2>&1
    grep -E "^FAILED|^ERROR|passed|failed" "$out/gpu_tests.txt" | tail -25
fi
cd benchmarks || exit 1
if [[ $parts == *" tiles "* ]]; then
    timeout 200 python3 flash_forward_tiles.py --head-dims 128 --lengths 2048 4096 \
        --out "$out/flash_forward_tiles.json" 2>&1 | tail -60
fi
if [[ $parts == *" backward "* ]]; then
    timeout 120 python3 flash_backward.py --head-dims 128 --lengths 2048 4096 --out "$out/flash_backward.json" 2>&1 \
        | tail -20
fi
[[ $parts == *" ncu "* ]] || exit 0
# -lineinfo (FROST_KERNEL_LINEINFO=1) so that the source page puts the sampled stalls on the kernels' Python lines
FROST_KERNEL_LINEINFO=1 timeout 150 ncu -k regex:'flash_fwd_bulk|flash_bwd_' -c 4 --section SpeedOfLight \
    --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    --section SourceCounters --import-source yes \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active,lts__t_bytes.sum' \
    -f -o "$out/ncu_flash" python3 flash_profile.py --shape 8 16 2048 128 > "$out/ncu_flash_run.txt" 2>&1
ncu -i "$out/ncu_flash.ncu-rep" --page details > "$out/ncu_flash.txt" 2>&1
ncu -i "$out/ncu_flash.ncu-rep" --page source --csv --print-source cuda > "$out/ncu_flash_source.csv" 2>&1
gzip -f "$out/ncu_flash_source.csv"
grep -E "flash_|Duration|Throughput|Registers|stalled|Warp Cycles|Issued Warp|Achieved Occupancy|lts__t_bytes|ERR" \
    "$out/ncu_flash.txt" | head -100
