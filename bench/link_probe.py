#!/usr/bin/env python3
"""What one shaped link of bench/cluster_bench.sh really carries: TCP bytes per second.

  link_probe.py --listen PORT --seconds S      receive for S seconds, print the rate (Mbit/s)
  link_probe.py --send HOST:PORT --seconds S   send as fast as TCP allows for S seconds

cluster_bench starts one receiver per host and one sender from each host to the next, so every
link carries a full stream each way at once, as in a ring allreduce. The rate the receivers see is
the physical bound every mode is held to; bound_ms assumes the nominal rate.
"""
import argparse
import socket
import time


def receive(port, seconds):
    with socket.create_server(("0.0.0.0", port)) as server:
        server.settimeout(seconds + 10)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(seconds + 10)
            total, started, first = 0, None, 0
            deadline = None
            while True:
                chunk = conn.recv(1 << 20)
                if not chunk:
                    break
                now = time.perf_counter()
                if started is None:  # the clock starts at the first byte, past the handshake
                    started, first, deadline = now, len(chunk), now + seconds
                total += len(chunk)
                if now >= deadline:
                    break
            elapsed = time.perf_counter() - started
            print("%.1f" % ((total - first) * 8 / elapsed / 1e6), flush=True)


def send(target, seconds):
    host, port = target.rsplit(":", 1)
    block = b"\0" * (1 << 20)
    for _ in range(100):  # the receiver may start a moment later
        try:
            conn = socket.create_connection((host, int(port)), timeout=2)
            break
        except OSError:
            time.sleep(0.05)
    else:
        raise SystemExit("link_probe: nothing listens at " + target)
    with conn:
        conn.settimeout(seconds + 10)
        until = time.perf_counter() + seconds + 1
        try:
            while time.perf_counter() < until:
                conn.sendall(block)
        except OSError:
            pass  # the receiver has what it needs and closed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=int)
    parser.add_argument("--send")
    parser.add_argument("--seconds", type=float, default=3)
    args = parser.parse_args()
    if args.listen:
        receive(args.listen, args.seconds)
    elif args.send:
        send(args.send, args.seconds)
    else:
        parser.error("--listen PORT or --send HOST:PORT")


if __name__ == "__main__":
    main()
