#!/usr/bin/env bash
# Kernels one training step launches on a GPU backend, per architecture and by kernel name, from
# CubeCL's profiling log: runs of 2 and 4 steps (batch 64 x 64 tokens, the throughput benchmark's
# model shapes), their difference / 2, so set-up and evaluation cancel. Both runs keep the same
# vocabulary (1,000 tokens), so the same shapes, and the pair runs once before to warm the autotune
# cache: autotuning benchmarks each new shape with launches of its own.
# Runs on wgpu (lavapipe where there is no GPU: apt-get install mesa-vulkan-drivers libvulkan1) or
# cuda:0. Usage, from the project root:
#   scripts/kernel-launches.sh TANDEM_BINARY [wgpu|cuda] [--by-kernel] [archs...]
#   (TANDEM_BINARY: e.g. target/release/tandem after cargo build --release -p tandem-cli --features wgpu)
set -euo pipefail
bin=$(realpath "${1:?usage: kernel-launches.sh TANDEM_BINARY [wgpu|cuda] [--by-kernel] [archs...]}"); shift
backend=${1:-wgpu}; [ $# -gt 0 ] && shift
by_kernel=0; [ "${1:-}" = --by-kernel ] && { by_kernel=1; shift; }
archs=${*:-lstm gru cnn transformer}
export TANDEM_DATA_DIR=${TANDEM_DATA_DIR:-../shared/datasets/ag_news}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

model() {
    case $1 in
        cnn) printf 'embedding_dim = 128\nfilters = 100\nkernel_widths = [3, 4, 5]\n' ;;
        lstm | gru) printf 'embedding_dim = 128\nhidden = 128\n' ;;
        transformer) printf 'd_model = 128\nlayers = 2\nheads = 4\nd_ff = 256\n' ;;
        *) echo "unknown architecture: $1" >&2; exit 2 ;;
    esac
}

# run ARCH ROWS: one epoch over ROWS training rows, its profiling log in $work/ARCH-ROWS.log.
run() {
    cat > "$work/$1-$2.toml" <<EOF
[experiment]
name = "launches-$1"
seeds = [1]
backend = "$backend"
devices = ["$backend:0"]
[data]
holdout_fraction = 0.2
split_seed = 42
max_len = 64
max_train_rows = $2
max_holdout_rows = 8
vocab = { max_size = 1000, min_freq = 1 }
[train]
epochs = 1
batch_size = 64
optimizer = "adamw"
learning_rate = 1e-3
[strategy]
kind = "sequential"
[[models]]
name = "$1"
architecture = "$1"
$(model "$1")
EOF
    rm -rf "$work/out" "$work/$1-$2.log"
    CUBECL_DEBUG_LOG="$work/$1-$2.log" CUBECL_DEBUG_OPTION=profile \
        "$bin" run "$work/$1-$2.toml" --offline --out "$work/out" > "$work/run.txt" 2>&1 \
        || { echo "$1 on $backend failed:" >&2; tail -5 "$work/run.txt" >&2; exit 1; }
}

[ "$by_kernel" = 1 ] || printf '%-12s %10s\n' architecture launches/step
for a in $archs; do
    run "$a" 128; run "$a" 256           # warm-up: the autotune cache
    run "$a" 128; run "$a" 256
    python3 - "$work/$a-128.log" "$work/$a-256.log" "$a" "$by_kernel" <<'EOF'
import collections, re, sys
def kernels(path):
    names = collections.Counter()
    for line in open(path):
        if line.startswith('| '):
            names[re.sub(r'<.*', '', ' | '.join(f.strip() for f in line.split('|')[2:4]))] += 1
        elif 'Executing' in line:
            names[re.sub(r'<.*', '', line.split('Executing', 1)[1].strip())] += 1
    return names
short, long = kernels(sys.argv[1]), kernels(sys.argv[2])
per_step = {k: (long[k] - short[k]) / 2 for k in short | long if long[k] != short[k]}
if sys.argv[4] == '1':
    print(f"== {sys.argv[3]}")
    for name, n in sorted(per_step.items(), key=lambda kv: -kv[1]):
        print(f"{n:8.1f}  {name}")
print(f"{sys.argv[3]:<12} {sum(per_step.values()):10.1f}")
EOF
done
