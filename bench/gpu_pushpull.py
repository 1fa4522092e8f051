"""A CUDA tensor's pushpull against its physical bound, on one GPU (issue 27's bar).

    dtrain launch -n 1 -s 1 -- python3 bench/gpu_pushpull.py [--mb 64] [--rounds 20]
                                                            [--compression 2bit|1bit|fp16]

(scripts/gpu-check.sh runs it.) In the same run, for one key of --mb MB of float32:
  pinned_d2h/h2d   torch's copies between the GPU and pinned host memory, GB/s (the bus);
  cpu              dist_sync pushpull of a CPU tensor, 1 worker 1 server: median seconds;
  cuda             the same pushpull of a CUDA tensor (staged through pinned memory);
  bound            cpu + one device-to-host and one host-to-device copy at the pinned rates;
  ratio            cuda / bound (target: at most 1.25).
One JSON line. Medians of --rounds after 3 warm-up rounds.

With --compression, both pushes are compressed: the CPU tensor's on the host (AVX2), the CUDA
tensor's on the GPU, which then copies only the compressed bytes to the host. The line adds
cuda_to_cpu (cuda / cpu: below 1 when the GPU's codec and smaller copy beat the host's codec).
"""

import argparse
import json
import statistics
import time

import torch

import dtrain


def pinned_rates(nbytes):
    dev = torch.empty(nbytes // 4, device="cuda")
    host = torch.empty(nbytes // 4, pin_memory=True)
    rates = {}
    for name, dst, src in (("d2h", host, dev), ("h2d", dev, host)):
        times = []
        for _ in range(10):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        rates[name] = nbytes / statistics.median(times[2:]) / 1e9
    return rates


def pushpull_seconds(kv, key, value, rounds):
    times = []
    for i in range(rounds + 3):
        if value.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        kv.pushpull(key, value).wait()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[3:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--compression", choices=("2bit", "1bit", "fp16"))
    args = ap.parse_args()
    nbytes = args.mb << 20
    n = nbytes // 4

    kv = dtrain.kv.create("dist_sync")
    if args.compression:
        kv.set_gradient_compression({"type": args.compression})
    cpu = torch.ones(n)
    gpu = torch.ones(n, device="cuda")
    kv.init(0, torch.zeros(n))
    kv.init(1, torch.zeros(n))
    rates = pinned_rates(nbytes)
    cpu_s = pushpull_seconds(kv, 0, cpu, args.rounds)
    cuda_s = pushpull_seconds(kv, 1, gpu, args.rounds)
    bound = cpu_s + nbytes / (rates["d2h"] * 1e9) + nbytes / (rates["h2d"] * 1e9)
    line = {
        "bench": "gpu_pushpull", "mb": args.mb, "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__, "compression": args.compression or "none",
        "pinned_d2h_GBps": round(rates["d2h"], 2), "pinned_h2d_GBps": round(rates["h2d"], 2),
        "cpu_s": round(cpu_s, 5), "cuda_s": round(cuda_s, 5), "bound_s": round(bound, 5),
        "ratio": round(cuda_s / bound, 3)}
    if args.compression:
        line["cuda_to_cpu"] = round(cuda_s / cpu_s, 3)
    else:
        line["target_ratio_max"] = 1.25
    print(json.dumps(line), flush=True)
    kv.close()


if __name__ == "__main__":
    main()
