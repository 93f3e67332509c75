"""Node liveness's decision (liveness.py; issue 16, RESULTS §42): after how much silence a peer
node is silent (what leaders decide on) and suspected (what followers decide on), learned from
how late the peer has been. Pure: ticks and frames in, sets out."""

from __future__ import annotations

import pytest
from spate.core.errors import InvalidArgument
from spate.core.ids import NodeId
from spate.node.replication import host, limits
from spate.node.replication.liveness import Liveness

P = NodeId("n2")
BASE, MAX, WINDOW = 10, 40, 600


def silence(liveness: Liveness, ticks: int) -> list[tuple[int, str]]:
    """Tick `ticks` times without hearing P: what happened on which tick (1-based)."""
    events: list[tuple[int, str]] = []
    for tick in range(1, ticks + 1):
        went_silent, suspected = liveness.tick([P])
        events += [(tick, "silent") for _ in went_silent]
        events += [(tick, "suspected") for _ in suspected]
    return events


def punctual(liveness: Liveness, ticks: int = 1) -> None:
    for _ in range(ticks):
        liveness.tick([P])
        liveness.heard(P)


def test_a_punctual_peer_is_silent_and_suspected_after_one_election_timeout() -> None:
    liveness = Liveness(BASE, MAX, WINDOW)
    punctual(liveness, 100)
    assert silence(liveness, 30) == [(BASE, "silent"), (BASE, "suspected")]
    assert liveness.late == set() and liveness.lates == 0


def test_a_peer_heard_again_after_a_long_silence_is_suspected_later_next_time() -> None:
    """Heard again after 16 ticks of silence: next time it is silent at 10 ticks (leaders
    here act as before), late from then on (followers hold), suspected at 24 (16 * 1.5)."""
    liveness = Liveness(BASE, MAX, WINDOW)
    punctual(liveness, 5)
    silence(liveness, 16)
    assert liveness.heard(P) == (True, True)
    assert liveness.suspect_after(P) == 24
    punctual(liveness, 5)
    events = silence(liveness, 23)
    assert events == [(BASE, "silent")]
    assert liveness.late == {P} and P in liveness.silent and P not in liveness.suspected
    assert silence(liveness, 1) == [(1, "suspected")]  # the 24th tick
    assert liveness.late == set() and liveness.lates == 1
    assert liveness.heard(P) == (True, True)


def test_learned_lateness_is_capped_and_outages_teach_nothing() -> None:
    liveness = Liveness(BASE, MAX, WINDOW)
    liveness.tick([P])
    liveness.tick([P])  # first contact after two ticks: teaches nothing
    liveness.heard(P)
    silence(liveness, 1)
    liveness.heard(P)
    assert liveness.suspect_after(P) == BASE
    silence(liveness, MAX + 1)  # a restart, a cut: not lateness
    liveness.heard(P)
    assert liveness.suspect_after(P) == BASE
    silence(liveness, 30)
    liveness.heard(P)
    assert liveness.suspect_after(P) == MAX  # 45, capped


def test_lateness_is_forgotten_after_two_windows_and_when_the_link_closes() -> None:
    liveness = Liveness(BASE, MAX, window_ticks=100)
    punctual(liveness, 10)
    silence(liveness, 20)
    liveness.heard(P)
    assert liveness.suspect_after(P) == 30
    punctual(liveness, 100)
    assert liveness.suspect_after(P) == 30  # the window before still holds it
    punctual(liveness, 100)
    assert liveness.suspect_after(P) == BASE
    silence(liveness, 20)
    liveness.heard(P)
    assert liveness.suspect_after(P) == 30
    liveness.link_closed(P)  # its process closed its connection: a dead one is not late
    assert liveness.suspect_after(P) == BASE


def test_a_peer_no_longer_shared_is_forgotten() -> None:
    liveness = Liveness(BASE, MAX, WINDOW)
    silence(liveness, BASE)
    assert liveness.suspected == {P}
    liveness.tick([])
    assert liveness.suspected == liveness.silent == set() and liveness.peers == {}


def test_the_allowance_cap_comes_from_the_environment_when_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(host.LIVENESS_TICKS_MAX_ENV, raising=False)
    assert host.liveness_ticks_max() == limits.liveness_ticks_max
    monkeypatch.setenv(host.LIVENESS_TICKS_MAX_ENV, "10")
    assert host.liveness_ticks_max() == limits.liveness_ticks  # learning off
    for bad in ("9", "201", "2s"):
        monkeypatch.setenv(host.LIVENESS_TICKS_MAX_ENV, bad)
        with pytest.raises(InvalidArgument, match="SPATE_LIVENESS_TICKS_MAX must be an integer"):
            host.liveness_ticks_max()
