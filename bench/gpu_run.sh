#!/usr/bin/env bash
# Every GPU check and benchmark of one device session, each under its own time limit, its output kept in
# $OUT (else ./gpu-out): the environment, bench/gpu_check.py (the CUDA-graph decode against eager steps),
# bench/bench_engine.py --gpu --full (memory at 32000 tokens, decode speed, the engine's GPU targets) and
# bench/bench_exits.py --gpu (per-token exits). Needs only torch, transformers and nvidia-ml-py.
#
#     bash bench/gpu_run.sh
set -u
out=${OUT:-gpu-out}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$py" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} >"$out/env.txt" 2>&1

run() {  # run NAME LIMIT SCRIPT ARGS...: stdout to NAME.json, stderr to NAME.log, the exit status and seconds to env.txt
    local name=$1 limit=$2 began=$SECONDS
    shift 2
    timeout "$limit" "$py" "$@" >"$out/$name.json" 2>"$out/$name.log"
    echo "$name: exit $? in $((SECONDS - began)) s" | tee -a "$out/env.txt"
}

run gpu_check "${GPU_CHECK_LIMIT:-100}" bench/gpu_check.py
run bench_engine_full "${BENCH_ENGINE_LIMIT:-280}" bench/bench_engine.py --gpu --full
run bench_exits "${BENCH_EXITS_LIMIT:-90}" bench/bench_exits.py --gpu --width 1024 --batch 32
cat "$out/env.txt"
