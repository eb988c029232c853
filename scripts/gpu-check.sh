#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU (no GPU is needed to build; CI builds `cuda`).
# Builds Tandem with `cuda,wgpu` (release) and runs, each step under a time limit:
#   1. the backend agreement and end-to-end tests (tests/gpu_backends.rs) on cuda (required)
#      and wgpu (where a Vulkan driver is installed);
#   2. the quickstart manifest on cuda:0;
#   3. data parallel and model parallel (experiments/gpu_check.toml) on the GPUs nvidia-smi
#      lists (with one GPU, both replicas / stages share it, and the results say so);
#   4. the throughput benchmark at batch 64 and 256 (samples/s and kernels per training step),
#      the PyTorch reference of the same models (benches/pytorch_reference.py) where python3
#      has torch, and the two side by side (scripts/side-by-side.py).
# The whole check has 8 minutes (TANDEM_GPU_CHECK_SECONDS): each step gets what is left, and
# a step that runs out stops the script with its name, so it never runs past the budget.
# Usage: scripts/gpu-check.sh [results-dir]   (default: results/gpu-check)
#        scripts/gpu-check.sh --bundle DIR   builds here and copies the three programs to DIR;
#        TANDEM_PREBUILT=DIR scripts/gpu-check.sh …   runs them on a GPU machine without Rust.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=""
if [ "${1:-}" = "--bundle" ]; then bundle="${2:?--bundle needs a directory}"; set -- "results/gpu-bundle"; fi
out="${1:-results/gpu-check}"
export TANDEM_DATA_DIR="${TANDEM_DATA_DIR:-../shared/datasets/ag_news}"
features=cuda,wgpu
mkdir -p "$out"
deadline=$((SECONDS + ${TANDEM_GPU_CHECK_SECONDS:-480}))
step() { echo; echo "== $1 ($((SECONDS))s into the check)"; }
exec 3>&2 # the script's own stderr, for messages from inside redirected commands
# Runs a command within the time left (killed 10 s after; Ctrl-C reaches it); returns its status
# and names the step that ran out of time.
within() {
    local left=$((deadline - SECONDS)) rc=0
    [ "$left" -gt 0 ] || { echo "error: the time budget ran out before: $*" >&3; return 124; }
    timeout --foreground -k 10 "$left" "$@" || rc=$?
    [ "$rc" = 124 ] && echo "error: the time budget ran out during: $*" >&3
    return "$rc"
}

build() {
    step "build (release, features $features)"
    # One cargo invocation builds the CLI, the GPU test and the throughput benchmark, so Burn is
    # compiled once (separate invocations resolve other features and compile it again).
    within cargo test --release --locked --no-run -p tandem-experiment -p tandem-cli \
        --features "tandem-cli/cuda,tandem-cli/wgpu" --tests --benches 2> "$out/build.log" || { tail -40 "$out/build.log"; exit 1; }
    executable() { sed -n "s|.*Executable [^ ]*$1 (\(.*\))|\1|p" "$out/build.log" | head -1; }
    gpu_test=$(executable gpu_backends.rs)
    throughput=$(executable throughput.rs)
    tandem=target/release/tandem
}
if [ -n "$bundle" ]; then
    deadline=$((SECONDS + 7200))
    build
    mkdir -p "$bundle"
    cp "$gpu_test" "$bundle/gpu_backends" && cp "$throughput" "$bundle/throughput" && cp "$tandem" "$bundle/tandem"
    echo "the GPU check's programs are in $bundle: run TANDEM_PREBUILT=$bundle $0 on the GPU machine"
    exit 0
fi

command -v nvidia-smi >/dev/null || { echo "error: nvidia-smi not found: this script needs an NVIDIA GPU" >&2; exit 1; }
nvidia-smi -L
gpus=$(nvidia-smi -L | grep -c '^GPU ')
if [ "$gpus" -ge 2 ]; then devices=cuda:0,cuda:1; else devices=cuda:0,cuda:0; fi

if [ -n "${TANDEM_PREBUILT:-}" ]; then
    gpu_test=$TANDEM_PREBUILT/gpu_backends throughput=$TANDEM_PREBUILT/throughput tandem=$TANDEM_PREBUILT/tandem
else
    build
fi
[ -x "$gpu_test" ] && [ -x "$throughput" ] && [ -x "$tandem" ] || { echo "error: build outputs missing (see $out/build.log)" >&2; exit 1; }

step "1. agreement with ndarray and end-to-end runs (cuda required)"
TANDEM_REQUIRE_BACKENDS=cuda within "$gpu_test" --test-threads 1 --nocapture

step "2. quickstart on cuda:0"
within "$tandem" run experiments/quickstart.toml --backend cuda --devices cuda:0 --out "$out" --offline

step "3. data parallel and model parallel on $devices ($gpus GPU(s))"
# A failed run is recorded in its summary.json: report what finished, then fail at the end.
runs=0
within "$tandem" run experiments/gpu_check.toml --devices "$devices" --out "$out" --offline || runs=$?
"$tandem" report "$out/gpu_check" --out "$out/gpu_check-report"
sed -n '/Training time, speedup and accuracy/,/^### Communication/p' "$out/gpu_check-report/report.md"
[ "$runs" = 124 ] && exit 124

step "4. throughput, samples/s (reference shape; flex on all cores for comparison) and PyTorch beside it"
rm -f "$out/tandem.jsonl" "$out/pytorch.jsonl"
TANDEM_BENCH_SECONDS=2 TANDEM_BENCH_THREADS="$(nproc)" TANDEM_BENCH_BACKENDS=flex,wgpu,cuda \
    TANDEM_BENCH_BATCHES=64,256 TANDEM_BENCH_JSON="$out/tandem.jsonl" within "$throughput"
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    within python3 benches/pytorch_reference.py --device cuda --batches 64,256 --seconds 2 --launches \
        > "$out/pytorch.jsonl"
    echo; echo "Tandem beside PyTorch on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1):"
    python3 scripts/side-by-side.py "$out/tandem.jsonl" "$out/pytorch.jsonl" --backend cuda
else
    echo "no PyTorch with CUDA in python3 here: the side-by-side is left out"
fi

step "done"
[ "$runs" = 0 ] || { echo "error: some gpu_check runs failed (see their summary.json under $out/gpu_check)" >&2; exit 1; }
