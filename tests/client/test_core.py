"""Scenarios for spate.client.core, no sockets: the producer's window, resend order and
exactly-once settlement; the connector's redirect cap, backoff and deadline; the consumer's
resume offsets and credit."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest
from spate.client.core import (
    ACCEPTED,
    Confirmed,
    Connector,
    ConsumerCore,
    Dial,
    Endpoint,
    Failed,
    GiveUp,
    Outcome,
    ProducerCore,
    Reconnect,
    StartSpec,
    Wait,
    backoff_max_ms,
    backoff_min_ms,
    encode_data,
    parse_url,
    redirect_hops_max,
    start_spec,
)
from spate.client.errors import AttachRefused, ConnectionLost, PublishRefused

REDIRECT_TO_N2 = Outcome(
    "rejected", "amqp:link:redirect", "not the leader", {"network-host": "n2", "port": 5673}
)
ELECTION = Outcome("rejected", "amqp:resource-locked", "election", {"spate:retryable": True})
TOO_BIG = Outcome("rejected", "amqp:link:message-size-exceeded", "too big")


def submit_all(core: ProducerCore[str], count: int) -> list[int]:
    sent = []
    for i in range(count):
        sequence, transfer = core.submit(b"m%d" % i, f"t{i}")
        assert transfer
        sent.append(sequence)
    return sent


# producer


def test_the_window_counts_unconfirmed_messages() -> None:
    core: ProducerCore[str] = ProducerCore(window=3, reconnecting=False)
    sent = submit_all(core, 3)
    assert not core.has_room() and core.unconfirmed == 3
    assert core.on_outcome(sent[1], ACCEPTED) == [Confirmed(sent[1], "t1")]
    assert core.has_room() and core.unconfirmed == 2
    assert core.oldest_unconfirmed() == sent[0]


def test_each_message_is_settled_exactly_once() -> None:
    core: ProducerCore[str] = ProducerCore(window=10, reconnecting=True)
    sent = submit_all(core, 3)
    assert core.on_outcome(sent[0], ACCEPTED) == [Confirmed(sent[0], "t0")]
    assert core.on_outcome(sent[0], ACCEPTED) == []  # a repeated disposition
    assert core.on_outcome(99, ACCEPTED) == []  # never sent
    [failed] = core.on_outcome(sent[1], TOO_BIG)
    assert isinstance(failed, Failed) and isinstance(failed.error, PublishRefused)
    assert failed.error.condition == "amqp:link:message-size-exceeded"
    assert core.on_outcome(sent[1], ACCEPTED) == []


def test_a_leader_change_resends_every_unconfirmed_message_in_order() -> None:
    core: ProducerCore[str] = ProducerCore(window=100, reconnecting=True)
    sent = submit_all(core, 5)
    core.on_outcome(sent[0], ACCEPTED)
    assert core.on_outcome(sent[2], REDIRECT_TO_N2) == [Reconnect()]
    assert core.state == "reconnecting"
    # Outcomes still arriving from the old link are ignored: those messages are resent.
    assert core.on_outcome(sent[1], ACCEPTED) == []
    assert core.on_outcome(sent[3], ELECTION) == []
    # Sends while reconnecting are kept, not transferred.
    late, transfer = core.submit(b"late", "late")
    assert not transfer
    assert core.on_lost(ConnectionError("x")) == []  # already reconnecting
    resend = core.on_attached()
    assert [sequence for sequence, _ in resend] == [*sent[1:], late]
    assert [data for _, data in resend] == [b"m1", b"m2", b"m3", b"m4", b"late"]
    for sequence in [*sent[1:], late]:
        assert core.on_outcome(sequence, ACCEPTED) == [
            Confirmed(sequence, f"t{sent.index(sequence)}" if sequence in sent else "late")
        ]
    assert core.unconfirmed == 0


def test_a_retryable_refusal_without_reconnecting_fails_that_message() -> None:
    core: ProducerCore[str] = ProducerCore(window=10, reconnecting=False)
    [sequence] = submit_all(core, 1)
    [failed] = core.on_outcome(sequence, ELECTION)
    assert isinstance(failed, Failed)
    assert isinstance(failed.error, PublishRefused) and failed.error.info["spate:retryable"]


def test_a_lost_connection_without_reconnecting_fails_everything_once_and_for_good() -> None:
    core: ProducerCore[str] = ProducerCore(window=10, reconnecting=False)
    sent = submit_all(core, 3)
    effects = core.on_lost(ConnectionError("reset"))
    assert [(e.sequence, e.token) for e in effects if isinstance(e, Failed)] == [
        (s, f"t{i}") for i, s in enumerate(sent)
    ]
    assert core.on_lost(ConnectionError("again")) == []
    with pytest.raises(ConnectionLost):
        core.submit(b"after", "after")


def test_giving_up_fails_every_unconfirmed_message_and_later_sends() -> None:
    core: ProducerCore[str] = ProducerCore(window=10, reconnecting=True)
    submit_all(core, 2)
    assert core.on_lost(ConnectionError("reset")) == [Reconnect()]
    error = ConnectionRefusedError("nobody")
    effects = core.on_gave_up(error)
    assert [e.error for e in effects if isinstance(e, Failed)] == [error, error]
    with pytest.raises(ConnectionLost):
        core.submit(b"x", "x")


def test_close_fails_what_is_unconfirmed_and_refuses_sends() -> None:
    core: ProducerCore[str] = ProducerCore(window=10, reconnecting=True)
    submit_all(core, 2)
    assert len(core.close()) == 2
    with pytest.raises(RuntimeError):
        core.submit(b"x", "x")
    assert core.on_attached() == []


@pytest.mark.parametrize("seed", range(20))
def test_random_outcomes_losses_and_reattaches_settle_every_message_once(seed: int) -> None:
    """Whatever the interleaving, every message is settled exactly once, accepted messages in
    the order they were confirmed on each link, and resends keep sequence order."""
    rng = random.Random(seed)
    core: ProducerCore[int] = ProducerCore(window=8, reconnecting=True)
    on_link: list[int] = []  # sequences transferred on the current link, in order
    settled: dict[int, str] = {}
    submitted = 0
    for _ in range(400):
        action = rng.random()
        effects: list[object] = []
        if action < 0.4 and core.has_room() and core.state != "broken":
            sequence, transfer = core.submit(b"x", submitted)
            submitted += 1
            if transfer:
                on_link.append(sequence)
        elif action < 0.8 and on_link and core.state == "attached":
            sequence = on_link.pop(0) if rng.random() < 0.8 else on_link.pop()
            outcome = rng.choice([ACCEPTED, ACCEPTED, ACCEPTED, TOO_BIG, ELECTION])
            effects = list(core.on_outcome(sequence, outcome))
        elif action < 0.9:
            effects = list(core.on_lost(ConnectionError("cut")))
        elif core.state == "reconnecting":
            resend = core.on_attached()
            assert [s for s, _ in resend] == sorted(s for s, _ in resend)
            on_link = [s for s, _ in resend]
        for effect in effects:
            if isinstance(effect, Reconnect):
                on_link = []
            elif isinstance(effect, Confirmed | Failed):
                assert effect.token not in settled, "settled twice"
                settled[effect.token] = type(effect).__name__
    while core.state == "reconnecting" or on_link:
        if core.state == "reconnecting":
            on_link = [s for s, _ in core.on_attached()]
        for sequence in on_link:
            for effect in core.on_outcome(sequence, ACCEPTED):
                assert isinstance(effect, Confirmed) and effect.token not in settled
                settled[effect.token] = "Confirmed"
        on_link = []
    assert core.unconfirmed == 0
    assert sorted(settled) == list(range(submitted))


# connector


def refused(condition: str, **info: object) -> AttachRefused:
    return AttachRefused(condition, "test", dict(info))


def test_redirects_are_followed_up_to_the_hop_cap_then_count_as_a_failure() -> None:
    connector = Connector(["amqp://n1:5672"], reconnect_timeout_ms=0)
    dial = connector.next_dial()
    assert dial == Dial("n1", 5672, 0)
    for hop in range(1, redirect_hops_max + 1):
        step = connector.on_refused(
            dial,
            refused("amqp:link:redirect", **{"network-host": f"n{hop}", "port": 5000 + hop}),
            0,
        )
        assert step == Dial(f"n{hop}", 5000 + hop, hop)
        dial = step
    step = connector.on_refused(
        dial, refused("amqp:link:redirect", **{"network-host": "loop", "port": 1}), 0
    )
    assert isinstance(step, GiveUp) and isinstance(step.error, AttachRefused)


def test_a_refusal_that_is_not_retryable_gives_up_at_once() -> None:
    connector = Connector(["n1:1", "n2:2"], reconnect_timeout_ms=60_000)
    step = connector.on_refused(connector.next_dial(), refused("amqp:not-found"), 0)
    assert isinstance(step, GiveUp) and step.error.condition == "amqp:not-found"  # type: ignore[attr-defined]


def test_failures_back_off_exponentially_over_the_urls_until_the_deadline() -> None:
    connector = Connector(["n1:1", "n2:2", "n3:3"], reconnect_timeout_ms=3_000)
    dials, delays, now = [], [], 0
    while True:
        dial = connector.next_dial()
        dials.append((dial.host, dial.port))
        step = connector.on_failed(ConnectionRefusedError(), now)
        if isinstance(step, GiveUp):
            break
        assert isinstance(step, Wait)
        delays.append(step.delay_ms)
        now += step.delay_ms
    assert dials[:4] == [("n1", 1), ("n2", 2), ("n3", 3), ("n1", 1)]
    assert delays[:3] == [backoff_min_ms, 2 * backoff_min_ms, 4 * backoff_min_ms]
    assert max(delays) == backoff_max_ms
    assert now >= 3_000


def test_without_reconnecting_each_url_is_still_tried_once() -> None:
    connector = Connector(["n1:1", "n2:2"], reconnect_timeout_ms=0)
    connector.next_dial()
    assert isinstance(connector.on_failed(ConnectionRefusedError(), 0), Wait)
    connector.next_dial()
    assert isinstance(connector.on_failed(ConnectionRefusedError(), 0), GiveUp)


def test_a_retryable_refusal_is_retried_for_the_attach_timeout_even_without_reconnecting() -> None:
    connector = Connector(["n1:1"], reconnect_timeout_ms=0, attach_timeout_ms=1_000)
    election = refused("amqp:resource-locked", **{"spate:retryable": True})
    assert isinstance(connector.on_refused(connector.next_dial(), election, 0), Wait)
    assert isinstance(connector.on_refused(connector.next_dial(), election, 999), Wait)
    assert isinstance(connector.on_refused(connector.next_dial(), election, 1_000), GiveUp)
    # but a lost connection is not retried
    connector = Connector(["n1:1"], reconnect_timeout_ms=0, attach_timeout_ms=1_000)
    assert isinstance(connector.on_failed(ConnectionResetError(), 0), GiveUp)


def test_a_dead_url_does_not_cut_short_the_retries_another_url_asked_for() -> None:
    """`spate perf --url DEAD,LIVE` right after a stream was created: LIVE refuses as
    retryable (the partition's election), the turn moves to DEAD, whose refused connection
    used to end the attempt at once (reconnecting off): the broker had said to come back."""
    connector = Connector(["n1:1", "n2:2"], reconnect_timeout_ms=0, attach_timeout_ms=1_000)
    election = refused("amqp:resource-locked", **{"spate:retryable": True})
    assert connector.next_dial().port == 1
    assert isinstance(connector.on_failed(ConnectionRefusedError(), 0), Wait)  # n1 is dead
    assert connector.next_dial().port == 2
    assert isinstance(connector.on_refused(Dial("n2", 2, 0, False), election, 10), Wait)
    assert connector.next_dial().port == 1
    assert isinstance(connector.on_failed(ConnectionRefusedError(), 20), Wait)  # was GiveUp
    assert isinstance(connector.on_failed(ConnectionRefusedError(), 1_000), GiveUp)


def test_attaching_resets_the_failure_budget() -> None:
    connector = Connector(["n1:1"], reconnect_timeout_ms=100)
    assert isinstance(connector.on_failed(ConnectionRefusedError(), 0), Wait)
    connector.on_attached()
    assert isinstance(connector.on_failed(ConnectionRefusedError(), 10_000), Wait)


# consumer


def test_a_resumed_consumer_starts_after_the_last_offset_it_handed_out() -> None:
    core = ConsumerCore("first", credit_window=10)
    assert core.resume_start() == "first"
    assert [core.on_message(offset, None) for offset in (0, 1, 2)] == [True] * 3
    assert core.resume_start() == 3
    # the new link starts at 3, but a broker may repeat: repeats are dropped
    assert [core.on_message(offset, None) for offset in (2, 3, 4)] == [False, True, True]
    assert core.last_offset == 4 and core.buffered == 5


def test_an_unbound_consumer_over_several_partitions_cannot_resume_exactly() -> None:
    core = ConsumerCore(-5, credit_window=10)
    core.on_message(7, "0")
    core.on_message(9, "1")
    with pytest.raises(ConnectionLost):
        core.resume_start()


def test_credit_counts_buffered_events_and_is_topped_up_at_half() -> None:
    core = ConsumerCore("first", credit_window=10)
    assert core.credit_to_grant(link_credit=0) == 10
    for offset in range(4):
        core.on_message(offset, None)
    assert core.credit_to_grant(link_credit=6) == 0  # 6 + 4 buffered: full
    for offset in range(4, 10):
        core.on_message(offset, None)
    assert core.credit_to_grant(link_credit=0) == 0  # 10 buffered, nobody reads
    core.on_taken(4)
    assert core.credit_to_grant(link_credit=0) == 0  # 6 buffered > half
    core.on_taken(1)
    assert core.credit_to_grant(link_credit=0) == 5  # back up to the window
    core.on_taken(5)
    assert core.credit_to_grant(link_credit=5) == 5


def test_only_events_handed_out_on_the_current_link_have_deliveries_to_accept() -> None:
    """A named consumer (ADR 0012) accepts what the application finished with; events from a
    lost link have no delivery left to settle, whatever order the counts arrive in."""
    core = ConsumerCore("stored", credit_window=10)
    for offset in range(5):
        core.on_message(offset, None)
    assert core.on_finished(2) == 2  # offsets 0, 1: accept two on this link
    core.on_relinked()  # 2, 3, 4 were handed out on the lost link
    for offset in (3, 4, 5, 6):  # the new link starts at 5: 3 and 4 are repeats
        core.on_message(offset, None)
    assert core.on_finished(2) == 0  # 2, 3: stale
    assert core.on_finished(2) == 1  # 4 stale, 5 on this link
    assert core.on_finished(1) == 1 and core.unfinished == 0 and core.stale == 0
    with pytest.raises(AssertionError):
        core.on_finished(1)


def test_a_manual_commit_reports_events_finished_on_a_lost_link_it_cannot_store() -> None:
    """Voters seed 1: a group member took 610-614, its link was lost and reattached, and its
    next `commit()` had nothing on the new link to accept: it must not answer as if it had
    committed (the client raises `ConnectionLost`). A commit that accepts a delivery on the
    new link covers them (its offset is past theirs)."""
    core = ConsumerCore("stored", credit_window=10)
    for offset in range(3):
        core.on_message(offset, None)
    core.on_relinked()  # 0, 1, 2 handed out on the lost link
    assert core.on_finished(3) == 0
    assert core.on_commit(0) == 3  # nothing to accept: three events left uncommitted
    assert core.on_commit(0) == 0  # reported once
    core.on_message(3, None)
    core.on_relinked()
    core.on_message(4, None)
    assert core.on_finished(2) == 1  # 3 stale, 4 on this link
    assert core.on_commit(1) == 0  # accepting 4 stores an offset past 3


def test_start_specs() -> None:
    assert start_spec("stored") == StartSpec("stored")
    assert start_spec("first") == StartSpec("earliest")
    assert start_spec("next") == StartSpec("latest")
    assert start_spec("last") == StartSpec("last")
    assert start_spec(0) == StartSpec("earliest")
    assert start_spec(10) == StartSpec("after-offset", 9)
    assert start_spec(-3) == StartSpec("relative", -3)
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    assert start_spec(moment) == StartSpec("after-timestamp", int(moment.timestamp() * 1000) - 1)
    with pytest.raises(ValueError):
        start_spec("soon")
    with pytest.raises(TypeError):
        start_spec(True)


def test_data_sections_are_framed_by_length() -> None:
    assert encode_data(b"ab") == b"\x00\x53\x75\xa0\x02ab"
    assert encode_data(b"x" * 256)[:8] == b"\x00\x53\x75\xb0\x00\x00\x01\x00"


def test_amqps_urls_dial_over_tls_and_a_redirect_keeps_it() -> None:
    """amqps:// (default port 5671) dials over TLS; the redirect it gets names only a host and
    port (amqp:link:redirect info), and the client keeps TLS for it: a cluster serves AMQP over
    TLS on every listener or on none."""
    assert parse_url("amqps://gw.example") == Endpoint("gw.example", 5671, True)
    assert parse_url("amqp://gw.example") == Endpoint("gw.example", 5672, False)
    assert parse_url("n1:7000") == Endpoint("n1", 7000, False)
    for bad in ("http://n1:80", "amqps://n1:notaport"):
        with pytest.raises(ValueError, match="amqp"):
            parse_url(bad)
    connector = Connector(["amqp://plain:1", "amqps://secure:2"], reconnect_timeout_ms=0)
    assert connector.tls
    assert connector.next_dial() == Dial("plain", 1, 0, tls=False)
    dial = connector.next_dial()
    assert dial == Dial("secure", 2, 0, tls=True)
    step = connector.on_refused(
        dial, refused("amqp:link:redirect", **{"network-host": "n3", "port": 3}), 0
    )
    assert step == Dial("n3", 3, 1, tls=True)
    assert not Connector(["amqp://a:1"], reconnect_timeout_ms=0).tls


def test_on_messages_is_on_message_for_a_run() -> None:
    """A run of a partition's deliveries: repeats (at or below the last handed out) are left
    out, the rest counted as one by one."""
    one, many = ConsumerCore("first", credit_window=100), ConsumerCore("first", credit_window=100)
    for offsets in ([3, 4, 5], [4, 5, 6, 7], [7], [9, 12]):
        kept = [o for o in offsets if one.on_message(o, None)]
        assert offsets[many.on_messages(offsets, None) :] == kept
        assert (many.last_offset, many.buffered, many.unfinished) == (
            one.last_offset,
            one.buffered,
            one.unfinished,
        )
