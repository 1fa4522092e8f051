#!/usr/bin/env python3
"""bench/ideal_step.py's model against cases whose answer is known."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from ideal_step import ideal_step  # noqa: E402

SIZES = [4000, 40, 400000, 800, 2000000, 400]  # bytes per layer, input first
PIECE = 16384


def wire_ms(workers, mbit):
    return 2 * (workers - 1) / workers * sum(SIZES) / (mbit * 1e6 / 8 / 1e3)


def close(a, b, tolerance=1e-6):
    return abs(a - b) <= tolerance * max(1.0, abs(b))


# One worker sends nothing: the step is the compute.
assert close(ideal_step(SIZES, 1, 100, 50, PIECE), 50)
# No compute: every byte is there at once and the link never idles, so the step is the wire time.
assert close(ideal_step(SIZES, 4, 100, 0, PIECE), wire_ms(4, 100))
# Compute far longer than the wire: all but the first layer's round trip hides behind it.
long = ideal_step(SIZES, 4, 1000, 10000, PIECE)
assert 10000 <= long <= 10000 + 2 * 3 / 4 * SIZES[0] / (1000e6 / 8 / 1e3) + 1e-6, long
# In between, never under either bound, and a faster link never slower.
for workers in (2, 4, 8):
    previous = float("inf")
    for mbit in (10, 50, 100, 500):
        step = ideal_step(SIZES, workers, mbit, 300, PIECE)
        assert step >= max(300, wire_ms(workers, mbit)) - 1e-6, (workers, mbit, step)
        assert step <= previous + 1e-6, (workers, mbit, step, previous)
        previous = step
# The last layers' bytes come first and the first layer is needed first: when the wire time
# equals the compute, the step is longer than both.
mbit = 2 * 3 / 4 * sum(SIZES) * 8 / 1e6 / 300 * 1e3
assert ideal_step(SIZES, 4, mbit, 300, PIECE) > 300 * 1.01
print("ideal_step: all cases hold")
