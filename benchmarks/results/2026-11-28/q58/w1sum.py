# A measurement script kept as it was run (RESULTS §58): w1_cpu.py rows' medians by size, build.
import json
import statistics as st
import sys
from pathlib import Path

rows = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines()]
for size in sorted({r["size"] for r in rows}):
    for m in sorted({r["label"][0] for r in rows}):
        rs = [r for r in rows if r["size"] == size and r["label"][0] == m]
        lead = [r["cpu_us_per_msg"]["leader"] for r in rs]
        tot = [r["cpu_us_per_msg"]["total"] for r in rs]
        rate = [r["msgs_per_s"] for r in rs]
        print(
            f"{size:6d} {m} rate {st.median(rate):9.0f} ({min(rate):.0f}-{max(rate):.0f})  "
            f"leader {st.median(lead):6.1f} {lead}  total {st.median(tot):6.1f} {tot}"
        )
