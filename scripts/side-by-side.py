#!/usr/bin/env python3
"""Tandem beside PyTorch on the same GPU: joins the throughput benchmark's JSON lines
(TANDEM_BENCH_JSON, the Tandem variant on one backend) with benches/pytorch_reference.py's
and prints one markdown row per architecture and batch size.

    scripts/side-by-side.py TANDEM_JSONL PYTORCH_JSONL [--backend cuda]
"""

import argparse
import json


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def figure(value, digits=0):
    return "—" if value is None else f"{value:,.{digits}f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tandem")
    parser.add_argument("pytorch")
    parser.add_argument("--backend", default="cuda")
    args = parser.parse_args()
    tandem = {
        (r["architecture"], r["batch"]): r
        for r in read(args.tandem)
        if r["backend"] == args.backend and r["variant"] == "tandem"
    }
    pytorch = {(r["architecture"], r["batch"]): r for r in read(args.pytorch)}
    print(
        f"| architecture | batch | Tandem ({args.backend}), samples/s | PyTorch, samples/s "
        "| Tandem / PyTorch | Tandem kernels/step | PyTorch kernels/step |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for key in sorted(set(tandem) | set(pytorch)):
        t, p = tandem.get(key, {}), pytorch.get(key, {})
        ts, ps = t.get("samples_per_second"), p.get("samples_per_second")
        ratio = f"**{ts / ps:.2f}×**" if ts and ps else "—"
        print(
            f"| {key[0]} | {key[1]} | {figure(ts)} | {figure(ps)} | {ratio} "
            f"| {figure(t.get('kernels_per_step'))} | {figure(p.get('kernels_per_step'))} |"
        )
    precisions = sorted({r["precision"] for r in pytorch.values() if "precision" in r})
    reads = sorted({r["host_reads_per_step"] for r in tandem.values() if "host_reads_per_step" in r})
    print()
    print("Tandem: f32 throughout (CubeCL's kernels; its matmul picks the instruction); host reads per step:")
    print(f"{', '.join(f'{r:g}' for r in reads) or 'not recorded'}. PyTorch: {'; '.join(precisions) or 'not recorded'};")
    print("no reads within a step. Both: warm-up excluded, timed between device syncs.")


if __name__ == "__main__":
    main()
