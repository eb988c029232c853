#!/usr/bin/env python3
"""GPU time per kernel from CubeCL's profile log (CUBECL_DEBUG_OPTION=profile): one markdown row
per kernel name, the most time first, with its launches, total and mean time and share of the
profiled time. In profile mode CubeCL waits for every kernel and times it alone, so the times are
each kernel's own, without overlap; the shares are what to read.

    CUBECL_DEBUG_LOG=run.log CUBECL_DEBUG_OPTION=profile <a Tandem program>
    scripts/kernel-times.py run.log [--top 15]
"""

import argparse
import re
import sys
from collections import defaultdict

# `| {duration:<10?} | {name}`: one line per profiled kernel (Rust's Debug format of a Duration).
LINE = re.compile(r"^\| (\d+(?:\.\d+)?)(ns|µs|us|ms|s)\s+\| (.+)$")
SECONDS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def short(name):
    """The kernel's name without its generic arguments and with at most its last two path parts."""
    name = re.split(r"[<( ]", name.strip(), maxsplit=1)[0]
    return "::".join(name.split("::")[-2:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log")
    parser.add_argument("--top", type=int, default=15, help="rows to print (the rest summed in one)")
    args = parser.parse_args()
    totals, counts = defaultdict(float), defaultdict(int)
    with open(args.log, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = LINE.match(line.rstrip("\n"))
            if m:
                name = short(m.group(3))
                totals[name] += float(m.group(1)) * SECONDS[m.group(2)]
                counts[name] += 1
    everything = sum(totals.values())
    if not everything:
        sys.exit(f"{args.log}: no profiled kernels (was CUBECL_DEBUG_OPTION=profile set?)")
    rows = sorted(totals, key=totals.get, reverse=True)
    print("| kernel | launches | total, ms | mean, µs | share |")
    print("|---|---:|---:|---:|---:|")
    for name in rows[: args.top]:
        t, n = totals[name], counts[name]
        print(f"| {name} | {n} | {t * 1e3:.2f} | {t / n * 1e6:.1f} | {100 * t / everything:.1f} % |")
    rest = rows[args.top :]
    if rest:
        t, n = sum(totals[r] for r in rest), sum(counts[r] for r in rest)
        print(f"| {len(rest)} others | {n} | {t * 1e3:.2f} | {t / n * 1e6:.1f} | {100 * t / everything:.1f} % |")
    print(f"| all | {sum(counts.values())} | {everything * 1e3:.2f} | | 100 % |")


if __name__ == "__main__":
    main()
