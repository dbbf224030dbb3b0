#!/usr/bin/env bash
# The first checks to make on a CUDA machine after changes that have not run on one, each result in OUTDIR (the first
# argument). Usage: bash benchmarks/gpu_check.sh OUTDIR [TEXT_FILE] [BASE_TREE]
#   1. the GPU test suite (pytest -m cuda), its summary in OUTDIR/gpu_tests.txt
#   2. the seed ResNet's step time, fp32 and bf16, on the embedded CIFAR-10 sample (the resident pipeline's step
#      does not depend on the dataset's size; accuracy there is not the protocol's); with BASE_TREE (a checkout of
#      an earlier commit), its eager step (--jit off) against that tree's in the same call
#   3. the GPT (shakespeare-char, bf16, frost.jit) against torch.compile (TEXT_FILE: tinyshakespeare's input.txt;
#      the embedded sample without it), and Frost's again with the Hopper flash-attention kernels (FROST_FLASH_WGMMA=1)
#   4. the loader's worker scaling with persistent workers, flash attention with dropout, matrix products per
#      library, and data-parallel at world size 1
# Each step has its own time limit, so a hang or a failure costs that step only. The whole takes about eight
# minutes: a device call of at most ten runs it in one go.
set -u
out=${1:?usage: bash benchmarks/gpu_check.sh OUTDIR [TEXT_FILE] [BASE_TREE]}
text=${2:-}
base=${3:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"  # benchmarks/*.py import frost from this tree
data=()
[ -n "$text" ] && data=(--data "$text")
seed=(bench resnet-cifar10 --sample --steps 20000 --seeds 0 --quiet)

timeout 150 python3 -m pytest -m cuda -n 8 tests -p no:cacheprovider -o addopts="" -q --timeout 100 -rfE \
    > "$out/gpu_tests.txt" 2>&1
grep -E "^FAILED|passed|failed" "$out/gpu_tests.txt"
for precision in fp32 bf16; do
    timeout 60 python3 -m frost "${seed[@]}" --precision "$precision" --out "$out/seed_$precision.json" 2>&1 | tail -1
done
if [ -n "$base" ]; then  # random CIFAR-10-shaped parts: an older tree may lack --sample (timing only)
    synth=$(mktemp -d)
    python3 benchmarks/synthetic_cifar.py "$synth"
    eager=(bench resnet-cifar10 --data "$synth" --steps 400 --seeds 0 --quiet --jit off)
    timeout 100 python3 -m frost "${eager[@]}" --out "$out/seed_eager.json" 2>&1 | tail -1
    # python -c puts the current folder first on sys.path: the base tree's frost, not this one (an older tree may
    # have no frost/__main__.py)
    (cd "$base" && timeout 100 python3 -c "import sys, frost.cli; sys.exit(frost.cli.main(sys.argv[1:]))" \
        "${eager[@]}" --out "$out/seed_eager_base.json" 2>&1 | tail -1)
fi
timeout 150 python3 benchmarks/gpt.py --preset shakespeare-char ${data[@]+"${data[@]}"} --precision bf16 --jit --steps 300 \
    --warmup 30 --eval-interval 0 --eval-iters 10 --torch-modes compile --quiet --out "$out/gpt_bf16_jit.json" 2>&1 \
    | tail -6
# the Hopper flash-attention kernels (off by default until timed) in the same training run
FROST_FLASH_WGMMA=1 timeout 90 python3 -m frost bench gpt --preset shakespeare-char ${data[@]+"${data[@]}"} \
    --precision bf16 --jit --steps 200 --warmup 30 --eval-interval 0 --eval-iters 10 --quiet \
    --out "$out/gpt_bf16_jit_wgmma.json" 2>&1 | tail -3
timeout 60 python3 benchmarks/loader.py --n 10000 --threads 1,8 --repeats 2 --persistent --no-torch-pillow --no-gpu \
    --out "$out/loader_persistent.json" 2>&1 | grep -E "scaling|first"
timeout 60 python3 benchmarks/flash_attention.py --quick --dropout 0.2 --out "$out/flash_dropout.json" 2>&1 | tail -12
timeout 40 python3 benchmarks/matmul_libraries.py --out "$out/matmul_libraries.json" 2>&1 | tail -10
timeout 40 python3 -m frost "${seed[@]}" --precision fp32 --nproc-per-node 1 --out "$out/seed_fp32_ddp1.json" 2>&1 \
    | tail -1
