"""Write the plots of `omni bench serve --json` results as PNG files, for docs/benchmarks.md
(the same figures `omni bench plot` puts in its HTML page).

    python benchmarks/bench_plot_images.py speech.json --out docs/images/bench-cosyvoice3-cpu

writes ``<out>-<plot>.png`` for each plot (``-latency.png``, ``-throughput.png``...).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from omni_core.bench.plots import plots


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="--json results; several are drawn on the same axes")
    parser.add_argument("--out", required=True, help="path prefix of the PNG files")
    parser.add_argument("--only", action="append", default=None,
                        help="write only the plots whose title contains this (repeatable)")
    args = parser.parse_args()
    runs = [(Path(path).stem, json.loads(Path(path).read_text())) for path in args.results]
    for plot in plots(runs):
        if args.only and not any(word in plot.title for word in args.only):
            continue
        slug = re.sub(r"[^a-z0-9]+", "-", plot.title.lower()).strip("-")
        target = Path(f"{args.out}-{slug}.png")
        target.write_bytes(plot.png)
        print(target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
