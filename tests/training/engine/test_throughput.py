from training.engine.throughput import ThroughputMeter


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_throughput_counts_only_steps_after_warm_up_and_up_to_the_latest_step():
    clock = FakeClock()
    meter = ThroughputMeter(warmup_steps=2, clock=clock)
    for duration in (5.0, 3.0, 1.0, 1.0, 1.0):  # two slow warm-up steps, then 1 s per step
        clock.now += duration
        meter.update(samples=100)
    clock.now += 60.0  # what happens after the last step (final save, evaluation) is not throughput
    assert meter.measured_steps == 3
    assert meter.samples_per_second() == 100.0


def test_throughput_is_zero_before_anything_was_measured():
    meter = ThroughputMeter(warmup_steps=3, clock=FakeClock())
    meter.update(samples=10)
    assert meter.samples_per_second() == 0.0
