#!/usr/bin/env bash
# Every GPU check and benchmark of one device session, each under its own time limit (together 480 s, so one
# device call of 10 minutes holds it with room to start), its output kept in $OUT (else ./gpu-out):
#
#   1. the harness on the GPU: with .whl/ present (`bash scripts/gpu_wheels.sh` beforehand; the call carries it),
#      its wheels installed into /tmp/site, then `loopeval run --device cuda` on the tiny zoo's headline sweep
#      (the four zoo models at loops 1,2,4,8 on the synthetic suite, DOCS (3) docs per task: the default job's
#      lab, exit and lever sweeps do not fit beside the benchmarks) into loopeval.sqlite, with the NVML
#      sampler's series and each run's NVML energy; the report (report.html) from what it stored, and
#      bench/pipeline_check.py's reading of the store (pipeline_check.json);
#   2. bench/gpu_check.py (the CUDA-graph decode against eager steps);
#   3. bench/bench_engine.py --gpu --full (memory at 32000 tokens, decode speed, the engine's GPU targets);
#   4. bench/bench_exits.py --gpu (per-token exits);
#   5. bench/bench_slope.py on every layer of the qwen3-1.7b and ouro-1.4b shapes (r = 4; per-loop, shared-last,
#      int8): batch-1 latency against contexts up to 32000, its slope and intercept against the bandwidth bound
#      (its table and JSON into steps.log).
# A step that fails or runs out of time leaves the others' figures. Without .whl/ step 1 is skipped (the
# benchmarks need only torch, transformers and nvidia-ml-py). $OUT brings back at most 8 files, and these are 8:
# env.txt (versions, each step's exit status and seconds), steps.log (every step's stderr, and the stdout of
# those without a file of their own: the run's table), loopeval.sqlite, report.html and four JSON files.
#
#     bash bench/gpu_run.sh
set -u
out=${OUT:-gpu-out}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1  # nothing outside the machine can be reached: never wait on the Hub
{
    date -u
    timeout 5 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    timeout 15 "$py" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    # the image's packages the wheels need at some minimum version (datasets: pyarrow>=24, fsspec<=2026.9; textual: rich>=14.2)
    timeout 10 "$py" -c "from importlib.metadata import version as v
print(*(f'{n} {v(n)}' for n in ('pyarrow', 'fsspec', 'huggingface-hub', 'pandas', 'rich', 'anyio', 'click', 'typer')))"
} >"$out/env.txt" 2>&1

run() {  # run NAME LIMIT COMMAND...: stdout to NAME (to steps.log where NAME has no extension), stderr to steps.log,
         # the exit status and seconds to env.txt
    local name=$1 limit=$2 began=$SECONDS log="$out/steps.log"
    shift 2
    echo "=== ${name%.*}" >>"$log"
    if [[ $name == *.* ]]; then timeout "$limit" "$@" >"$out/$name" 2>>"$log"; else timeout "$limit" "$@" >>"$log" 2>&1; fi
    echo "${name%.*}: exit $? in $((SECONDS - began)) s" | tee -a "$out/env.txt"
}
loopeval=("$py" -c 'from harness.cli import entry; entry()')  # no console script there: the CLI from the checkout

if compgen -G ".whl/*.whl" >/dev/null; then
    run wheels "${WHEELS_LIMIT:-30}" "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH=$PWD:/tmp/site
    db="$out/loopeval.sqlite"
    run loopeval_run "${PIPELINE_LIMIT:-85}" "${loopeval[@]}" run --device cuda --limit "${DOCS:-3}" --loops 1,2,4,8 \
        --db "$db" --no-report
    run report "${REPORT_LIMIT:-25}" "${loopeval[@]}" dashboard --db "$db" --out "$out/report.html"
    run pipeline_check.json 5 "$py" bench/pipeline_check.py "$db"
else
    echo "pipeline: skipped (no .whl/: bash scripts/gpu_wheels.sh first)" | tee -a "$out/env.txt"
fi
run gpu_check.json "${GPU_CHECK_LIMIT:-45}" "$py" bench/gpu_check.py
run bench_engine_full.json "${BENCH_ENGINE_LIMIT:-155}" "$py" bench/bench_engine.py --gpu --full
run bench_exits.json "${BENCH_EXITS_LIMIT:-60}" "$py" bench/bench_exits.py --gpu --width 1024 --batch 32
run slope "${SLOPE_LIMIT:-45}" "$py" bench/bench_slope.py --device cuda --dtype bf16 --layers 0 --json /dev/stdout
cat "$out/env.txt"
