#!/usr/bin/env bash
# What each of the transformer step's fusions is worth, in two device calls of under ten minutes each.
#   PART gpt: the GPU suite, GELU in the product's epilogue against the product then GELU's kernel
#      (benchmarks/matmul_gelu_epilogue.py), GPT-2 124M (bf16, frost.jit, batch 16 x 1024) against torch.compile, then
#      Frost alone with one default fusion switched off at a time: GELU in c_fc's epilogue (FROST_CUDNN_MATMUL_GELU=0),
#      LayerNorm's backward adding the stream's gradient so far (FROST_LN_ADDS_GRADIENTS=0, which leaves the sum to
#      the pair kernel), LayerNorm's autocast copy (FROST_LN_AUTOCAST_COPY=0)
#   PART rest: both LayerNorm fusions and the pair kernel off together (--without sum_in_dtypes), the kernel profile
#      beside torch.compile's, and the seed ResNet's step (no regression)
# Results in OUTDIR. Usage: bash benchmarks/gpu_gpt_fusions.sh OUTDIR [gpt|rest]   (the cuDNN frontend on PYTHONPATH)
set -u
out=${1:?usage: bash benchmarks/gpu_gpt_fusions.sh OUTDIR [gpt|rest]}
part=${2:-gpt}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
gpt2=(--preset gpt2-124m --batch-size 16 --precision bf16 --jit --steps 40 --warmup 15 --eval-interval 0
      --eval-iters 2 --quiet)
without() {  # NAME ENV=VALUE... -- ARGS...: Frost's GPT-2 step with the environment given
    local name=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" timeout 60 python3 -m frost bench gpt "${gpt2[@]}" "$@" --out "$out/gpt2_without_$name.json" \
        2>&1 | tail -1
}
if [ "$part" = gpt ]; then
    timeout 150 python3 -m pytest -m cuda -n 8 tests -p no:cacheprovider -o addopts="" -q --timeout 100 -rfE \
        > "$out/gpu_tests.txt" 2>&1
    grep -E "^FAILED|^ERROR|passed|failed" "$out/gpu_tests.txt" | tail -25
    timeout 60 python3 benchmarks/matmul_gelu_epilogue.py --out "$out/matmul_gelu_epilogue.json" 2>&1 | tail -14
    timeout 240 python3 benchmarks/gpt.py "${gpt2[@]}" --torch-modes compile --out "$out/gpt2_124m_bf16_jit.json" \
        2>&1 | tail -6
    without gelu_epilogue FROST_CUDNN_MATMUL_GELU=0 --
    without ln_adds FROST_LN_ADDS_GRADIENTS=0 --
    without ln_copy FROST_LN_AUTOCAST_COPY=0 --
else
    without all FROST_LN_AUTOCAST_COPY=0 FROST_LN_ADDS_GRADIENTS=0 -- --without sum_in_dtypes
    bash benchmarks/gpt_kernels.sh "$out" gpt2 50 --preset gpt2-124m --batch-size 16 --precision bf16 --steps 6 \
        --warmup 4 --eval-interval 0 --eval-iters 2 --quiet
    for precision in fp32 bf16; do
        timeout 60 python3 -m frost bench resnet-cifar10 --sample --steps 20000 --seeds 0 --quiet \
            --precision "$precision" --out "$out/seed_$precision.json" 2>&1 | tail -1
    done
fi
