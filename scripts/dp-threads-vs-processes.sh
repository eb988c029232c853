#!/usr/bin/env bash
# Data parallelism on one machine, 2 replicas × 1 core: threads of one process against processes
# (`[cluster] ranks = 2, launch = "local"`), each against sequential training on one core, with a
# batch per replica (as DDP) and with the batch split. The seed comparison's models, data and
# training (experiments/seed_comparison_cpu.toml); for each seed and model the settings run one
# after the other, so that a noisy machine slows them alike. Prints speedup (mean ± std over the
# seeds) and holdout accuracy per model and setting.
# Usage: scripts/dp-threads-vs-processes.sh [TANDEM_BINARY] [SEEDS]   (default: target/release/tandem, "1 2 3")
# Needs a build with `--features mpi`, an MPI library, python3, and TANDEM_DATA_DIR (or datasets/ag_news).
set -euo pipefail
cd "$(dirname "$0")/.."
tandem="$(realpath "${1:-target/release/tandem}")"
seeds="${2:-1 2 3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 - "$work" $seeds <<'EOF'
import sys
work, seeds = sys.argv[1], sys.argv[2:]
source = open("experiments/seed_comparison_cpu.toml").read()
head, models = source[: source.index("[[strategies]]")], source[source.index("[[models]]") :].split("[[models]]")[1:]
dp = '[[strategies]]\nkind = "data-parallel"\nreplicas = {}\nall_reduce = "tree"\nsparse_embedding = true\n{}\n'
settings = {
    "sequential": ("", '[[strategies]]\nkind = "sequential"\n\n'),
    "threads-per-replica": ("", dp.format(2, 'batch = "per-replica"\n')),
    "processes-per-replica": ('[cluster]\nranks = 2\nlaunch = "local"\n\n', dp.format(1, 'batch = "per-replica"\n')),
    "threads-split": ("", dp.format(2, "")),
    "processes-split": ('[cluster]\nranks = 2\nlaunch = "local"\n\n', dp.format(1, "")),
}
for model in models:
    name = model.split('name = "')[1].split('"')[0]
    for seed in seeds:
        for setting, (cluster, strategy) in settings.items():
            text = head.replace("seeds = [1, 2, 3, 4, 5]", f"seeds = [{seed}]").replace("[data]", cluster + "[data]")
            open(f"{work}/{name}-{seed}-{setting}.toml", "w").write(text + strategy + "[[models]]" + model)
EOF
for seed in $seeds; do
  for model in cnn lstm gru transformer; do
    for setting in sequential threads-per-replica processes-per-replica threads-split processes-split; do
      echo "seed $seed, $model, $setting" >&2
      "$tandem" run "$work/$model-$seed-$setting.toml" --out "$work/results/$setting-$model-$seed" --offline > "$work/log" 2>&1 \
        || { cat "$work/log" >&2; exit 1; }
    done
  done
done
python3 - "$work/results" <<'EOF'
import glob, json, statistics, sys
runs = {}
for path in glob.glob(sys.argv[1] + "/*/*/*/summary.json"):
    setting, model, seed = path.split("/")[-4].rsplit("-", 2)
    summary = json.load(open(path))
    runs[setting, model, seed] = (summary["train_samples_per_second"], summary["best_accuracy"])
settings = ["threads-split", "processes-split", "threads-per-replica", "processes-per-replica"]
print("| model | sequential, 1 core | " + " | ".join(s.replace("-", " ") for s in settings) + " |")
print("|---|---:|" + "---:|" * len(settings))
for model in sorted({m for _, m, _ in runs}):
    seeds = sorted({s for _, m, s in runs if m == model})
    cells = [f"{statistics.mean(runs['sequential', model, s][0] for s in seeds):,.0f} samples/s, "
             f"{100 * statistics.mean(runs['sequential', model, s][1] for s in seeds):.1f} %"]
    for setting in settings:
        speedups = [runs[setting, model, s][0] / runs["sequential", model, s][0] for s in seeds]
        spread = statistics.stdev(speedups) if len(speedups) > 1 else 0.0
        accuracy = 100 * statistics.mean(runs[setting, model, s][1] for s in seeds)
        cells.append(f"{statistics.mean(speedups):.2f} ± {spread:.2f}×, {accuracy:.1f} %")
    print(f"| {model} | " + " | ".join(cells) + " |")
EOF
