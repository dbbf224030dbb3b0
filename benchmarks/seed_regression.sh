#!/usr/bin/env bash
# The seed ResNet's step against an earlier commit's tree in one device call (issue 29's "speed unchanged"): frost.jit
# at seeds 0,1,2 in fp32 and bf16, and the eager step (--jit off, 400 steps), each this tree then the base tree, on
# random CIFAR-10-shaped parts (an older tree may lack --sample; the resident step does not depend on the pixels, so
# accuracy there is meaningless). Summary in OUTDIR/seed_regression.json.
# Usage: bash benchmarks/seed_regression.sh OUTDIR BASE_TREE [BASE_COMMIT]   (the cuDNN frontend on PYTHONPATH; about
# five minutes). BASE_COMMIT names the base tree in the summary (a tree exported without .git reports no commit);
# EAGER_ROUNDS (default 2) how many times the eager pair runs; PRECISIONS (default "fp32 bf16") which jit runs.
set -u
out=${1:?usage: bash benchmarks/seed_regression.sh OUTDIR BASE_TREE}
base=${2:?usage: bash benchmarks/seed_regression.sh OUTDIR BASE_TREE [BASE_COMMIT]}
base_commit=${3:-base tree}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
here=$PWD
synth=$(mktemp -d)
python3 "$here/benchmarks/synthetic_cifar.py" "$synth"
bench() {  # TREE NAME ARGS...: python -c puts the tree first on sys.path (an older tree may lack frost/__main__.py)
    local tree=$1 name=$2; shift 2
    (cd "$tree" && PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$tree" timeout 150 python3 -c \
        "import sys, frost.cli; sys.exit(frost.cli.main(sys.argv[1:]))" bench resnet-cifar10 --data "$synth" --quiet \
        "$@" --out "$out/$name.json" 2>&1 | tail -1)
}
for precision in ${PRECISIONS:-fp32 bf16}; do
    bench "$here" "new_jit_$precision" --precision "$precision" --seeds 0,1,2
    bench "$base" "base_jit_$precision" --precision "$precision" --seeds 0,1,2
done
for round in $(seq "${EAGER_ROUNDS:-2}"); do
    bench "$here" "new_eager_fp32_$round" --precision fp32 --seeds 0 --steps 400 --jit off
    bench "$base" "base_eager_fp32_$round" --precision fp32 --seeds 0 --steps 400 --jit off
done
python3 - "$out" "$base_commit" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = {}
for f in sorted(out.glob("*_*.json")):
    if f.name == "seed_regression.json":
        continue
    d = json.loads(f.read_text())
    commit = sys.argv[2] if f.stem.startswith("base_") else d.get("commit")
    rows[f.stem] = {"commit": commit, "device": d.get("device_name"),
                    "ms_per_step": [r["ms_per_step"] for r in d["runs"]],
                    "acc_10k": [r.get("acc_10k") for r in d["runs"]]}
for k, v in rows.items():
    ms = v["ms_per_step"]
    print(f"{k:24s} {v['commit']}  ms/step " + " ".join(f"{m:.4f}" for m in ms) + f"  mean {sum(ms) / len(ms):.4f}")
(out / "seed_regression.json").write_text(json.dumps(rows, indent=1) + "\n")
PY
