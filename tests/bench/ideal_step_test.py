#!/usr/bin/env python3
"""bench/ideal_step.py's model against cases whose answer is known."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from ideal_step import ideal_step, send, send_batches, send_fair  # noqa: E402

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
mbit_equal = 2 * 3 / 4 * sum(SIZES) * 8 / 1e6 / 300 * 1e3
assert ideal_step(SIZES, 4, mbit_equal, 300, PIECE) > 300 * 1.01

# Turnaround: a reply starts T after its push has gone and is back T after it has gone. One piece
# of b bytes alone: back at 2b/R + 2T, the link free at 2b/R + T. A second layer's push fills the
# gap before the first one's reply, which then still goes first.
b, rate, T = 1000.0, 10.0, 30.0
back, free = send(0.0, {0: 0.0}, {0: [b]}, rate, T)
assert close(back[0], 2 * b / rate + 2 * T) and close(free, 2 * b / rate + T), (back, free)
back, free = send(0.0, {0: 0.0, 1: 0.0}, {0: [b], 1: [b]}, rate, T)
# 0's push [0, 100], 1's push [100, 200] (0's reply is due at 130 and interrupts it at 130:
# 1's push has 70 left), 0's reply [130, 230], 1's push [230, 300], its reply [330, 430].
assert close(back[0], 230 + T) and close(back[1], 430 + T), back
# More turnaround is never faster where the layers are many and small against the link (here), and
# the compute far longer than the wire pays it on the first layer's round trip alone.
for workers in (2, 4, 8):
    previous = 0.0
    for turnaround in (0.0, 1.0, 5.0, 20.0):
        step = ideal_step(SIZES, workers, 100, 300, PIECE, turnaround_ms=turnaround)
        assert step >= previous - 1e-6, (workers, turnaround, step, previous)
        previous = step
long = ideal_step(SIZES, 4, 1000, 10000, PIECE, turnaround_ms=20.0)
assert 10000 + 40 <= long <= 10000 + 40 + 2 * 3 / 4 * SIZES[0] / (1000e6 / 8 / 1e3) + 1e-6, long

# Fair sharing. Two layers of b bytes produced together: each push gets half the link, so both
# end at 2b/R and both replies at 4b/R; one produced when the other's push is half done shares
# from then on.
b, rate = 1000.0, 10.0
back, free = send_fair(0.0, {0: 0.0, 1: 0.0}, {0: b, 1: b}, rate)
assert close(back[0], 4 * b / rate) and close(back[1], 4 * b / rate) and close(free, 4 * b / rate)
back, free = send_fair(0.0, {1: 0.0, 0: b / 2 / rate}, {0: b, 1: b}, rate)
# Layer 1 alone for b/2R (half its push), then both: 1's push ends at b/2R + b/R; 0 has b/2 left
# and its push and 1's reply share until 0's push ends (b/R later), then 1's reply has b/2 left
# and 0's reply b, sharing: 1's reply ends b/R later, 0's b/2R after that alone.
assert close(back[1], 3.5 * b / rate) and close(back[0], 4 * b / rate), back
assert close(free, 4 * b / rate)
# The step: one worker is the compute; no compute is the wire, as with priority; otherwise never
# faster than priority and never under either bound.
assert close(ideal_step(SIZES, 1, 100, 50, PIECE, sharing="fair"), 50)
assert close(ideal_step(SIZES, 4, 100, 0, PIECE, sharing="fair"), wire_ms(4, 100))
for workers in (2, 4, 8):
    for mbit in (10, 50, 100, 500):
        fair = ideal_step(SIZES, workers, mbit, 300, PIECE, sharing="fair")
        assert fair >= ideal_step(SIZES, workers, mbit, 300, PIECE) - 1e-6, (workers, mbit)
        assert fair >= max(300, wire_ms(workers, mbit)) - 1e-6, (workers, mbit, fair)
# Four equal layers, wire time equal to the compute: with priority the first layer's push and
# reply go before the others' and the next forward starts early (375 ms); shared fairly, every
# reply ends together at the end of the wire time (450 ms).
EQUAL = [400000] * 4
mbit = 2 * 3 / 4 * sum(EQUAL) * 8 / 1e6 / 300 * 1e3
fair = ideal_step(EQUAL, 4, mbit, 300, PIECE, sharing="fair")
assert fair > ideal_step(EQUAL, 4, mbit, 300, PIECE) * 1.1, fair

# Batches (allreduce mode's engine). Two layers of b bytes ready together, share 1/2 (2 workers):
# each batch carries 2 x share x its bytes. Fused when they fit: both end after one batch; one at
# a time otherwise, the nearest to the input first.
back, free = send_batches(0.0, {0: 0.0, 1: 0.0}, {0: b, 1: b}, rate, 0.5, 2 * b, 3.0)
assert close(back[0], 3 + 2 * b / rate) and close(back[1], back[0]) and close(free, back[0])
back, free = send_batches(0.0, {0: 0.0, 1: 0.0}, {0: b, 1: b}, rate, 0.5, b, 3.0)
assert close(back[0], 3 + b / rate) and close(back[1], 2 * (3 + b / rate)), back
# A batch is never interrupted: layer 0, ready while layer 1's batch runs, waits for its end.
back, free = send_batches(0.0, {1: 0.0, 0: 1.0}, {0: b, 1: b}, rate, 0.5, 2 * b, 0.0)
assert close(back[1], b / rate) and close(back[0], 2 * b / rate), back
# The step: one worker is the compute, no compute in one batch is the wire; never
# faster than the priority schedule, and here slower with more overhead (not a law: an overhead
# can shift which layers a batch finds ready).
assert close(ideal_step(SIZES, 1, 100, 50, PIECE, sharing="batches"), 50)
assert close(ideal_step(SIZES, 4, 100, 0, PIECE, sharing="batches", fusion_bytes=1 << 30),
             wire_ms(4, 100))
for workers in (2, 4, 8):
    for mbit in (10, 50, 100, 500):
        previous = 0.0
        for overhead in (0.0, 1.0, 4.0):
            batches = ideal_step(SIZES, workers, mbit, 300, PIECE, sharing="batches",
                                 fusion_bytes=500000, batch_overhead_ms=overhead)
            assert batches >= ideal_step(SIZES, workers, mbit, 300, PIECE) - 1e-6, (workers, mbit)
            assert batches >= previous - 1e-6, (workers, mbit, overhead)
            previous = batches
print("ideal_step: all cases hold")
