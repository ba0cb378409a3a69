"""measure.interleaved's bookkeeping on the CPU: a fake clock stands in for CUDA events."""
import torch

from spartune.tune import measure


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.order = []

    def event(self, enable_timing=True):
        clock = self

        class Event:
            def record(self):
                self.t = clock.now

            def elapsed_time(self, end):
                return (end.t - self.t) * 1e3  # ms, as CUDA events report

        return Event()

    def call(self, name, seconds):
        def fn():
            self.order.append(name)
            self.now += seconds

        return fn


def test_interleaved_rotates_the_order_and_pairs_the_rounds(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(torch.cuda, "Event", clock.event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(measure, "_evict_buffer", lambda: torch.empty(4))
    fns = {"dense": clock.call("dense", 3e-4), "ours": clock.call("ours", 2e-4), "other": clock.call("other", 6e-4)}
    out = measure.interleaved(fns, rounds=4)
    assert clock.order[:3] == ["dense", "ours", "other"]  # the warm-up, once each
    rounds = [clock.order[3 + 3 * r: 6 + 3 * r] for r in range(4)]
    assert rounds == [["dense", "ours", "other"], ["ours", "other", "dense"], ["other", "dense", "ours"],
                      ["dense", "ours", "other"]]
    assert abs(out["dense"] - 3e-4) < 1e-12 and abs(out["ours"] - 2e-4) < 1e-12
    assert abs(out["ratio:ours"] - 1.5) < 1e-9 and abs(out["ratio:other"] - 0.5) < 1e-9
    assert "ratio:dense" not in out


def test_interleaved_idles_before_each_call_when_asked(monkeypatch):
    clock = FakeClock()
    sleeps = []
    monkeypatch.setattr(torch.cuda, "Event", clock.event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: sleeps.append(cycles), raising=False)
    monkeypatch.setattr(measure, "_evict_buffer", lambda: torch.empty(4))
    out = measure.interleaved({"a": clock.call("a", 1e-4), "b": clock.call("b", 4e-4)}, rounds=3, idle_cycles=7)
    assert sleeps == [7] * 6  # one idle per timed call, none for the warm-up
    assert abs(out["ratio:b"] - 0.25) < 1e-9
    assert measure.interleaved({"a": clock.call("a", 1e-4)}, rounds=2) and len(sleeps) == 6  # none by default


def test_interleaved_refuses_nothing_to_time():
    import pytest

    for fns, rounds, idle in (({}, 3, 0), ({"a": lambda: None}, 0, 0), ({"a": lambda: None}, 3, -1)):
        with pytest.raises(ValueError, match="interleaved needs"):
            measure.interleaved(fns, rounds=rounds, idle_cycles=idle)
