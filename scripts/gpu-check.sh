#!/usr/bin/env bash
# GPU check: the figures a GPU machine exists for, first. Each step runs under what is left of one
# time budget (TANDEM_GPU_CHECK_SECONDS, default 300 s on cuda, 1,800 s on wgpu), and a step that
# runs out stops the script with its name:
#   1. the side-by-side: PyTorch's reference models (benches/pytorch_reference.py, where python3
#      has torch with CUDA), then Tandem's throughput benchmark (its Tandem variant only), at the
#      reference shape, batch 64 and 256, both read nothing back within a step, warm-up
#      excluded, timed after a device sync, and the table (scripts/side-by-side.py);
#   2. the agreement and end-to-end tests (tests/gpu_backends.rs) on the backend (required);
#   3. the kernel table (benches/kernel_table.rs: each kernel of a step with its estimated time on
#      an H100), then GPU time per kernel as measured (CubeCL's profile log,
#      scripts/kernel-times.py), one architecture at a time at batch 64;
#   4. the quickstart manifest and experiments/gpu_check.toml (sequential, data and model
#      parallel) on the GPUs nvidia-smi lists (with one GPU, replicas and stages share it).
# TANDEM_GPU_CHECK_BACKEND=wgpu runs the same on wgpu (on a machine without a GPU, lavapipe:
# PyTorch is left out); TANDEM_GPU_CHECK_BATCHES and TANDEM_GPU_CHECK_ARCHS narrow step 1.
# Usage: scripts/gpu-check.sh [results-dir]   (default: results/gpu-check)
#        scripts/gpu-check.sh --bundle DIR   builds here (release, cuda and wgpu) and copies the
#                                            four programs to DIR
#        TANDEM_PREBUILT=DIR scripts/gpu-check.sh …   runs them on a GPU machine without Rust.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=""
if [ "${1:-}" = "--bundle" ]; then bundle="${2:?--bundle needs a directory}"; set -- "results/gpu-bundle"; fi
out="${1:-results/gpu-check}"
export TANDEM_DATA_DIR="${TANDEM_DATA_DIR:-../shared/datasets/ag_news}"
backend="${TANDEM_GPU_CHECK_BACKEND:-cuda}"
case "$backend" in
    cuda) budget=300 ;;
    wgpu) budget=1800 ;;
    *) echo "error: TANDEM_GPU_CHECK_BACKEND must be cuda or wgpu, got '$backend'" >&2; exit 2 ;;
esac
batches="${TANDEM_GPU_CHECK_BATCHES:-64,256}"
archs="${TANDEM_GPU_CHECK_ARCHS:-cnn,lstm,gru,transformer}"
mkdir -p "$out"
deadline=$((SECONDS + ${TANDEM_GPU_CHECK_SECONDS:-$budget}))
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
    step "build (release, features cuda,wgpu)"
    # One cargo invocation builds the CLI, the GPU test and the two benchmarks, so Burn is
    # compiled once (separate invocations resolve other features and compile it again); the CLI's
    # test is named only for the `tandem` program that cargo builds beside it.
    within cargo test --release --locked --no-run -p tandem-experiment -p tandem-cli \
        --features "tandem-cli/cuda,tandem-cli/wgpu" --test gpu_backends --test cli --bench throughput --bench kernel_table \
        2> "$out/build.log" || { tail -40 "$out/build.log"; exit 1; }
    executable() { sed -n "s|.*Executable [^ ]*$1 (\(.*\))|\1|p" "$out/build.log" | head -1; }
    gpu_test=$(executable gpu_backends.rs)
    throughput=$(executable throughput.rs)
    kernel_table=$(executable kernel_table.rs)
    tandem=target/release/tandem
}
if [ -n "$bundle" ]; then
    deadline=$((SECONDS + 7200))
    build
    mkdir -p "$bundle"
    cp "$gpu_test" "$bundle/gpu_backends" && cp "$throughput" "$bundle/throughput" && cp "$tandem" "$bundle/tandem"
    cp "$kernel_table" "$bundle/kernel_table"
    echo "the GPU check's programs are in $bundle: run TANDEM_PREBUILT=$bundle $0 on the GPU machine"
    exit 0
fi

if [ "$backend" = cuda ]; then
    command -v nvidia-smi >/dev/null || { echo "error: nvidia-smi not found: the cuda check needs an NVIDIA GPU" >&2; exit 1; }
    nvidia-smi -L
    gpus=$(nvidia-smi -L | grep -c '^GPU ')
    device_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
else
    gpus=1 device_name="wgpu:0 (the first adapter Vulkan lists)"
fi
if [ "$gpus" -ge 2 ]; then devices=$backend:0,$backend:1; else devices=$backend:0,$backend:0; fi

if [ -n "${TANDEM_PREBUILT:-}" ]; then
    gpu_test=$TANDEM_PREBUILT/gpu_backends throughput=$TANDEM_PREBUILT/throughput tandem=$TANDEM_PREBUILT/tandem
    kernel_table=$TANDEM_PREBUILT/kernel_table
else
    build
fi
[ -x "$gpu_test" ] && [ -x "$throughput" ] && [ -x "$tandem" ] && [ -x "$kernel_table" ] || { echo "error: build outputs missing (see $out/build.log)" >&2; exit 1; }

step "1. Tandem beside PyTorch on $device_name (samples/s, reference shape, batches $batches)"
rm -f "$out/tandem.jsonl" "$out/pytorch.jsonl"
if [ "$backend" = cuda ] && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    within python3 benches/pytorch_reference.py --device cuda --batches "$batches" --archs "$archs" --seconds 2 \
        --launches > "$out/pytorch.jsonl"
else
    echo "no PyTorch with CUDA here (or not on cuda): Tandem's side alone"
    : > "$out/pytorch.jsonl"
fi
TANDEM_BENCH_TANDEM_ONLY=1 TANDEM_BENCH_ROUNDS=1 TANDEM_BENCH_SECONDS=2 TANDEM_BENCH_THREADS=1 \
    TANDEM_BENCH_BACKENDS="$backend" TANDEM_BENCH_BATCHES="$batches" TANDEM_BENCH_ARCHS="$archs" \
    TANDEM_BENCH_JSON="$out/tandem.jsonl" within "$throughput" > "$out/throughput.txt"
grep '^host reads' "$out/throughput.txt"
echo
python3 scripts/side-by-side.py "$out/tandem.jsonl" "$out/pytorch.jsonl" --backend "$backend" | tee "$out/side-by-side.md"

step "2. agreement with ndarray and end-to-end runs ($backend required)"
TANDEM_REQUIRE_BACKENDS=$backend within "$gpu_test" --test-threads 1

step "3. the kernel table (estimated for an H100), then GPU time per kernel (batch 64; CubeCL times each kernel alone)"
TANDEM_BENCH_BACKENDS="$backend" TANDEM_BENCH_ARCHS="$archs" within "$kernel_table" | tee "$out/kernel-table.md"
for arch in ${archs//,/ }; do
    echo; echo "$arch:"
    CUBECL_DEBUG_LOG="$out/profile-$arch.log" CUBECL_DEBUG_OPTION=profile TANDEM_BENCH_TANDEM_ONLY=1 \
        TANDEM_BENCH_ROUNDS=1 TANDEM_BENCH_SECONDS=1 TANDEM_BENCH_THREADS=1 TANDEM_BENCH_BACKENDS="$backend" \
        TANDEM_BENCH_BATCHES=64 TANDEM_BENCH_ARCHS="$arch" within "$throughput" > /dev/null
    python3 scripts/kernel-times.py "$out/profile-$arch.log" --top 12 | tee "$out/kernel-times-$arch.md"
done

step "4. quickstart, then sequential, data parallel and model parallel on $devices ($gpus GPU(s))"
# On wgpu (lavapipe runs kernels on the CPU cores) the runs are cut to a few hundred rows.
small=()
[ "$backend" = wgpu ] && small=(--set train.epochs=1 --set data.max_train_rows=256 --set data.max_holdout_rows=64)
within "$tandem" run experiments/quickstart.toml --backend "$backend" --devices "$backend:0" --out "$out" --offline \
    "${small[@]}"
# A failed run is recorded in its summary.json: report what finished, then fail at the end.
runs=0
within "$tandem" run experiments/gpu_check.toml --backend "$backend" --devices "$devices" --out "$out" --offline \
    "${small[@]}" || runs=$?
"$tandem" report "$out/gpu_check" --out "$out/gpu_check-report"
sed -n '/Training time, speedup and accuracy/,/^### Communication/p' "$out/gpu_check-report/report.md"
[ "$runs" = 124 ] && exit 124

step "done"
[ "$runs" = 0 ] || { echo "error: some gpu_check runs failed (see their summary.json under $out/gpu_check)" >&2; exit 1; }
