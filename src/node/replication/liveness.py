"""Node liveness (ADR 0026 and its addenda): how long a peer node may stay silent before this
node gives up on it, learned from how late that peer has been. Pure: the driver calls `tick()`
on each of its ticks and `heard(peer)` for every frame; no clock, no I/O.

Every node sends each peer a PING every tick, so a peer whose loop runs is heard from at least
once a tick. Silence is counted in this node's own ticks; the host's ticker does not burst
after a stall of this node's loop, so a node that stalled itself counts one tick for it, not
the silence it did not observe.

Two thresholds per peer (issue 16, RESULTS §42):

    silence (ticks) 0 ............ liveness_ticks ............ suspect_after(peer) ...........
    state           heard            SILENT and LATE              SILENT and SUSPECTED
                                     (followers hold their        (followers of its groups
                                     campaigns and leases)        campaign: it is dead)

- `silent`: silent for `liveness_ticks` (one election timeout), always. What a leader here
  decides from it keeps the timing ADR 0015's settle rule relies on: a quiet leader whose
  silent voters leave it no quorum steps down an election timeout later; a leader may go quiet
  without a silent peer's acknowledgement.
- `suspected`: silent for `suspect_after(peer)` ticks: `liveness_ticks` for a peer that has
  been punctual, up to `liveness_ticks_max` for one that was heard from again after long
  silences lately (one and a half times the longest in the last one to two
  `window_ticks`). What followers here decide from it (waking to elect a leader elsewhere)
  tolerates the lateness that peer has shown: a node whose loop stalls for a second every few
  seconds (a full garbage collection, a long batch, a scheduler that gives it no core) is late,
  not dead, and its leaders are kept. A punctual node that dies is suspected as fast as ever.
- `late`: silent but not yet suspected. The Raft cores read it (`Raft.late_peers`): a follower
  whose leader's node is late neither campaigns nor grants a vote, as if within its lease.

Lateness is learned only from silences that ended: the peer was heard from again. A silence
longer than `liveness_ticks_max` is an outage (a restart, a cut), not lateness, and the first
contact with a peer teaches nothing; neither raises the threshold. A link the peer's process
closed (`link_closed`: a dead process's sockets close, a stalled one's do not) forgets what was
learned, so a killed node is suspected after `liveness_ticks` even if it was late before.
"""

from __future__ import annotations

from dataclasses import dataclass

from spate.core.ids import NodeId

LATE_WINDOW_TICKS = 600
"""Lateness is remembered for one to two windows (30-60 s at the default 50 ms tick)."""


@dataclass(slots=True)
class PeerLiveness:
    silence: int = 0
    """Ticks since this peer was last heard from."""
    heard_once: bool = False
    peak: int = 0
    """The longest silence this peer was heard from again after, in the current window..."""
    previous_peak: int = 0
    """... and in the window before."""


class Liveness:
    def __init__(
        self, liveness_ticks: int, liveness_ticks_max: int, window_ticks: int = LATE_WINDOW_TICKS
    ) -> None:
        assert 0 < liveness_ticks <= liveness_ticks_max and window_ticks > 0
        self.liveness_ticks = liveness_ticks
        self.liveness_ticks_max = liveness_ticks_max
        self.window_ticks = window_ticks
        self.peers: dict[NodeId, PeerLiveness] = {}
        self.silent: set[NodeId] = set()
        self.suspected: set[NodeId] = set()
        self.late: set[NodeId] = set()
        """`silent - suspected`, kept as a set the Raft cores share."""
        self._ticks = 0
        self.lates = 0
        """Times a peer went silent without being suspected (its learned lateness)."""

    def suspect_after(self, peer: NodeId) -> int:
        """Ticks of silence after which `peer` is suspected."""
        state = self.peers.get(peer)
        if state is None:
            return self.liveness_ticks
        peak = max(state.peak, state.previous_peak)
        return min(self.liveness_ticks_max, max(self.liveness_ticks, peak + peak // 2))

    def tick(self, peers: list[NodeId]) -> tuple[list[NodeId], list[NodeId]]:
        """One tick of this node: every peer in `peers` has been silent one tick more.
        Returns the peers that went silent and those suspected on this tick (a punctual
        peer's are the same tick)."""
        self._ticks += 1
        rotate = self._ticks % self.window_ticks == 0
        wanted = set(peers)
        for gone in [p for p in self.peers if p not in wanted]:
            self.forget(gone)
        went_silent: list[NodeId] = []
        suspected: list[NodeId] = []
        for peer in peers:
            state = self.peers.get(peer)
            if state is None:
                state = self.peers[peer] = PeerLiveness()
            if rotate:
                state.previous_peak, state.peak = state.peak, 0
            state.silence += 1
            if state.silence >= self.liveness_ticks and peer not in self.silent:
                self.silent.add(peer)
                went_silent.append(peer)
            if peer in self.silent and peer not in self.suspected:
                if state.silence >= self.suspect_after(peer):
                    self.suspected.add(peer)
                    self.late.discard(peer)
                    suspected.append(peer)
                elif peer not in self.late:
                    self.late.add(peer)
                    self.lates += 1
        return went_silent, suspected

    def heard(self, peer: NodeId) -> tuple[bool, bool]:
        """A frame from `peer`. Returns (it was silent, it was suspected)."""
        state = self.peers.get(peer)
        if state is None:
            return False, False
        silence, state.silence = state.silence, 0
        if state.heard_once and silence <= self.liveness_ticks_max and silence > state.peak:
            state.peak = silence
        state.heard_once = True
        if peer not in self.silent:
            return False, False
        self.silent.discard(peer)
        self.late.discard(peer)
        suspected = peer in self.suspected
        self.suspected.discard(peer)
        return True, suspected

    def link_closed(self, peer: NodeId) -> None:
        """`peer`'s process closed its connection to this node: forget its lateness (a dead
        process is suspected after `liveness_ticks`; a late one's connections stay open)."""
        state = self.peers.get(peer)
        if state is not None:
            state.peak = state.previous_peak = 0

    def forget(self, peer: NodeId) -> None:
        """`peer` no longer shares a group with this node."""
        self.peers.pop(peer, None)
        self.silent.discard(peer)
        self.suspected.discard(peer)
        self.late.discard(peer)
