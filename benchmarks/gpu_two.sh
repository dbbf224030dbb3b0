#!/usr/bin/env bash
# Data-parallel training on two GPUs of one host (the two-GPU machine), each result in OUTDIR. Usage:
#   bash benchmarks/gpu_two.sh OUTDIR [CIFAR_DIR]
#   1. the cuda test suite on the two GPUs' host (its distributed tests form a world of two there)
#   2. all_reduce bus bandwidth, 1 KB to 1 GB, bf16 and fp32, Frost beside torch.distributed (NCCL) in one call
#   3. the seed ResNet (resident pipeline, frost.jit), one GPU then two, batch 32 a GPU, the scaling added to the
#      two-GPU result (--scaling-baseline); PyTorch's twin with its whole step in a CUDA graph (DDP's all-reduces
#      captured) the same way. CIFAR_DIR: the real CIFAR-10 (accuracy comparable); without it random CIFAR-shaped
#      data (benchmarks/synthetic_cifar.py: throughput only)
#   4. GPT-2 124M (bf16, random tokens, frost.jit), one GPU then two, and PyTorch's twin (torch.compile, and
#      DistributedDataParallel on two), the same way
#   5. a rank killed with SIGKILL in the middle of a two-GPU run: frost run's status and seconds until it returns
# NVLink multicast stays off in every process (NCCL_NVLS_ENABLE=0; frost run sets it in the processes it starts).
# Each step has its own time limit, so a hang costs that step only; the limits add up to more than a ten-minute device
# call, which the steps' usual times (about six minutes) fit.
set -u
out=${1:?usage: bash benchmarks/gpu_two.sh OUTDIR [CIFAR_DIR]}
data=${2:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
t0=$(date +%s)
since() { echo "$1 done at $(( $(date +%s) - t0 )) s"; }
nvidia-smi --query-gpu=index,name --format=csv,noheader | tee "$out/gpus.txt"

timeout 150 python3 -m pytest -m cuda -n 8 tests -p no:cacheprovider -o addopts="" -q --timeout 100 -rfE \
    > "$out/gpu_tests.txt" 2>&1
grep -E "^FAILED|passed|failed" "$out/gpu_tests.txt"
since "suite"

timeout 120 python3 -m frost run --nproc-per-node 2 benchmarks/allreduce.py --out "$out/allreduce.json" 2>&1 | tail -30
since "all_reduce"

if [ -z "$data" ]; then
    data=$(mktemp -d)
    python3 benchmarks/synthetic_cifar.py "$data"
fi
seed=(--data "$data" --steps 4000 --seeds 0 --quiet)
timeout 60 python3 -m frost bench resnet-cifar10 "${seed[@]}" --out "$out/seed_1gpu.json" 2>&1 | tail -1
timeout 90 python3 -m frost bench resnet-cifar10 "${seed[@]}" --nproc-per-node 2 \
    --scaling-baseline "$out/seed_1gpu.json" --out "$out/seed_2gpu.json" 2>&1 | tail -2
timeout 60 python3 benchmarks/torch_resnet_cifar10.py --mode graphed "${seed[@]}" --out "$out/seed_torch_1gpu.json" \
    2>&1 | tail -1
timeout 90 python3 benchmarks/torch_resnet_cifar10.py --mode graphed "${seed[@]}" --nproc-per-node 2 \
    --scaling-baseline "$out/seed_torch_1gpu.json" --out "$out/seed_torch_2gpu.json" 2>&1 | tail -2
since "seed"

gpt=(--preset gpt2-124m --batch-size 16 --precision bf16 --steps 40 --warmup 15 --eval-interval 0 --eval-iters 2
     --quiet)
timeout 60 python3 -m frost bench gpt "${gpt[@]}" --jit --out "$out/gpt2_1gpu.json" 2>&1 | tail -1
timeout 90 python3 -m frost bench gpt "${gpt[@]}" --jit --nproc-per-node 2 --scaling-baseline "$out/gpt2_1gpu.json" \
    --out "$out/gpt2_2gpu.json" 2>&1 | tail -2
timeout 90 python3 benchmarks/torch_gpt.py "${gpt[@]}" --mode compile --out "$out/gpt2_torch_1gpu.json" 2>&1 | tail -1
timeout 120 python3 benchmarks/torch_gpt.py "${gpt[@]}" --mode compile --nproc-per-node 2 \
    --scaling-baseline "$out/gpt2_torch_1gpu.json" --out "$out/gpt2_torch_2gpu.json" 2>&1 | tail -2
since "gpt"

# the kill: a two-rank run training (each rank in the process group, as --nproc-per-node starts them), then SIGKILL
# to one rank; frost run must stop the other and fail. Bounded: a launcher still there after 60 s is stopped and
# reported as such.
FROST_BENCH_DATA_PARALLEL=1 python3 -m frost run --nproc-per-node 2 -m frost bench gpt "${gpt[@]}" --steps 100000 \
    --nproc-per-node 2 > "$out/kill.txt" 2>&1 &
launcher=$!
sleep 30
victim=$(pgrep -P "$launcher" | tail -1)
killed_at=$(date +%s.%N)
if [ -z "$victim" ]; then
    status="no rank process found"
    kill -TERM "$launcher"
elif kill -9 "$victim" && timeout 60 tail --pid="$launcher" -s 0.1 -f /dev/null; then
    wait "$launcher"
    status=$?
else
    status="still running 60 s after the kill"
    pkill -KILL -P "$launcher"
    kill -KILL "$launcher"
fi
python3 -c "import sys, time; print(f'rank killed: frost run returned {sys.argv[1]} after {time.time() - float(sys.argv[2]):.1f} s')" \
    "$status" "$killed_at" | tee "$out/kill_summary.txt"
since "kill"
