#!/usr/bin/env bash
# Where the GPT's step spends its GPU time, kernel by kernel, Frost (frost.jit) against torch.compile, and the
# transformer kernels' A/B, each result in OUTDIR. Usage: bash benchmarks/gpu_profile.sh OUTDIR [TEXT_FILE] [BASE_TREE]
#   1. Nsight Compute over two steady steps of each (NVTX-marked: FROST_NVTX_STEPS=1), summed per kernel by
#      benchmarks/kernel_profile.py (OUTDIR/gpt_kernels.json; the raw CSVs beside it)
#   2. the eager GPT step under cProfile (host time), then benchmarks/transformer_kernels.py --quick: LayerNorm and
#      GELU, with the GPU time of graph replays and the one-value-a-thread A/B of the 16-bit vector accesses
#   3. benchmarks/flash_attention.py --quick
#   With BASE_TREE (a checkout of an earlier commit), 2 and 3 also run from that tree, in the same call.
# Each step has its own time limit (120 + 120 + 90 + 90 + 70 + 80 + 60 s at most; typically well under half): one
# ten-minute device call.
set -u
out=${1:?usage: bash benchmarks/gpu_profile.sh OUTDIR [TEXT_FILE] [BASE_TREE]}
text=${2:-}
base=${3:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
outer_path=${PYTHONPATH:-}
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"  # benchmarks/*.py import frost from this tree
data=()
[ -n "$text" ] && data=(--data "$text")
gpt=(--preset shakespeare-char ${data[@]+"${data[@]}"} --precision bf16 --steps 6 --warmup 4 --eval-interval 0
     --eval-iters 2 --quiet)
bash benchmarks/gpt_kernels.sh "$out" gpt 45 "${gpt[@]}"
# the eager step's host time (the eager GPT ran 63 ms/step against 33 without dropout on the H200): where Python goes
timeout 90 python3 -m cProfile -o "$out/gpt_eager.prof" -m frost bench gpt "${gpt[@]}" --steps 40 --warmup 5 \
    > /dev/null 2>&1
python3 -c "import pstats, sys; pstats.Stats(sys.argv[1]).sort_stats('tottime').print_stats(25)" \
    "$out/gpt_eager.prof" 2>&1 | tail -32
timeout 90 python3 benchmarks/transformer_kernels.py --quick --out "$out/transformer_kernels.json" 2>&1 | tail -14
timeout 70 python3 benchmarks/flash_attention.py --quick --out "$out/flash_attention.json" 2>&1 | tail -12
if [ -n "$base" ]; then
    (cd "$base" && export PYTHONPATH="$PWD${outer_path:+:$outer_path}" \
        && timeout 80 python3 benchmarks/transformer_kernels.py --quick --out "$out/transformer_kernels_base.json" \
            2>&1 | tail -10 \
        && timeout 60 python3 benchmarks/flash_attention.py --quick --out "$out/flash_attention_base.json" 2>&1 \
            | tail -12)
fi
