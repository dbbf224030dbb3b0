#!/usr/bin/env bash
# The first checks to make on a CUDA machine after changes that have not run on one, in about five minutes; each
# result lands in OUTDIR (the first argument). Usage: bash benchmarks/gpu_check.sh OUTDIR [TEXT_FILE]
#   1. the GPU test suite (pytest -m cuda), its summary in OUTDIR/gpu_tests.txt
#   2. the seed ResNet's step time, fp32 and bf16, on the embedded CIFAR-10 sample (the resident pipeline's step
#      does not depend on the dataset's size; accuracy there is not the protocol's)
#   3. the GPT (shakespeare-char, bf16, frost.jit) against torch.compile (TEXT_FILE: tinyshakespeare's input.txt;
#      the embedded sample without it)
#   4. flash attention with dropout, matrix products per library, and data-parallel at world size 1
# Each step has its own time limit, so a hang or a failure costs that step only.
set -u
out=${1:?usage: bash benchmarks/gpu_check.sh OUTDIR [TEXT_FILE]}
text=${2:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
data=()
[ -n "$text" ] && data=(--data "$text")
seed=(bench resnet-cifar10 --sample --steps 20000 --seeds 0 --quiet)

timeout 300 python3 -m pytest -m cuda -n 6 tests -p no:cacheprovider -o addopts="" -q --timeout 200 -rfE \
    > "$out/gpu_tests.txt" 2>&1
grep -E "^FAILED|passed|failed" "$out/gpu_tests.txt"
for precision in fp32 bf16; do
    timeout 120 python3 -m frost "${seed[@]}" --precision "$precision" --out "$out/seed_$precision.json" 2>&1 | tail -1
done
timeout 300 python3 benchmarks/gpt.py --preset shakespeare-char ${data[@]+"${data[@]}"} --precision bf16 --jit --steps 500 \
    --eval-interval 0 --eval-iters 20 --torch-modes compile --quiet --out "$out/gpt_bf16_jit.json" 2>&1 | tail -12
timeout 180 python3 benchmarks/flash_attention.py --quick --dropout 0.2 --out "$out/flash_dropout.json" 2>&1 | tail -20
timeout 120 python3 benchmarks/matmul_libraries.py --out "$out/matmul_libraries.json" 2>&1 | tail -14
timeout 120 python3 -m frost "${seed[@]}" --precision fp32 --nproc-per-node 1 --out "$out/seed_fp32_ddp1.json" 2>&1 \
    | tail -1
