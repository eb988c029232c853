#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU (no GPU is needed to build; CI builds `cuda`).
# Builds Tandem with `cuda,wgpu` (release) and runs, each step under a time limit:
#   1. the backend agreement and end-to-end tests (tests/gpu_backends.rs) on cuda (required)
#      and wgpu (where a Vulkan driver is installed);
#   2. the quickstart manifest on cuda:0;
#   3. data parallel and model parallel (experiments/gpu_check.toml) on the GPUs nvidia-smi
#      lists (with one GPU, both replicas / stages share it, and the results say so);
#   4. the throughput benchmark: samples/s per architecture per backend (table on stdout).
# Usage: scripts/gpu-check.sh [results-dir]   (default: results/gpu-check)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/gpu-check}"
export TANDEM_DATA_DIR="${TANDEM_DATA_DIR:-../shared/datasets/ag_news}"
features=cuda,wgpu
step() { echo; echo "== $1 ($(date +%T))"; }

command -v nvidia-smi >/dev/null || { echo "error: nvidia-smi not found: this script needs an NVIDIA GPU" >&2; exit 1; }
nvidia-smi -L
gpus=$(nvidia-smi -L | grep -c '^GPU ')
if [ "$gpus" -ge 2 ]; then devices=cuda:0,cuda:1; else devices=cuda:0,cuda:0; fi

step "build (release, features $features)"
timeout 420 cargo build --release --locked -p tandem-cli --features "$features"
timeout 300 cargo test --release --locked -p tandem-experiment --features "$features" --test gpu_backends --no-run

step "1. agreement with ndarray and end-to-end runs (cuda required)"
TANDEM_REQUIRE_BACKENDS=cuda timeout 300 \
  cargo test --release --locked -p tandem-experiment --features "$features" --test gpu_backends -- --test-threads 1 --nocapture

step "2. quickstart on cuda:0"
timeout 600 target/release/tandem run experiments/quickstart.toml --backend cuda --devices cuda:0 --out "$out" --offline

step "3. data parallel and model parallel on $devices ($gpus GPU(s))"
timeout 600 target/release/tandem run experiments/gpu_check.toml --devices "$devices" --out "$out" --offline
target/release/tandem report "$out/gpu_check" --out "$out/gpu_check-report"
sed -n '/Training time, speedup and accuracy/,/^### Communication/p' "$out/gpu_check-report/report.md"

step "4. throughput, samples/s (reference shape; flex on all cores for comparison)"
TANDEM_BENCH_SECONDS=3 TANDEM_BENCH_THREADS="$(nproc)" TANDEM_BENCH_BACKENDS=flex,wgpu,cuda timeout 600 \
  cargo bench --locked -p tandem-experiment --features "$features" --bench throughput

step "done"
