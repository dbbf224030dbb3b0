#!/usr/bin/env bash
# After a change to the GPT's step: the GPU test suite, the GPT (shakespeare-char, then GPT-2 124M; bf16,
# frost.jit) against torch.compile, the seed ResNet's step (fp32 and bf16: no regression), and where GPT-2's step
# spends its GPU time kernel by kernel, Frost's beside torch.compile's (Nsight Compute over two timed steps), each
# result in OUTDIR. About eight minutes on an H100.
# Usage: bash benchmarks/gpu_gpt_check.sh OUTDIR [TEXT_FILE]
set -u
out=${1:?usage: bash benchmarks/gpu_gpt_check.sh OUTDIR [TEXT_FILE]}
text=${2:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
data=()
[ -n "$text" ] && data=(--data "$text")
timeout 150 python3 -m pytest -m cuda -n 8 tests -p no:cacheprovider -o addopts="" -q --timeout 100 -rfE \
    > "$out/gpu_tests.txt" 2>&1
grep -E "^FAILED|^ERROR|passed|failed" "$out/gpu_tests.txt" | tail -25
timeout 150 python3 benchmarks/gpt.py --preset shakespeare-char ${data[@]+"${data[@]}"} --precision bf16 --jit --steps 300 \
    --warmup 30 --eval-interval 0 --eval-iters 10 --torch-modes compile --quiet --out "$out/gpt_bf16_jit.json" 2>&1 \
    | tail -6
# GPT-2 124M (random tokens: throughput only), batch 16 x 1024 as issue 30 measures torch.compile
timeout 240 python3 benchmarks/gpt.py --preset gpt2-124m --batch-size 16 --precision bf16 --jit --steps 40 --warmup 15 \
    --eval-interval 0 --eval-iters 2 --torch-modes compile --quiet --out "$out/gpt2_124m_bf16_jit.json" 2>&1 | tail -6
for precision in fp32 bf16; do
    timeout 60 python3 -m frost bench resnet-cifar10 --sample --steps 20000 --seeds 0 --quiet --precision "$precision" \
        --out "$out/seed_$precision.json" 2>&1 | tail -1
done
bash benchmarks/gpt_kernels.sh "$out" gpt2 50 --preset gpt2-124m --batch-size 16 --precision bf16 --steps 6 --warmup 4 \
    --eval-interval 0 --eval-iters 2 --quiet
