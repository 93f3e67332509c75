# ruff: noqa: SIM115, E501  (a measurement script kept as it was run, RESULTS §57)
# RESULTS §57: the ADR 0045 build's wire stamps (src/e2etrace.py = ../../2026-11-27/q50/e2etrace.py + e2etrace-delay.txt)
# Apply the §50 trace patch minus wire_server/remote parts, then stamp the new wire_server and remote.py
p = "/work/main/src/node/wire_server.py"
s = open(p).read()
s = s.replace(
    """        if not self.out:
            if self._flush_with is not None:""",
    """        if not self.out:
            import time; self._t0 = time.time_ns()
            if self._flush_with is not None:""",
)
s = s.replace(
    """    def flush(self) -> None:
        if self.out and not self.closed""",
    """    def flush(self) -> None:
        from spate import e2etrace; e2etrace.delay("w_flush_wait", getattr(self, "_t0", 0))
        if self.out and not self.closed""",
)
s = s.replace(
    """            partition.propose(records, outcome.done, producer)""",
    """            from spate import e2etrace; e2etrace.stamp("w_append", records); outcome.records = records
            partition.propose(records, outcome.done, producer)""",
)
s = s.replace(
    """            self.now = _ANSWERED
            self.session._appended(self.request, outcome)""",
    """            self.now = _ANSWERED
            from spate import e2etrace; e2etrace.stamp("w_appended", self.records)
            self.session._appended(self.request, outcome)""",
)
s = s.replace(
    """    __slots__ = ("now", "request", "session")""",
    """    __slots__ = ("now", "request", "session", "records")""",
)
s = s.replace(
    """                self.send(wire.encode_records(state.sub, first, chunk.timestamp_ms, records))
                state.next_offset = first + len(records)""",
    """                from spate import e2etrace; e2etrace.stamp("w_push", records)
                self.send(wire.encode_records(state.sub, first, chunk.timestamp_ms, records))
                state.next_offset = first + len(records)""",
)
assert s.count("e2etrace") == 8, s.count("e2etrace")
open(p, "w").write(s)
p = "/work/main/src/gateway/remote.py"
s = open(p).read()
s = s.replace(
    """            self.loop.call_soon(self._flush)
        self._out.append(data)""",
    """            self.loop.call_soon(self._flush)
            import time; self._t0 = time.time_ns()
        self._out.append(data)""",
)
s = s.replace(
    """    def _flush(self) -> None:
        writer = self._writer""",
    """    def _flush(self) -> None:
        from spate import e2etrace; e2etrace.delay("g_flush_wait", getattr(self, "_t0", 0))
        writer = self._writer""",
)
s = s.replace(
    """            if pending is not None:
                pending.writer.appended(pending, Offset(first))""",
    """            if pending is not None:
                from spate import e2etrace; e2etrace.stamp("g_appended", pending.records)
                pending.writer.appended(pending, Offset(first))""",
)
s = s.replace(
    """            sub, first, timestamp_ms, records = wire.decode_records(body)
            reader = self.readers.get(sub)""",
    """            sub, first, timestamp_ms, records = wire.decode_records(body)
            from spate import e2etrace; e2etrace.stamp("g_records", records)
            reader = self.readers.get(sub)""",
)
assert s.count("e2etrace") == 6, s.count("e2etrace")
open(p, "w").write(s)
