# Summarizes an ab1.sh log (RESULTS §59): per build, W1 msg/s and confirm p50 over all runs
# (median, min-max), runs below 7,500 msg/s, and the gateway's and nodes' RSS after each
# cluster's last run. Usage: absum.py LOG
import ast
import statistics
import sys
from collections import defaultdict

runs: dict[str, list[tuple[float, float]]] = defaultdict(list)
last: dict[str, list[tuple[int, list[int]]]] = defaultdict(list)
with open(sys.argv[1]) as log:
    lines = log.read().splitlines()
for line in lines:
    parts = line.split(" RUN ")
    if len(parts) != 2:
        continue
    build = parts[0].split()[0]
    rest = parts[1].split(" ", 1)[1]
    rows, tail = rest.split(" gw rss MiB ")
    rate, p50, _ = ast.literal_eval(rows)[0]
    runs[build].append((rate, p50))
    gw, nodes = tail.split(" nodes ")
    if parts[1].startswith("4 "):
        last[build].append((int(gw), ast.literal_eval(nodes)))
for build in sorted(runs):
    rates = [r for r, _ in runs[build]]
    p50s = [p for _, p in runs[build]]
    print(
        f"{build}: n={len(rates)} msg/s median {statistics.median(rates):.0f} "
        f"({min(rates):.0f}-{max(rates):.0f}), below 7500: {sum(r < 7500 for r in rates)}; "
        f"confirm p50 median {statistics.median(p50s):.0f} ({min(p50s):.0f}-{max(p50s):.0f}) ms; "
        f"RSS after 5 runs gateway {[g for g, _ in last[build]]} nodes max "
        f"{[max(n) for _, n in last[build]]}"
    )
