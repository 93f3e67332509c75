"""Prometheus file-discovery targets from `spate dev status --output json` (stdin) or a
status file: writes targets/spate.json next to this script, or to the path given.

    spate dev status --output json | python3 deploy/prometheus/targets.py [OUT]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from urllib.parse import urlsplit


def targets(status: dict[str, object]) -> list[dict[str, object]]:
    by_role: dict[str, list[str]] = {}
    processes = status.get("processes", [])
    assert isinstance(processes, list)
    for process in processes:
        url = process.get("metrics")
        if url:
            by_role.setdefault(str(process["role"]), []).append(urlsplit(url).netloc)
    return [{"targets": hosts, "labels": {"role": role}} for role, hosts in by_role.items()]


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "targets/spate.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(targets(json.load(sys.stdin)), indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
