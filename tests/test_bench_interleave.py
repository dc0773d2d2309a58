"""bench_grouped.time_interleaved alternates the variants' replays and reports each one's own
median (CUDA events and graphs replaced by a fake clock, so this runs on the CPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_grouped


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.log: list[str] = []


class FakeEvent:
    clock: Clock

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.t = None

    def record(self) -> None:
        self.t = self.clock.now

    def elapsed_time(self, end: FakeEvent) -> float:
        return end.t - self.t  # milliseconds


class FakeGraph:
    def __init__(self, clock: Clock, name: str, ms: float) -> None:
        self.clock, self.name, self.ms = clock, name, ms

    def replay(self) -> None:
        self.clock.log.append(self.name)
        self.clock.now += self.ms


def test_variants_alternate_and_keep_their_own_times(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    FakeEvent.clock = clock
    monkeypatch.setattr(bench_grouped.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(bench_grouped.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench_grouped.torch.cuda, "_sleep",
                        lambda cycles: clock.log.append(f"sleep {cycles}"))
    monkeypatch.setattr(bench_grouped, "HOLD_BLOCK", 2)
    a = [FakeGraph(clock, "a0", 0.010), FakeGraph(clock, "a1", 0.030)]  # two input sets
    b = [FakeGraph(clock, "b0", 0.020)]
    assert bench_grouped.time_interleaved([a, b], reps=5) == pytest.approx([10.0, 20.0])
    # warm-up replays every graph once, then the variants alternate rep by rep, and each
    # variant rotates over its own input sets
    # variant rotates over its own input sets; a GPU spin (outside the timed events) holds
    # the GPU before every HOLD_BLOCK iterations, long enough for their replays
    hold = f"sleep {bench_grouped.HOLD_CYCLES_PER_REPLAY * 2 * 2}"
    # (the variants take turns at leading an iteration)
    assert clock.log == ["a0", "a1", "b0", hold, "a0", "b0", "b0", "a1", hold, "a0", "b0",
                         "b0", "a1", hold, "a0", "b0"]
    clock.log.clear()
    # Two variants over the same two input sets: consecutive replays never read the same set
    # (all variants replaying set i made the second one's weights L2-warm).
    b2 = [FakeGraph(clock, "b0", 0.020), FakeGraph(clock, "b1", 0.020)]
    bench_grouped.time_interleaved([a, b2], reps=4)
    replays = [e for e in clock.log[4:] if not e.startswith("sleep")]
    assert replays == ["a0", "b1", "b0", "a1", "a0", "b1", "b0", "a1"]
    assert all(x[1] != y[1] for x, y in zip(replays, replays[1:]))
    clock.log.clear()
    assert bench_grouped.time_graphs(a, reps=3) == pytest.approx(10.0)  # median of 10, 30, 10
    hold = f"sleep {bench_grouped.HOLD_CYCLES_PER_REPLAY * 2}"
    assert clock.log == ["a0", "a1", hold, "a0", "a1", hold, "a0"]
