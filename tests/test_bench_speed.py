"""The bench's machine-speed probe (``bench/speed.py``)."""

from __future__ import annotations

from bench import speed


def test_the_workload_does_the_same_work_every_time() -> None:
    # Every message parsed equals the one it was made from, and the list it renders
    # has the same length each pass: the work timed is fixed.
    first = speed.workload()
    assert first == speed.workload()
    assert first > len(speed._EXPECTED)


def test_a_reading_is_the_median_and_the_fastest_of_its_rounds() -> None:
    reading = speed.read_speed(rounds=5)
    assert 0 < reading.fastest_ms <= reading.median_ms
    assert reading.as_json() == {"median_ms": reading.median_ms, "fastest_ms": reading.fastest_ms}
    assert reading.words() == f"{reading.median_ms:.1f} ms (fastest {reading.fastest_ms:.1f})"
