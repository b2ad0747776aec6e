#!/usr/bin/env bash
# W1 (and W2) side by side on one GPU: TRL's GRPOTrainer (the anchor) and `lrft bench`, in one
# call, plus the GPU's ceilings and lrft's training-MFU workload.
#
#   bash scripts/bench_w1_gpu.sh prepare   # here, once: the TRL wheels and the TRL script
#   bash scripts/bench_w1_gpu.sh run       # on the GPU machine, from the repository root
#
# `prepare` downloads trl 1.16.0, datasets 5.2.0, dill 0.4.1 and multiprocess 0.70.19 for
# Python 3.12 into .whl/trl/ and copies the reference scripts (trl_w1.py, gpu_ceilings.py) into
# .bench/; both folders are ignored by git, so a device call must carry them:
#   run(command="bash scripts/bench_w1_gpu.sh run", carry=[".whl", ".bench"])
# `run` writes into $OUT (the device call's output folder; ./lrft_bench elsewhere):
#   ceilings.json       the GPU's matmul, copy and host-to-device ceilings (gpu_ceilings.py)
#   trl_w1.json         TRL on W1: median s/step of steps 3-6, samples/s, tokens/s, peak memory
#   lrft_w1.json        lrft on W1: GRPO per phase, weight sync, engine sleep (lrft bench all)
#   lrft_1p5b.json      lrft's FSDP2 training MFU on the 1.5 B config, its sync and sleep
#   trl_w2.json         TRL on W2 (the 1.5 B shape, 128 x 1024 tokens): median s/step of steps 2-4
#   lrft_w2.json        lrft on W2: GRPO per phase (lrft bench grpo --workload w2)
#   trl_w2_ragged.json  TRL on W2 with each response forced to lrft's w2-ragged lengths
#                       (scripts/trl_w2_ragged.py: EOS forced at log-uniform lengths 64-1024)
#   lrft_w2_ragged.json lrft on w2-ragged: GRPO per phase, generate against the full batch's rate
#   trl_vl1.json        TRL on VL1 (the Qwen2-VL-2B shape, 448x448 images, 64 x 256 tokens;
#                       scripts/trl_vl1.py, on lrft's own model folder, processor and prompts)
#   lrft_vl1.json       lrft on VL1: GRPO per phase and weight sync (lrft bench all --workload vl1)
#   *.log               each stage's output
# Each stage has its own time limit (seconds; LIMIT_<stage> overrides), chosen so that all of
# them fit one device call (600 s): a slow stage leaves the others' results. STAGES picks the
# stages, e.g. STAGES="lrft_w1" to rerun lrft alone; W2_STEPS (default 4) sets the W2 stages'
# steps (3: medians of steps 2-3). The W2 pair fits one call of its own, and so does the pair of
# ragged runs; the four W2 stages fit one call at W2_STEPS=3 with tighter limits (they run in
# this order; the lrft one compiles first, the second finds inductor's cache warm):
#   run(command='STAGES="trl_w2 lrft_w2" bash scripts/bench_w1_gpu.sh run', carry=[".whl", ".bench"])
#   run(command='STAGES="lrft_w2_ragged trl_w2_ragged trl_w2 lrft_w2" W2_STEPS=3 LIMIT_trl_w2_ragged=130 LIMIT_trl_w2=140 LIMIT_lrft_w2=140 bash scripts/bench_w1_gpu.sh run', carry=[".whl", ".bench"])
# The VL1 pair (lrft first: it writes the model folder and the images TRL's side reads too):
#   run(command='STAGES="lrft_vl1 trl_vl1" bash scripts/bench_w1_gpu.sh run', carry=[".whl", ".bench"])
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
out="${OUT:-lrft_bench}"
mkdir -p "$out"

prepare() {
    local python="${PYTHON:-python3}"
    "$python" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl/trl \
        trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 || exit 1
    local shared="${SHARED_BENCH:-/work/shared/bench}"
    rm -rf .bench && cp -r "$shared" .bench || exit 1
    grep -qx "/.bench/" .git/info/exclude 2>/dev/null || echo "/.bench/" >> .git/info/exclude
    echo "ready: carry .whl and .bench"
}

stage() {  # stage NAME SECONDS COMMAND...: run with a limit, log to $out/NAME.log
    local name="$1" limit="$2"
    shift 2
    echo "== $name (limit ${limit}s)"
    local began=$SECONDS
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    local code=$?
    echo "   exit $code after $((SECONDS - began))s"
    tail -n 30 "$out/$name.log"
    return 0
}

run() {
    [ -d .whl/trl ] && [ -f .bench/trl_w1.py ] || {
        echo "missing .whl/trl or .bench: run 'bash scripts/bench_w1_gpu.sh prepare' here and carry both"
        exit 1
    }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/trl-site .whl/trl/*.whl || exit 1
    export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
    # NVLink multicast stays off (shared hosts); the one-GPU kinds have no NVLink peers anyway.
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv \
        > "$out/nvidia-smi.log" 2>&1
    local stages=" ${STAGES:-ceilings trl_w1 lrft_w1 lrft_1p5b} "
    if [[ $stages == *" ceilings "* ]]; then
        stage ceilings "${LIMIT_ceilings:-60}" python3 .bench/gpu_ceilings.py
        grep '^{' "$out/ceilings.log" | tail -n 1 > "$out/ceilings.json"
    fi
    if [[ $stages == *" trl_w1 "* ]]; then
        stage trl_w1 "${LIMIT_trl_w1:-210}" env PYTHONPATH=/tmp/trl-site python3 .bench/trl_w1.py
        grep '^{' "$out/trl_w1.log" | tail -n 1 > "$out/trl_w1.json"
    fi
    # lrft from this checkout; it needs no package beyond the image's torch and transformers.
    if [[ $stages == *" lrft_w1 "* ]]; then
        stage lrft_w1 "${LIMIT_lrft_w1:-210}" env PYTHONPATH="$here/src" python3 -m lrft bench \
            all --workload w1 --output "$out/lrft_w1.json" --work_dir /tmp/lrft-bench
    fi
    if [[ $stages == *" lrft_1p5b "* ]]; then
        stage lrft_1p5b "${LIMIT_lrft_1p5b:-110}" env PYTHONPATH="$here/src" python3 -m lrft \
            bench all --workload qwen2-1.5b --output "$out/lrft_1p5b.json" --work_dir /tmp/lrft-bench
    fi
    local w2_steps="${W2_STEPS:-4}"
    if [[ $stages == *" lrft_w2_ragged "* ]]; then
        stage lrft_w2_ragged "${LIMIT_lrft_w2_ragged:-170}" env PYTHONPATH="$here/src" python3 -m \
            lrft bench grpo --workload w2-ragged --steps "$w2_steps" \
            --output "$out/lrft_w2_ragged.json" --work_dir /tmp/lrft-bench
    fi
    if [[ $stages == *" trl_w2_ragged "* ]]; then
        stage trl_w2_ragged "${LIMIT_trl_w2_ragged:-150}" env STEPS="$w2_steps" \
            PYTHONPATH="/tmp/trl-site:$here/src" python3 scripts/trl_w2_ragged.py
        grep '^{' "$out/trl_w2_ragged.log" | tail -n 1 > "$out/trl_w2_ragged.json"
    fi
    if [[ $stages == *" trl_w2 "* ]]; then
        stage trl_w2 "${LIMIT_trl_w2:-250}" env STEPS="$w2_steps" PYTHONPATH=/tmp/trl-site \
            python3 .bench/trl_w2.py
        grep '^{' "$out/trl_w2.log" | tail -n 1 > "$out/trl_w2.json"
    fi
    if [[ $stages == *" lrft_w2 "* ]]; then
        stage lrft_w2 "${LIMIT_lrft_w2:-330}" env PYTHONPATH="$here/src" python3 -m lrft bench \
            grpo --workload w2 --steps "$w2_steps" --output "$out/lrft_w2.json" \
            --work_dir /tmp/lrft-bench
    fi
    if [[ $stages == *" lrft_vl1 "* ]]; then
        stage lrft_vl1 "${LIMIT_lrft_vl1:-280}" env PYTHONPATH="$here/src" python3 -m lrft bench \
            all --workload vl1 --output "$out/lrft_vl1.json" --work_dir /tmp/lrft-bench
    fi
    if [[ $stages == *" trl_vl1 "* ]]; then
        stage trl_vl1 "${LIMIT_trl_vl1:-280}" env WORK_DIR=/tmp/lrft-bench \
            PYTHONPATH="/tmp/trl-site:$here/src" python3 scripts/trl_vl1.py
        grep '^{' "$out/trl_vl1.log" | tail -n 1 > "$out/trl_vl1.json"
    fi
    ls -la "$out"
}

case "${1:-run}" in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: $0 [prepare|run]"; exit 2 ;;
esac
