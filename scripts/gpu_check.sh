#!/usr/bin/env bash
# The GPU directory in one pytest process, on a machine where nothing can be downloaded.
#
#   here, once:   bash scripts/gpu_check.sh prepare      # DeepSpeed and peft wheels into .whl/
#                 (in lrft's test venv: DeepSpeed's wheel is built against its torch)
#   GPU machine:  bash scripts/gpu_check.sh run          # carry: [".whl"]
#
# `run` installs the carried wheels next to the machine's own torch and transformers (no
# dependencies resolved: the machine has them), keeps NVLink multicast off, and runs
# `pytest tests/gpu` once, so that a test which leaves CUDA state behind (a failed graph
# capture, a cuBLAS workspace, a leaked allocation) shows up in the tests after it, as it would
# for a user. Writes into $OUT (./lrft_gpu elsewhere): gpu.log (pytest's output with the skip
# reasons), gpu.xml (JUnit) and nvidia-smi.log. PYTEST_ARGS adds pytest arguments (a -k filter,
# say).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

prepare() {
    local python="${PYTHON:-python}"
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        -d .whl/ds hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 \
        annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 || exit 1
    # DeepSpeed is an sdist whose setup.py imports torch: build its pure-python wheel against the
    # torch of this environment (lrft's test venv), without build isolation.
    "$python" -m pip wheel -q --no-deps --no-build-isolation -w .whl/ds deepspeed==0.19.8 || exit 1
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux2014_x86_64 -d .whl/peft peft==0.21.2 || exit 1
    echo "ready: carry .whl"
}

run() {
    local out="${OUT:-lrft_gpu}" site=/tmp/lrft-gpu-site
    mkdir -p "$out"
    [ -d .whl/ds ] && [ -d .whl/peft ] || {
        echo "missing .whl/ds or .whl/peft: run 'bash scripts/gpu_check.sh prepare' here and carry .whl"
        exit 1
    }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
        .whl/ds/*.whl .whl/peft/*.whl || exit 1
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    export PYTHONPATH="$here/src:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    nvidia-smi > "$out/nvidia-smi.log" 2>&1
    # shellcheck disable=SC2086
    python3 -m pytest tests/gpu -q -rs -p no:cacheprovider --junitxml "$out/gpu.xml" \
        ${PYTEST_ARGS:-} 2>&1 | tee "$out/gpu.log" | tail -n 60
    return "${PIPESTATUS[0]}"
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: bash scripts/gpu_check.sh prepare|run" >&2; exit 2 ;;
esac
