#!/usr/bin/env bash
# The GPU check: every family's paper-scale model for a few dozen bf16 steps on one CUDA GPU,
# throughput, MFU on the datasheet peak, peak memory, the transformers reference beside it, and
# CUDA-vs-CPU logits (benchmarks/gpu_check.py). Budget: <= 8 minutes on one GPU.
#   benchmarks/gpu_check.sh [OUT_DIR] [extra gpu_check.py arguments, e.g. --device cpu --tiny]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-benchmarks/results/gpu_check}"
shift || true
export PYTHONPATH="${here}/../src${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 480 python "${here}/gpu_check.py" --out "$out" "$@"
