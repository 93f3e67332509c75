"""The node's garbage-collector policy (spate.server.gcpolicy; issue 16, RESULTS §42)."""

from __future__ import annotations

import gc

from spate.server import gcpolicy


def test_a_node_freezes_what_it_holds_once_it_opened_many_replicas() -> None:
    freezer = gcpolicy.Freezer()
    try:
        assert not freezer.after_opening(gcpolicy.FREEZE_GROWTH_REPLICAS - 1)
        assert gc.get_freeze_count() == 0
        assert freezer.after_opening(gcpolicy.FREEZE_GROWTH_REPLICAS)
        assert gc.get_freeze_count() > 0
        assert not freezer.after_opening(2 * gcpolicy.FREEZE_GROWTH_REPLICAS - 1)
        assert not freezer.after_opening(10)  # replicas closed: counted from there
        assert freezer.after_opening(10 + gcpolicy.FREEZE_GROWTH_REPLICAS)
    finally:
        gc.unfreeze()


def test_collection_pauses_are_timed_for_the_older_generations_only() -> None:
    pauses = gcpolicy.Pauses()
    gc.callbacks.append(pauses)
    try:
        gc.collect(0)
        gc.collect(1)
        gc.collect(2)
    finally:
        gc.callbacks.remove(pauses)
    assert [h.count for h in pauses.seconds] == [1, 1]
