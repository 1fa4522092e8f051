"""Gradient compression through dtrain.kv, checked against MXNet's expectations.

    gc_worker.py TYPE [--cuda]   # a dist type under dtrain launch, or device/local (two devices)

2-bit, threshold 0.5: pushes of 0, 0.4, 0.1, 0.2, 0.3, 0.5 give sums 0, 0, t*n, 0, t*n, t*n
(n pushers: workers, or devices in one process); 1-bit, threshold 0: pushes of 1, -1, 2, 0, -2
give n, -n, n, n, -n. With --cuda the values and outputs are CUDA tensors (the dist stores then
compress on the GPU), and the *_device stores get two of them a worker, each half the value (summed
on the GPU, then compressed).
Prints "gc_worker OK rank R".
"""

import sys

import torch

import dtrain


def main():
    kv = dtrain.kv.create(sys.argv[1])
    device = "cuda" if "--cuda" in sys.argv[2:] else "cpu"
    local = not kv.type.startswith("dist")
    devices = 2 if local or (device == "cuda" and kv.type.endswith("_device")) else 1
    # Local stores compress each device's value; dist ones the sum of a worker's (each device then
    # pushes an exact half of the value).
    n = devices * kv.num_workers if local else kv.num_workers
    share = 1.0 if local else 1.0 / devices
    try:
        kv.set_gradient_compression({"type": "2bit", "threshold": -1})
    except ValueError as e:
        assert "threshold > 0" in str(e), e
    else:
        raise AssertionError("a negative 2bit threshold was accepted")
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    for key, size in (("small", 7), ("big", 5003)):  # one slot; split over the servers
        kv.init(key, torch.full((size,), 0.1234, device=device))
        assert torch.all(kv.pull(key).cpu() == 0.1234), "init values travel uncompressed"
        for push, want in zip((0, 0.4, 0.1, 0.2, 0.3, 0.5), (0, 0, 0.5 * n, 0, 0.5 * n, 0.5 * n)):
            values = [torch.full((size,), push * share, device=device) for _ in range(devices)]
            out = torch.empty(size, device=device)
            kv.pushpull(key, values if devices > 1 else values[0], out=out).wait()
            out = out.cpu()
            assert torch.all(out == want), "%s: push %s gave %s, want %s" % (key, push, out[:3], want)
    try:
        kv.set_gradient_compression({"type": "1bit"})
    except ValueError as e:
        assert "before the first push" in str(e), e
    else:
        raise AssertionError("compression changed after a push")
    rank = kv.rank
    kv.close()
    print("gc_worker OK rank %d" % rank, flush=True)


if __name__ == "__main__":
    main()
