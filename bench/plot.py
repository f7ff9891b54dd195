"""Throughput and TTFT against concurrency for several servers: one PNG, a JSON and a CSV.

    python bench/plot.py RESULTS.json [--out bench/results]

bench/compare.py writes the JSON (every server's bench/serve.py summary at each concurrency
level, with the machine's load) and calls `write` itself; this command redraws a saved one.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

COLUMNS = ("throughput_tok_s", "ttft_median_ms", "ttft_p90_ms", "itl_median_ms", "tpot_median_ms")


def write(results: dict[str, Any], out: Path, label: str) -> Path:
    """`results`: {"servers": {name: {level: summary}}, ...anything else to keep}; writes
    LABEL.json, LABEL.csv and LABEL.png under `out` and returns the PNG's path."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{label}.json").write_text(json.dumps(results, indent=1) + "\n")
    servers: dict[str, dict[str, dict[str, float]]] = results["servers"]
    with open(out / f"{label}.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["server", "concurrency", *COLUMNS])
        for name, levels in servers.items():
            for level, row in levels.items():
                writer.writerow([name, level, *(f"{row[c]:.2f}" for c in COLUMNS)])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, levels in servers.items():
        xs = [int(level) for level in levels]
        left.plot(xs, [row["throughput_tok_s"] for row in levels.values()], marker="o", label=name)
        right.plot(xs, [row["ttft_median_ms"] for row in levels.values()], marker="o", label=name)
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xticks(xs, [str(x) for x in xs])
        axis.legend()
    left.set(xlabel="concurrent clients", ylabel="output tokens/s", title="throughput")
    right.set(xlabel="concurrent clients", ylabel="ms", title="median time to first token")
    fig.suptitle(results.get("title", label), fontsize=9)
    fig.tight_layout()
    png = out / f"{label}.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def main() -> None:
    """Redraw a saved JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    print(write(json.loads(args.results.read_text()), args.out, args.results.stem))


if __name__ == "__main__":
    main()
