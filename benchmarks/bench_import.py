"""Import cost: what `import flashcompress` (plus first API access) adds to `import torch`.

Target (issue 2): at most 0.5 s on top of torch's own import.  Each figure is the
median of fresh interpreter runs.   python benchmarks/bench_import.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CASES = {
    "import torch": "import torch",
    "import torch, flashcompress": "import torch, flashcompress",
    "... + API access (plans, api, backends)": "import torch, flashcompress; flashcompress.compress_forward",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    timer = "import time; t = time.perf_counter(); {stmt}; print(time.perf_counter() - t)"
    results = {}
    for name, stmt in CASES.items():
        runs = [float(subprocess.run([sys.executable, "-c", timer.format(stmt=stmt)], capture_output=True,
                                     text=True, check=True).stdout) for _ in range(args.runs)]
        results[name] = statistics.median(runs)
    base = results["import torch"]
    print(f"{'case':45s} {'median s':>9s} {'over torch':>11s}")
    for name, t in results.items():
        print(f"{name:45s} {t:9.3f} {t - base:+11.3f}")


if __name__ == "__main__":
    main()
