#!/usr/bin/env bash
# lrft and TRL side by side on one GPU, in one device call: `lrft bench` and TRL's GRPOTrainer
# (scripts/trl_grpo.py, scripts/trl_vl1.py) on the same workloads, model folders and prompts,
# each stage's JSON written as soon as it is measured, then one labelled ratio per pair.
#
#   bash scripts/bench_w1_gpu.sh prepare   # here, once: TRL's wheels and the GPU ceilings script
#   bash scripts/bench_w1_gpu.sh run       # on the GPU machine, from the repository root
#   BENCH_TINY=1 bash scripts/bench_w1_gpu.sh run   # every stage on the tiny workloads, on the
#                                                   # CPU (CI's dry run: TRL installed, no wheels)
#
# `prepare` downloads trl 1.16.0, datasets 5.2.0, dill 0.4.1 and multiprocess 0.70.19 for
# Python 3.12 into .whl/trl/ and copies ../shared/bench (gpu_ceilings.py) into
# .whl/shared-bench/; .whl is ignored by git, so a device call carries it: carry=[".whl"]
# (under 2 MiB). TRL 1.16's
# continuous batching needs transformers >= 5.8 (it compares versions); the GPU machine's 5.17
# qualifies, so no transformers is carried.
#
# STAGES picks the stages, run in the order given (lrft's first: it writes the model folder and
# prompts in /tmp/lrft-bench that the TRL stage of the same workload then reads):
#   ceilings                       the GPU's matmul, copy and host-to-device ceilings
#   lrft_w1 trl_w1 trl_w1_cb lrft_1p5b
#   lrft_w2 trl_w2 trl_w2_cb trl_w2_fp32
#   lrft_w2_ragged trl_w2_ragged trl_w2_ragged_cb
#   lrft_vl1 trl_vl1
# trl_*: TRL's `generate` path; *_cb: its continuous batching; trl_w2_fp32: `generate` with
# fp32 master weights under bf16 autocast (lrft's numerics; the others are pure bf16). TRL
# refuses continuous batching for VL1 (a model with a processor), so VL1 has no _cb stage.
# W2_STEPS sets the W2 and ragged stages' steps on both sides (default: the workloads' 4).
#
# Time: each stage has a limit (LIMIT_<stage> overrides it), and the whole call a budget
# (CALL_BUDGET, default 560 s: the device kills a call at 600 s). A stage gets the smaller of
# its limit and what is left of the budget; a stage that runs out of time, fails, or cannot
# start in the time left is reported as such on stderr (TIMED OUT / FAILED / SKIPPED), the
# other stages go on, and the script exits 1 at the end. Pairs whose sides both completed get a
# ratio (python -m lrft.bench.pair; it refuses half a pair). Outputs, in $OUT (./lrft_bench
# elsewhere): STAGE.json (the stage's document, written after each step or part), STAGE.log,
# ratio_LRFT-STAGE_vs_TRL-STAGE.json, ratios.txt. The commands of docs/benchmarks.md's "How to
# reproduce" are this script's calls.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
out="${OUT:-lrft_bench}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

prepare() {
    local python="${PYTHON:-python3}"
    "$python" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl/trl \
        trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 || exit 1
    local shared="${SHARED_BENCH:-/work/shared/bench}"
    rm -rf .whl/shared-bench && cp -r "$shared" .whl/shared-bench || exit 1
    echo "ready: carry .whl"
}

failures=0
began_call=$SECONDS

stage() {  # stage NAME LIMIT COMMAND...: run within the limit and the call's budget
    local name="$1" limit="$2"
    shift 2
    local left=$(( ${CALL_BUDGET:-560} - (SECONDS - began_call) ))
    if (( left < ${MIN_STAGE_SECONDS:-30} )); then
        echo "STAGE $name SKIPPED: ${left}s left of the call's budget" | tee -a "$out/failures.txt" >&2
        failures=$((failures + 1))
        return
    fi
    (( limit > left )) && limit=$left
    echo "== $name (limit ${limit}s, ${left}s left in the call)"
    local began=$SECONDS
    timeout --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
    local code=$?
    local took=$((SECONDS - began))
    tail -n 5 "$out/$name.log"
    if (( code == 124 || code == 137 )); then
        echo "STAGE $name TIMED OUT after ${took}s (limit ${limit}s): $name.json holds what it measured before" \
            | tee -a "$out/failures.txt" >&2
        failures=$((failures + 1))
    elif (( code != 0 )); then
        echo "STAGE $name FAILED with exit $code after ${took}s (see $name.log)" \
            | tee -a "$out/failures.txt" >&2
        failures=$((failures + 1))
    else
        echo "   done in ${took}s"
    fi
}

wanted() { [[ " $stages " == *" $1 "* ]]; }

run() {
    local tiny="${BENCH_TINY:-0}"
    # workloads by stage family: the measured ones, or their tiny CPU stand-ins
    local w1=w1 w2=w2 ragged=w2-ragged vl1=vl1 big=qwen2-1.5b
    local w2_steps="${W2_STEPS:-}"
    if [[ $tiny == 1 ]]; then
        w1=tiny w2=tiny ragged=tiny-ragged vl1=vl-tiny big=tiny
        w2_steps="${W2_STEPS:-3}"
    fi
    local steps_flag=()
    [[ -n $w2_steps ]] && steps_flag=(--steps "$w2_steps")
    stages="${STAGES:-ceilings lrft_w1 trl_w1 trl_w1_cb lrft_1p5b}"
    if [[ $tiny != 1 ]]; then
        [ -d .whl/trl ] && [ -f .whl/shared-bench/gpu_ceilings.py ] || {
            echo "missing .whl/trl or .whl/shared-bench: run 'bash scripts/bench_w1_gpu.sh prepare' here and carry .whl" >&2
            exit 1
        }
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/trl-site .whl/trl/*.whl || exit 1
    fi
    local python="${PYTHON:-python3}"
    local work="${WORK_DIR:-/tmp/lrft-bench}"
    export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
    export LRFT_BENCH_CALL="${LRFT_BENCH_CALL:-$(date -u +%Y%m%dT%H%M%SZ)-$$}"
    # NVLink multicast stays off (shared hosts); the one-GPU kinds have no NVLink peers anyway.
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv \
        > "$out/nvidia-smi.log" 2>&1
    echo "call $LRFT_BENCH_CALL, stages: $stages"
    # this checkout's lrft first, then TRL's wheels (GPU) and what the caller's path holds
    local path="$here/src:/tmp/trl-site${PYTHONPATH:+:$PYTHONPATH}"
    local lrft=(env PYTHONPATH="$path" "$python" -m lrft bench)
    local trl=(env PYTHONPATH="$path" "$python")
    local name
    for name in $stages; do
        case "$name" in
            ceilings)
                [[ $tiny == 1 ]] && continue
                stage ceilings "${LIMIT_ceilings:-60}" "$python" .whl/shared-bench/gpu_ceilings.py
                grep '^{' "$out/ceilings.log" | tail -n 1 > "$out/ceilings.json" ;;
            lrft_w1) stage "$name" "${LIMIT_lrft_w1:-150}" "${lrft[@]}" all --workload "$w1" \
                --output "$out/$name.json" --work_dir "$work" ;;
            lrft_1p5b) stage "$name" "${LIMIT_lrft_1p5b:-110}" "${lrft[@]}" all --workload "$big" \
                --output "$out/$name.json" --work_dir "$work" ;;
            lrft_w2) stage "$name" "${LIMIT_lrft_w2:-210}" "${lrft[@]}" grpo --workload "$w2" \
                "${steps_flag[@]}" --output "$out/$name.json" --work_dir "$work" ;;
            lrft_w2_ragged) stage "$name" "${LIMIT_lrft_w2_ragged:-200}" "${lrft[@]}" grpo \
                --workload "$ragged" "${steps_flag[@]}" --output "$out/$name.json" --work_dir "$work" ;;
            lrft_vl1) stage "$name" "${LIMIT_lrft_vl1:-260}" "${lrft[@]}" all --workload "$vl1" \
                --output "$out/$name.json" --work_dir "$work" ;;
            trl_w1 | trl_w1_cb | trl_w2 | trl_w2_cb | trl_w2_fp32 | trl_w2_ragged | trl_w2_ragged_cb)
                local workload=$w2 generation=generate precision=bf16 flags=("${steps_flag[@]}")
                [[ $name == trl_w1* ]] && workload=$w1 flags=()
                [[ $name == trl_w2_ragged* ]] && workload=$ragged
                [[ $name == *_cb ]] && generation=continuous_batching
                [[ $name == *_fp32 ]] && precision=fp32-master
                local limit_name="LIMIT_$name"
                stage "$name" "${!limit_name:-200}" "${trl[@]}" scripts/trl_grpo.py \
                    --workload "$workload" --generation "$generation" --precision "$precision" \
                    "${flags[@]}" --output "$out/$name.json" --work_dir "$work" ;;
            trl_vl1) stage "$name" "${LIMIT_trl_vl1:-200}" "${trl[@]}" scripts/trl_vl1.py \
                --workload "$vl1" --output "$out/$name.json" --work_dir "$work" ;;
            *) echo "unknown stage $name" >&2; exit 2 ;;
        esac
    done
    local trl_name lrft_name
    for trl_name in $stages; do
        [[ $trl_name == trl_* ]] || continue
        lrft_name="lrft_${trl_name#trl_}"
        lrft_name="${lrft_name%_cb}"
        lrft_name="${lrft_name%_fp32}"
        wanted "$lrft_name" || continue
        env PYTHONPATH="$path" "$python" -m lrft.bench.pair --lrft "$out/$lrft_name.json" \
            --trl "$out/$trl_name.json" --output "$out/ratio_${lrft_name}_vs_${trl_name}.json" \
            2>&1 | tee -a "$out/ratios.txt"
        (( PIPESTATUS[0] == 0 )) || failures=$((failures + 1))
    done
    ls -la "$out"
    if (( failures > 0 )); then
        echo "$failures stage(s) did not complete: see failures.txt" >&2
        exit 1
    fi
}

case "${1:-run}" in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: $0 [prepare|run]"; exit 2 ;;
esac
