"""`spate node run --shards N`: run one node as N shard processes and supervise them (ADR 0032).

Each shard is a whole node process (its own id, data directory, ports, Raft groups and AMQP
listener; `settings.shard_settings` derives them), so a host uses N cores where one Python process
uses one. This process only starts and watches them:

- it starts shard i as `python -m spate.server.shards NODE_ID DATA_DIR` and writes the shard's
  settings to its stdin as JSON (so secrets never appear in an argument list or environment);
- a shard that exits while the node runs is logged with its exit status and started again after
  `restart_backoff_s` (doubled, up to `restart_backoff_max_s`, while it keeps dying within
  `restart_stable_s` of its start): like systemd's `Restart=on-failure` for one shard, without
  stopping the shards that still serve;
- SIGTERM or SIGINT stops every shard (SIGTERM, then SIGKILL after `stop_timeout_s`), then it
  exits 0; a supervisor killed outright takes its shards down too (each gets SIGTERM from the
  kernel: PR_SET_PDEATHSIG).

One supervisor per node keeps what operators run unchanged: one command, one unit, one config
file. Operators who want one systemd unit per shard run `spate node run` once per shard with the
shard's own id, directory, ports and `--failure-domain` instead (docs/deploy.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

from spate.server import logs
from spate.server.settings import NodeSettings, check_fields, shard_settings

log = logging.getLogger(__name__)

restart_backoff_s = 1.0
restart_backoff_max_s = 30.0
restart_stable_s = 10.0
"""A shard that ran this long before exiting is restarted after `restart_backoff_s` again."""
stop_timeout_s = 20.0
poll_s = 0.2
PR_SET_PDEATHSIG = 1


def settings_json(settings: NodeSettings) -> str:
    values: dict[str, Any] = asdict(settings)
    return json.dumps(
        {
            k: str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v
            for k, v in values.items()
        }
    )


def settings_from_json(text: str) -> NodeSettings:
    values = check_fields(json.loads(text), NodeSettings, "shard settings")
    settings = NodeSettings(**values)
    settings.validate()
    return settings


class _Shard:
    def __init__(self, settings: NodeSettings) -> None:
        self.settings = settings
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.backoff_s = restart_backoff_s
        self.restart_at: float | None = None

    def start(self) -> None:
        s = self.settings
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "spate.server.shards", s.node_id, str(s.data_dir)],
            stdin=subprocess.PIPE,
            # its own session: a Ctrl-C reaches the supervisor, which stops the shards in order
            start_new_session=True,
            preexec_fn=_stop_with_parent,  # noqa: PLW1509 (the supervisor runs no threads)
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(settings_json(s).encode())
        self.proc.stdin.close()
        self.started_at = time.monotonic()
        self.restart_at = None
        log.info("started shard %s (pid %d)", s.node_id, self.proc.pid)


def _stop_with_parent() -> None:
    """In the shard, before exec: SIGTERM it when the supervisor dies, even by SIGKILL (Linux
    PR_SET_PDEATHSIG), so no shard outlives its node's unit."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def supervise(settings: NodeSettings) -> int:
    """Run shards 0..settings.shards-1 until SIGTERM/SIGINT; returns the exit code."""
    logs.configure(settings.log_format, settings.node_id, os.environ.get("SPATE_LOG_LEVEL", "INFO"))
    shards = [_Shard(shard_settings(settings, i)) for i in range(settings.shards)]
    stopping = False

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for shard in shards:
        shard.start()
    log.info(
        "node %s runs as %d shards: %s",
        settings.node_id,
        len(shards),
        ", ".join(s.settings.node_id for s in shards),
    )
    while not stopping:
        time.sleep(poll_s)
        now = time.monotonic()
        for shard in shards:
            assert shard.proc is not None
            if shard.restart_at is None:
                code = shard.proc.poll()
                if code is None:
                    continue
                if now - shard.started_at >= restart_stable_s:
                    shard.backoff_s = restart_backoff_s
                log.error(
                    "shard %s (pid %d) exited with status %d; starting it again in %.0f s",
                    shard.settings.node_id,
                    shard.proc.pid,
                    code,
                    shard.backoff_s,
                )
                shard.restart_at = now + shard.backoff_s
                shard.backoff_s = min(restart_backoff_max_s, shard.backoff_s * 2)
            elif now >= shard.restart_at and not stopping:
                shard.start()
    for shard in shards:
        if shard.proc is not None and shard.proc.poll() is None:
            shard.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + stop_timeout_s
    for shard in shards:
        if shard.proc is None:
            continue
        try:
            shard.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error(
                "shard %s did not stop in %.0f s: killing it",
                shard.settings.node_id,
                stop_timeout_s,
            )
            shard.proc.kill()
            shard.proc.wait()
    log.info("node %s: every shard stopped", settings.node_id)
    return 0


def _child_main() -> int:
    """One shard: its settings come on stdin (argv only names it for `ps`)."""
    from spate.server.node_process import main_run

    return main_run(settings_from_json(sys.stdin.read()))


if __name__ == "__main__":
    sys.exit(_child_main())
