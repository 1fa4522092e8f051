"""The `device` store on CUDA replicas against torch doing the same sum itself, on one GPU.

    python3 bench/gpu_device_store.py [--mb 64] [--rounds 20] [--replicas 2]

(scripts/gpu-check.sh runs it.) Two replicas on the one GPU stand in for several GPUs of a
worker. In the same run, for one key of --mb MB of float32 per replica, each a median of
--rounds after 3 warm-up rounds, in seconds:
  torch          `s = a + b` then `c.copy_(s)`, `d.copy_(s)` (what the store must do at least:
                 memory-rate work on the GPU; its bound);
  device         `kv.pushpull(key, [a, b], out=[c, d])` on a `device` store without an
                 optimizer (the Gluon Trainer's update_on_kvstore=False): summed on the GPU
                 and kept there, so no byte crosses to the host;
  device_2bit    the same with 2-bit compression: each replica compressed on the GPU, only the
                 compressed bytes copied to the host, summed there and copied back;
  local          the same on a `local` store, which stages every replica through the host, as
                 MXNet's does (for scale: the device store used to stage its GPU sum instead,
                 one copy each way less than this).
One JSON line, with device / torch (the store's overhead over the bound).
"""

import argparse
import json
import statistics
import time

import torch

import dtrain


def median_seconds(step, rounds):
    times = []
    for _ in range(rounds + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[3:])


def store_seconds(kind, replicas, n, rounds, compression=None):
    kv = dtrain.kv.create(kind)
    if compression:
        kv.set_gradient_compression({"type": compression})
    kv.init(0, torch.zeros(n))
    values = [torch.ones(n, device="cuda") for _ in range(replicas)]
    outs = [torch.empty(n, device="cuda") for _ in range(replicas)]
    seconds = median_seconds(lambda: kv.pushpull(0, values, out=outs).wait(), rounds)
    kv.close()
    return seconds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--replicas", type=int, default=2)
    args = ap.parse_args()
    n = (args.mb << 20) // 4

    values = [torch.ones(n, device="cuda") for _ in range(args.replicas)]
    outs = [torch.empty(n, device="cuda") for _ in range(args.replicas)]

    def by_torch():
        s = values[0] + values[1] if len(values) > 1 else values[0].clone()
        for v in values[2:]:
            s += v
        for out in outs:
            out.copy_(s)

    torch_s = median_seconds(by_torch, args.rounds)
    device_s = store_seconds("device", args.replicas, n, args.rounds)
    device_2bit_s = store_seconds("device", args.replicas, n, args.rounds, "2bit")
    local_s = store_seconds("local", args.replicas, n, args.rounds)
    line = {
        "bench": "gpu_device_store", "mb": args.mb, "replicas": args.replicas,
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "torch_s": round(torch_s, 5), "device_s": round(device_s, 5),
        "device_2bit_s": round(device_2bit_s, 5), "local_s": round(local_s, 5),
        "device_to_torch": round(device_s / torch_s, 3),
        "local_to_device": round(local_s / device_s, 3)}
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
