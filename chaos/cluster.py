"""A Spate cluster for chaos runs: three nodes and two proxy gateways, each a real process in its
own network namespace (chaos.netns) with its own address, so that network faults cut exactly
the links between hosts; process faults (kill -9, SIGSTOP/SIGCONT, restart) by PID.

The harness process stays in the root namespace, which reaches every host over the bridge;
clients (the workload) connect from there to the gateway's and the nodes' advertised addresses.
Every process is started by this module and stopped by its PID on close.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.netns import Host, Network

AMQP_PORT, ADMIN_PORT, METADATA_PORT, REPLICATION_PORT = 5672, 7600, 7700, 7800
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
CLI_TIMEOUT_S = 60.0
GATEWAY_REFRESH_MS = 500
GATEWAYS = ("g1", "g2")
"""Two gateways: clients list both, and fail over from one killed or cut off to the other."""
START_MARK = "=== chaos: started at"
START_ATTEMPTS = 3


class ExitedDuringStart(RuntimeError):
    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"{name} exited during start: {why}")
        self.name, self.why = name, why


@dataclass(eq=False)
class Process:
    name: str
    host: Host
    argv: list[str]
    data_dir: Path
    ready_file: str
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for its next start (a clock fault's $SPATE_CLOCK_OFFSET_MS)."""

    @property
    def pid(self) -> int | None:
        return None if self.proc is None or self.proc.poll() is not None else self.proc.pid

    @property
    def running(self) -> bool:
        return self.pid is not None


@dataclass(eq=False)
class ChaosCluster:
    root: Path
    nodes: int = 3
    voters: int = 0
    """Metadata voters: the first this many nodes (0: every node); the others start as
    non-voting replicas (`--metadata-observer`), which `spate cluster add-voter` promotes."""
    network: Network = field(default_factory=Network)
    secret: str = field(default_factory=lambda: secrets.token_hex(16))
    processes: dict[str, Process] = field(default_factory=dict)
    proxied: bool = False
    """Route every node-to-node link (replication and metadata), every gateway-to-node link
    and the clients' gateway link through Toxiproxy-style proxies (chaos.toxiproxy), so that
    faults can be put on one link: latency, bandwidth, resets, slicing, black holes."""
    proxies: dict[str, str] = field(default_factory=dict)
    """Proxy name -> its listen address; names are `<from>-<to>-<port>` and `client-g1`."""
    _toxiproxy: Any = None
    _toxiproxy_exit: Any = None
    tmpfs_bytes: int = 0
    """> 0: each node's data directory is a tmpfs of this size (mounted here, root), so that a
    fault can fill it (`fill_disk`); fsync costs nothing there, which changes no outcome of the
    process faults (a killed process loses nothing the kernel holds)."""
    _mounted: list[Path] = field(default_factory=list)
    start_retries: list[str] = field(default_factory=list)
    """Processes started again after exiting while starting (`start`), for the report."""

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.tmpfs_bytes:
            for i in range(self.nodes):
                mount = self.root / f"n{i + 1}"
                mount.mkdir(parents=True, exist_ok=True)
                subprocess.run(
                    ["mount", "-t", "tmpfs", "-o", f"size={self.tmpfs_bytes}", "tmpfs", str(mount)],
                    check=True,
                    capture_output=True,
                    timeout=CLI_TIMEOUT_S,
                )
                self._mounted.append(mount)
        hosts = [self.network.add_host(f"n{i + 1}") for i in range(self.nodes)]
        voting = hosts[: self.voters or self.nodes]
        for i, host in enumerate(hosts):
            peers = [f"{h.address}:{METADATA_PORT}" for h in voting if h is not host]
            name = f"n{i + 1}"
            argv = [
                sys.executable,
                "-m",
                "spate.cli.main",
                "node",
                "run",
                "--node-id",
                name,
                "--data-dir",
                str(self.root / name),
                "--host",
                host.address,
                "--amqp-port",
                str(AMQP_PORT),
                "--admin-port",
                str(ADMIN_PORT),
                "--metadata-port",
                str(METADATA_PORT),
                "--replication-port",
                str(REPLICATION_PORT),
                "--metadata-peers",
                ",".join(peers),
                # the harness (clients, admin) calls from the root namespace, not loopback
                "--allow-remote-anonymous",
            ]
            if host not in voting:
                argv.append("--metadata-observer")
            self.processes[name] = Process(name, host, argv, self.root / name, "node.json")
        for name in GATEWAYS:
            gateway = self.network.add_host(name)
            argv = [
                sys.executable,
                "-m",
                "spate.cli.main",
                "gateway",
                "run",
                "--gateway-id",
                name,
                "--admin",
                self.admin,
                "--data-dir",
                str(self.root / name),
                "--host",
                gateway.address,
                "--port",
                str(AMQP_PORT),
                "--refresh-ms",
                str(GATEWAY_REFRESH_MS),
                "--allow-remote-anonymous",
            ]
            self.processes[name] = Process(name, gateway, argv, self.root / name, "gateway.json")
        if self.proxied:
            self._route_through_proxies()

    def _route_through_proxies(self) -> None:
        """A proxy per (from, to, port) in the root namespace on the bridge's address, and a
        DNAT rule in the `from` host's namespace sending its connections to `to:port` there:
        nothing in Spate's configuration changes (the nodes still dial each other's advertised
        addresses), yet each direction of each link can be degraded alone."""
        import requests

        from chaos.toxiproxy import running

        self._toxiproxy_exit = running(host=self.network.gateway, port=0, seed=0)
        self._toxiproxy = self._toxiproxy_exit.__enter__()
        api = self._toxiproxy.url
        links = [
            (a, b, port)
            for a in self.node_names
            for b in self.node_names
            if a != b
            for port in (REPLICATION_PORT, METADATA_PORT)
        ] + [(g, b, REPLICATION_PORT) for g in GATEWAYS for b in self.node_names]
        for a, b, port in links:
            name = f"{a}-{b}-{port}"
            upstream = f"{self.host(b).address}:{port}"
            listen = f"{self.network.gateway}:0"
            answer = requests.post(
                f"{api}/proxies", json={"name": name, "listen": listen, "upstream": upstream}
            )
            answer.raise_for_status()
            self.proxies[name] = answer.json()["listen"]
            proxy_port = self.proxies[name].rsplit(":", 1)[1]
            self.host(a).nat(self.host(b).address, port, f"{self.network.gateway}:{proxy_port}")
        for gateway in GATEWAYS:
            answer = requests.post(
                f"{api}/proxies",
                json={
                    "name": f"client-{gateway}",
                    "listen": f"{self.network.gateway}:0",
                    "upstream": f"{self.host(gateway).address}:{AMQP_PORT}",
                },
            )
            answer.raise_for_status()
            self.proxies[f"client-{gateway}"] = answer.json()["listen"]

    @property
    def toxiproxy_url(self) -> str:
        assert self._toxiproxy is not None, "the cluster was made without proxied=True"
        return str(self._toxiproxy.url)

    # -- addresses

    @property
    def admin(self) -> str:
        return ",".join(f"{self.host(n).address}:{ADMIN_PORT}" for n in self.node_names)

    @property
    def node_names(self) -> list[str]:
        return [n for n in self.processes if n.startswith("n")]

    def host(self, name: str) -> Host:
        return self.processes[name].host

    @property
    def gateway_names(self) -> list[str]:
        return [n for n in self.processes if n.startswith("g")]

    def url(self, name: str = "g1") -> str:
        """A process's AMQP URL as the clients reach it (a gateway's through its client proxy
        when the cluster is proxied)."""
        if f"client-{name}" in self.proxies:
            return f"amqp://{self.proxies[f'client-{name}']}"
        return f"amqp://{self.host(name).address}:{AMQP_PORT}"

    # -- processes

    def start(self, name: str | None = None) -> None:
        """Start one process (or every one not running) and wait until each is ready. A
        process that exits while starting (e.g. a node that found no metadata leader within its
        ready timeout) is started again, up to START_ATTEMPTS times, as a supervisor (systemd's
        Restart=on-failure) would; each retry is noted in `start_retries` for the report."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start(name)
                return
            except ExitedDuringStart as exited:
                if attempt == START_ATTEMPTS:
                    raise
                self.start_retries.append(f"{exited.name} (attempt {attempt}): {exited.why}")
                time.sleep(1.0)

    def _start(self, name: str | None) -> None:
        names = [name] if name else list(self.processes)
        started = []
        for each in names:
            process = self.processes[each]
            if process.running:
                continue
            process.data_dir.mkdir(parents=True, exist_ok=True)
            (process.data_dir / process.ready_file).unlink(missing_ok=True)
            env = dict(os.environ, SPATE_METADATA_PASSWORD=self.secret, PYTHONUNBUFFERED="1")
            env |= process.env
            with open(process.data_dir / "process.log", "ab") as log:
                log.write(f"{START_MARK} {time.time():.3f}\n".encode())
                log.flush()
                process.proc = process.host.popen(
                    process.argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
            process.paused = False
            started.append(process)
        for process in started:
            self._wait_ready(process)

    def _wait_ready(self, process: Process) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        path = process.data_dir / process.ready_file
        while time.monotonic() < deadline:
            assert process.proc is not None
            if process.proc.poll() is not None:
                raise ExitedDuringStart(process.name, self.log_tail(process, lines=3))
            try:
                if json.loads(path.read_text()).get("pid") == process.proc.pid:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{process.name} not ready in {START_TIMEOUT_S:.0f} s")

    def save_logs(self, into: Path) -> None:
        """Copy every process's log (all its starts) to `into` (the run's report keeps them:
        the data directories are removed with the cluster)."""
        into.mkdir(parents=True, exist_ok=True)
        for process in self.processes.values():
            source = process.data_dir / "process.log"
            if source.exists():
                (into / f"{process.name}.log").write_bytes(source.read_bytes())

    def log_tail(self, process: Process, lines: int = 30) -> str:
        """The last lines its latest start wrote."""
        try:
            text = (process.data_dir / "process.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        latest = text.rsplit(START_MARK, 1)[-1]
        return "\n".join(latest.splitlines()[-lines:])

    def kill9(self, name: str) -> None:
        process = self.processes[name]
        if process.proc is not None and process.running:
            process.proc.send_signal(signal.SIGKILL)
            process.proc.wait(STOP_TIMEOUT_S)
        process.paused = False

    def pause(self, name: str) -> None:
        process = self.processes[name]
        if process.proc is not None and process.running:
            process.proc.send_signal(signal.SIGSTOP)
            process.paused = True

    def resume(self, name: str) -> None:
        process = self.processes[name]
        if process.proc is not None and process.running:
            process.proc.send_signal(signal.SIGCONT)
        process.paused = False

    def close(self) -> None:
        for process in self.processes.values():
            if process.proc is not None and process.running:
                if process.paused:
                    process.proc.send_signal(signal.SIGCONT)
                process.proc.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            if process.proc is not None:
                try:
                    process.proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.proc.kill()
                    process.proc.wait(STOP_TIMEOUT_S)
        if self._toxiproxy_exit is not None:
            self._toxiproxy_exit.__exit__(None, None, None)
        for mount in self._mounted:
            subprocess.run(["umount", str(mount)], check=False, capture_output=True, timeout=60)
        self.network.close()

    FILLER = "chaos-filler"

    def fill_disk(self, name: str) -> int:
        """Fill node `name`'s tmpfs data directory to the last byte; the bytes written."""
        assert self.tmpfs_bytes, "the cluster was made without tmpfs_bytes"
        path = self.processes[name].data_dir / self.FILLER
        written = 0
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (1 << 20, 1 << 16, 1 << 12, 1 << 8, 1):
                block = bytes(size)
                while True:
                    try:
                        done = os.write(fd, block)
                    except OSError:  # ENOSPC: on to smaller writes
                        break
                    written += done
                    if done < size:
                        break
        finally:
            os.close(fd)
        return written

    def free_disk(self, name: str) -> None:
        (self.processes[name].data_dir / self.FILLER).unlink(missing_ok=True)

    def __enter__(self) -> ChaosCluster:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- the admin API, through the CLI

    def cli(self, *args: str, at: str | None = None) -> Any:
        """`spate ARGS --admin NODE --output json`, parsed: tried on each running, unpaused
        node in turn while the answer is "unavailable" (exit 5: that node is cut off or has no
        metadata leader); only on node `at` when given."""
        live = [
            n for n in self.node_names if self.processes[n].running and not self.processes[n].paused
        ]
        error = "no node is running"
        for name in [at] if at else live or self.node_names:
            admin = f"{self.host(name).address}:{ADMIN_PORT}"
            command = [sys.executable, "-m", "spate.cli.main", *args]
            done = subprocess.run(
                [*command, "--admin", admin, "--output", "json", "--timeout", "5"],
                capture_output=True,
                text=True,
                timeout=CLI_TIMEOUT_S,
                check=False,
            )
            if done.returncode == 0:
                return json.loads(done.stdout) if done.stdout.strip() else None
            error = f"spate {' '.join(args)} at {name}: exit {done.returncode}: {done.stderr}"
            if done.returncode != 5:
                break
        raise RuntimeError(error)

    def leaders(self, stream: str) -> dict[int, str | None]:
        parts = self.cli("partition", "list", stream)["partitions"]
        return {int(p["partition"]): p["leader"] for p in parts}
