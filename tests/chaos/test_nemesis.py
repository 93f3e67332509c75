"""chaos.nemesis: fault plans are a pure function of schedule and seed (replayable), stay inside
the run, leave healthy gaps; the disk faults damage what they say."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from chaos.nemesis import DISK_KINDS, SCHEDULES, damage, plan


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_plans_replay_from_the_seed_and_fit_the_run(name: str) -> None:
    schedule = SCHEDULES[name]
    faults = plan(schedule, 7, 600)
    assert faults == plan(schedule, 7, 600)
    assert faults != plan(schedule, 8, 600)
    assert {f.kind for f in faults} <= set(schedule.kinds)
    for before, after in itertools.pairwise(faults):
        assert after.at_s >= before.at_s + before.duration_s + schedule.gap_s[0] - 1e-6
    assert all(f.at_s + f.duration_s <= 600 for f in faults)


def test_disk_faults_damage_one_partition_file(tmp_path: Path) -> None:
    log = tmp_path / "partitions" / "s" / "0" / "log"
    log.mkdir(parents=True)
    segment = log / "00000000000000000000.segment"
    segment.write_bytes(bytes(1000))
    (log / "00000000000000000000.index").write_bytes(b"i" * 24)
    said = damage(tmp_path, "disk-truncate", 3)
    assert "cut" in said and segment.stat().st_size < 1000
    size = segment.stat().st_size
    said = damage(tmp_path, "disk-bitflip", 4)
    assert "flipped" in said and sum(segment.read_bytes()) > 0 and segment.stat().st_size == size
    said = damage(tmp_path, "disk-index", 5)
    assert "deleted" in said and not (log / "00000000000000000000.index").exists()
    assert set(DISK_KINDS) == {"disk-truncate", "disk-bitflip", "disk-index"}
    assert damage(tmp_path / "empty", "disk-bitflip", 1) == "no partition files yet"
