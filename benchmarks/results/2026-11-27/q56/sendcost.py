"""RESULTS §56: the CPU of a 100 B send over loopback TCP to a process waiting in epoll_wait,
back to back (`burst`: the reader stays busy) or one every 200 us (`gap`: the reader is asleep
at each send). Prints the sender's CPU per send (with `gap`, the 200 us spin included: subtract
it) and the reader's CPU per message.

    python3 benchmarks/results/2026-11-27/q56/sendcost.py burst
    python3 benchmarks/results/2026-11-27/q56/sendcost.py gap
"""

from __future__ import annotations

import os
import select
import socket
import sys
import time

N = 20000
SIZE = 100


def main() -> None:
    mode = sys.argv[1]
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    sender = socket.create_connection(server.getsockname())
    reader, _ = server.accept()
    for s in (sender, reader):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pid = os.fork()
    if pid == 0:
        poller = select.epoll()
        poller.register(reader.fileno(), select.EPOLLIN)
        got = 0
        while got < N * SIZE:
            poller.poll()
            got += len(reader.recv(1 << 20))
        os._exit(0)
    message = b"x" * SIZE
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(N):
        sender.send(message)
        if mode == "gap":
            end = time.perf_counter() + 0.0002
            while time.perf_counter() < end:
                pass
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    os.waitpid(pid, 0)
    times = os.times()
    child = (times.children_user + times.children_system) / N * 1e6
    print(
        f"{mode}: sender CPU per send {cpu / N * 1e6:.1f} us (wall {wall / N * 1e6:.1f} us), "
        f"reader CPU per message {child:.1f} us"
    )


if __name__ == "__main__":
    main()
