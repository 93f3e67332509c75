"""Shared pieces of Spate's benchmarks: build and run the native AMQP 1.0 load client
(clients/amqp_load.c), read a dev cluster's endpoints.json, machine facts, JSON output.

Every failure is a BenchError with a message that says what is missing and how to get it;
nothing here swallows an error.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CLIENT_DIR = HERE / "clients"
BUILD_SCRIPT = CLIENT_DIR / "build.sh"

BUILD_TIMEOUT_S = 120.0
CLIENT_GRACE_S = 30.0
"""Wall-clock allowance on top of the client's own --timeout before it is killed."""

# The standard workload (../shared/peers/README.md), one place.
COUNT = 200_000
SIZE_BYTES = 100
WINDOW = 10_000
CREDIT = 10_000
RATE_PER_S = 5_000
DURATION_S = 20.0
TIMEOUT_S = 300.0


class BenchError(RuntimeError):
    """A benchmark could not run or did not complete; the message says why."""


def log(msg: str) -> None:
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def build_client() -> Path:
    """Build (if stale) and return the path of the amqp_load binary."""
    if shutil.which("gcc") is None and not os.environ.get("CC"):
        raise BenchError("gcc not found: apt-get install gcc libqpid-proton11-dev")
    try:
        done = subprocess.run(
            ["bash", str(BUILD_SCRIPT)],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"building the load client took over {BUILD_TIMEOUT_S:.0f} s") from e
    if done.returncode != 0:
        raise BenchError(
            f"building the load client failed ({BUILD_SCRIPT}):\n{done.stderr.strip()}"
        )
    path = Path(done.stdout.strip().splitlines()[-1])
    if not os.access(path, os.X_OK):
        raise BenchError(f"build.sh reported {path}, which is not executable")
    return path


def run_client(
    binary: Path, mode: str, args: list[str], timeout_s: float, prefix: list[str] | None = None
) -> dict[str, Any]:
    """Run `amqp_load MODE ARGS --timeout T`; return its JSON result (error field may be set).

    prefix: a command to run the client under (e.g. `ip netns exec peers`)."""
    cmd = [*(prefix or []), str(binary), mode, *args, "--timeout", f"{timeout_s:g}"]
    log("$ " + shlex.join(cmd))
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s + CLIENT_GRACE_S, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise BenchError(
            f"load client did not exit within {timeout_s + CLIENT_GRACE_S:.0f} s: {shlex.join(cmd)}"
        ) from e
    if done.stderr.strip():
        for line in done.stderr.strip().splitlines()[-10:]:
            log("  client: " + line)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise BenchError(
            f"load client printed no result (exit {done.returncode}): "
            f"{shlex.join(cmd)}\n{done.stderr.strip()[-2000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    if done.returncode != 0 and not result.get("error"):
        result["error"] = f"client exit status {done.returncode}"
    return result


def read_endpoints(path: Path) -> dict[str, Any]:
    """Parse a `spate dev up` endpoints.json (a file, or the data dir holding it)."""
    if path.is_dir():
        path = path / "endpoints.json"
    if not path.is_file():
        raise BenchError(f"{path} not found: start the cluster with `spate dev up --data-dir DIR`")
    data: dict[str, Any] = json.loads(path.read_text())
    if not data.get("nodes"):
        raise BenchError(f"{path} lists no nodes")
    return data


def node_entry(endpoints: dict[str, Any], node_id: str | None) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = endpoints["nodes"]
    if node_id is None:
        return nodes[0]
    for n in nodes:
        if n.get("node_id") == node_id:
            return n
    raise BenchError(
        f"node {node_id!r} not in endpoints.json (have "
        f"{', '.join(str(n.get('node_id')) for n in nodes)})"
    )


def split_hostport(hostport: str) -> tuple[str, str]:
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise BenchError(f"not a HOST:PORT address: {hostport!r}")
    return host, port


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def machine() -> dict[str, Any]:
    """The facts RESULTS.md quotes with every figure."""
    return {
        "nproc": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg": loadavg(),
    }


def emit(result: dict[str, Any], out: Path | None = None) -> None:
    """One JSON line on stdout (and appended to `out`)."""
    result.setdefault("ts", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    line = json.dumps(result)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a") as f:
            f.write(line + "\n")


def proc_cpu_ticks(pid: int) -> int:
    """utime + stime of a process (all its threads), in clock ticks, from /proc/PID/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError as e:
        raise BenchError(f"process {pid} does not exist") from e
    # the command name (field 2) may hold spaces: split after its closing parenthesis
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)


def proc_minor_faults(pid: int) -> int:
    """Minor page faults of a process, all its threads (field 10 of proc(5)'s stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[7])


CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int | None:
    """VmRSS of a process in KiB (as run_bench.sh records for the peers), None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except FileNotFoundError:
        return None
    return None
