"""Seeing what a job does, through real jobs: the merged timeline (DTRAIN_TIMELINE), the live
status page (JSON, and the page rendered by headless Chromium), `dtrain plot`, the end-of-job
summary against the progress lines, and dtrain-train's defaults inside a job."""

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request

import pytest

from conftest import DTRAIN, TRAIN, PYTHON, job_env, launch_argv, run_ok

SHORT = ["--dataset", "fashion-mnist", "--network", "lenet", "--epochs", "1", "--limit-train",
         "2000", "--disp-batches", "20"]


def trace_counts(path):
    with open(path) as f:
        data = json.load(f)  # valid JSON, or the test fails here
    events = data["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "process_name"}
    counts = {}
    for e in events:
        if e.get("ph") == "X":
            key = (names[e["pid"]], e["cat"], e["name"])
            counts[key] = counts.get(key, 0) + 1
            assert e["dur"] >= 0 and e["ts"] > 0, e
    return counts, events


def test_timeline_of_a_parameter_server_job(spawn, tmp_path):
    path = str(tmp_path / "job.json")
    out = run_ok(spawn, launch_argv(2, 2, [TRAIN, *SHORT]), env=job_env({"DTRAIN_TIMELINE": path}))
    assert "timeline of 4 processes" in out, out  # the scheduler records no spans
    counts, events = trace_counts(path)
    for w in ("worker 0", "worker 1"):
        for name in ("forward", "backward", "step", "wait_weights"):
            assert counts.get((w, "train", name), 0) >= 60, (w, name, counts)
        assert counts.get((w, "kvstore", "pushpull"), 0) >= 60, counts
        assert counts.get((w, "kvstore", "pull"), 0) >= 1, counts
    for s in ("server 0", "server 1"):
        assert counts.get((s, "server", "merge"), 0) > 0 and counts.get((s, "server", "apply"), 0) > 0
    pushes = [e for e in events if e.get("name") == "pushpull"]
    assert all(e["args"]["bytes"] > 0 for e in pushes)
    # One clock: a worker's step and the servers' rounds of it overlap in time.
    starts = sorted(e["ts"] for e in events if e.get("ph") == "X")
    assert starts[-1] - starts[0] < 120e6


def test_timeline_of_an_allreduce_job(spawn, tmp_path):
    path = str(tmp_path / "job.json")
    run_ok(spawn, launch_argv(2, 0, [TRAIN, *SHORT]), env=job_env({"HOROVOD_TIMELINE": path}))
    counts, events = trace_counts(path)
    for w in ("worker 0", "worker 1"):
        for name in ("negotiate", "allreduce"):
            assert counts.get((w, "collectives", name), 0) > 0, (w, name, counts)
        # Both ranks on one host: a fused batch goes straight through shared memory, with no
        # copies into and out of a fusion buffer to show.
        assert counts.get((w, "collectives", "fusion_copy"), 0) == 0, counts
        assert counts.get((w, "kvstore", "pushpull"), 0) > 0, counts
        assert counts.get((w, "train", "forward"), 0) >= 60, counts
    fused = [e for e in events if e.get("name") == "allreduce" and e["args"].get("tensors", 1) > 1]
    assert fused and all(e["args"]["bytes"] > 0 for e in fused), "no fused batch in the timeline"


def status_url(p, deadline=30):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        m = re.search(r"status page at (http://[0-9.]+:\d+/)", p.output())
        if m:
            return m.group(1)
        time.sleep(0.1)
    pytest.fail("no status page line:\n" + p.output())


def fetch_json(url):
    with urllib.request.urlopen(url + "api/status", timeout=5) as r:
        return json.loads(r.read())


def chromium():
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("Debian's chromium is not installed (scripts/install-deps.sh installs it)")


def render(url, tmp_path):
    """The page's DOM after its script ran, and a screenshot, from headless Chromium."""
    def flags():
        # A profile of its own for every run: a Chromium still shutting down holds its profile's
        # lock, and the next one started on that profile hands its URL over and prints nothing.
        profile = tempfile.mkdtemp(prefix="profile-", dir=tmp_path)
        return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--user-data-dir=" + profile, "--virtual-time-budget=3000",
                "--window-size=1200,700"]
    done = subprocess.run([chromium(), *flags(), "--dump-dom", url], capture_output=True,
                          text=True, timeout=60)
    assert done.stdout, "chromium printed no DOM (exit %d): %s" % (done.returncode,
                                                                   done.stderr[-2000:])
    shot = str(tmp_path / "status.png")
    subprocess.run([chromium(), *flags(), "--screenshot=" + shot, url], capture_output=True,
                   timeout=60)
    return done.stdout, shot


def screenshot_text(png):
    if not shutil.which("tesseract"):
        pytest.skip("tesseract-ocr is not installed (scripts/install-deps.sh installs it)")
    return subprocess.run(["tesseract", png, "-"], capture_output=True, text=True,
                          timeout=60).stdout


def test_status_page_lists_every_node_and_shows_a_failure(spawn, tmp_path):
    p = spawn(launch_argv(2, 2, [TRAIN, "--epochs", "20", "--disp-batches", "0"],
                          "--status-port", "0", "--status-linger-s", "45"))
    url = status_url(p)
    # While the job runs: every node, the workers' rates, the servers' traffic.
    end = time.monotonic() + 60
    while True:
        s = fetch_json(url)
        workers = [n for n in s["nodes"] if n["role"] == "worker"]
        if all(n.get("samples_per_s", 0) > 0 for n in workers) and len(s["nodes"]) == 5 and \
                all(n["state"] == "running" for n in s["nodes"]):
            break
        assert time.monotonic() < end, s
        time.sleep(0.5)
    assert sorted(n["name"] for n in s["nodes"]) == \
        ["scheduler", "server 0", "server 1", "worker 0", "worker 1"]
    assert all(n["pid"] > 0 and n["host"] == "127.0.0.1" for n in s["nodes"])
    assert all(n["bytes_in"] > 0 for n in s["nodes"] if n["role"] == "server")
    dom, shot = render(url, tmp_path)
    for name in ("scheduler", "server 0", "server 1", "worker 0", "worker 1"):
        assert name in dom, dom
    text = screenshot_text(shot)
    assert "worker" in text and "server" in text, text

    # A worker dies: the page names it, and keeps serving after the job ended.
    victim = next(n["pid"] for n in s["nodes"] if n["name"] == "worker 1")
    os.kill(victim, 9)
    end = time.monotonic() + 30
    while "failure" not in fetch_json(url):
        assert time.monotonic() < end
        time.sleep(0.2)
    s = fetch_json(url)
    assert s["failure"]["node"] == "worker 1" and s["failure"]["reported_by"] == "scheduler", s
    dom, _ = render(url, tmp_path)
    assert "failed: worker 1" in dom, dom
    assert p.wait(90) == 137  # after the linger


def test_status_page_shows_what_restarts_cost(spawn, tmp_path):
    """Under --max-restarts the page lists each server's checkpoints and, once the workers have
    left, their copies into the push log (the figures of the end-of-job summary)."""
    p = spawn(launch_argv(2, 2, [TRAIN, *SHORT], "--max-restarts", "1", "--status-port", "0",
                          "--status-linger-s", "45"))
    url = status_url(p)
    end = time.monotonic() + 90
    while True:
        s = fetch_json(url)
        workers = [n for n in s["nodes"] if n["role"] == "worker"]
        if len(workers) == 2 and all(n.get("push_log_bytes", 0) > 0 for n in workers):
            break
        assert time.monotonic() < end, s
        time.sleep(0.5)
    servers = [n for n in s["nodes"] if n["role"] == "server"]
    assert len(servers) == 2 and all(n["checkpoints"] >= 1 for n in servers), s
    assert all(n["checkpoint_ms"] > 0 for n in servers), s
    dom, _ = render(url, tmp_path)
    table = re.search(r"<tbody>(.*)</tbody>", dom, re.S)  # the rows the page's script wrote
    assert table, dom
    assert table.group(1).count("checkpoint(s), the last") == 2, table.group(1)
    assert table.group(1).count("push log:") == 2, table.group(1)
    assert table.group(1).count("faulted in at the start") == 2, table.group(1)


def test_dtrain_plot_draws_a_real_log(spawn, tmp_path):
    log = tmp_path / "run.log"
    trace = str(tmp_path / "job.json")
    log.write_text(run_ok(spawn, launch_argv(2, 1, [TRAIN, *SHORT[:5], "2", *SHORT[6:]]),
                          env=job_env({"DTRAIN_TIMELINE": trace})))
    png = str(tmp_path / "plot.png")
    out = run_ok(spawn, [DTRAIN, "plot", str(log), str(log), "-o", png, "--timeline", trace])
    assert "wrote" in out
    with open(png, "rb") as f:
        header = f.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
    assert width >= 600 and height >= 900, (width, height)
    # A log without progress lines is a clear error, not an empty picture.
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    p = spawn([DTRAIN, "plot", str(empty), "-o", str(tmp_path / "x.png")])
    assert p.wait(60) != 0 and "nothing to draw" in p.output()


def test_summary_matches_the_progress_lines(spawn):
    out = run_ok(spawn, launch_argv(2, 2, [TRAIN, "--epochs", "2", "--limit-train", "6000",
                                           "--disp-batches", "40"]))
    for w in (0, 1):
        speeds = [float(x) for x in re.findall(
            r"\[worker %d\] Epoch\[\d+\] Batch \[\d+-\d+\] Speed: ([0-9.]+)" % w, out)]
        summary = re.search(r"  worker %d: (\d+) samples in (\d+) steps, ([0-9.]+) samples/s; "
                            r"step time: (\d+)%% compute, (\d+)%% waiting" % w, out)
        assert speeds and summary, out
        assert int(summary.group(1)) == 2 * 2992 and int(summary.group(2)) == 2 * 187
        # The summary's rate covers every step, the progress lines only the first 160 of each
        # epoch's 187 (and the cold start), so under a load that swings the two drift apart (28%
        # in one loaded run): the rate must lie among theirs, with room for the stretches that
        # only one side sees, never match them to a percentage.
        rate = float(summary.group(3))
        assert min(speeds) / 2 < rate < max(speeds) * 1.5, (rate, speeds)
        assert int(summary.group(4)) + int(summary.group(5)) in (99, 100, 101)
    assert "summary: wall time" in out and "all workers: 11968 samples" in out, out
    for node in ("scheduler", "server 0", "server 1", "worker 0", "worker 1"):
        assert "  %s on 127.0.0.1: exited with code 0" % node in out, out


def test_dtrain_train_joins_its_job_without_being_told(spawn):
    out = run_ok(spawn, launch_argv(2, 1, [TRAIN, *SHORT]))
    assert out.count("kvstore dist_sync") == 2, out
    out = run_ok(spawn, launch_argv(2, 0, [TRAIN, *SHORT]))
    assert out.count("kvstore horovod") == 2, out
    p = spawn(launch_argv(2, 1, [TRAIN, "--kvstore", "local", *SHORT]))
    assert p.wait(60) != 0
    assert "pass --kvstore dist_sync" in p.output()
    # MXNet's flag names, and help instead of a server.
    out = run_ok(spawn, [TRAIN, "--num-epochs", "1", "--kv-store", "local", "--limit-train", "500",
                         "--disp-batches", "10"])
    assert "Epoch 0: Test_acc" in out
    help_text = run_ok(spawn, [TRAIN, "--help"], env=job_env({"DMLC_ROLE": "server"}))
    assert "--num-epochs" in help_text and "--disp-batches" in help_text and "=lenet" in help_text


def report_address(launcher_pid, deadline=30):
    """Where the launcher listens for reports, from a child's environment."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        children = subprocess.run(["pgrep", "-P", str(launcher_pid)], capture_output=True,
                                  text=True).stdout.split()
        for c in children:
            try:
                with open("/proc/%s/environ" % c, "rb") as f:
                    env = f.read().decode(errors="replace")
            except OSError:
                continue
            m = re.search(r"DTRAIN_REPORT_ADDR=([0-9.]+):(\d+)", env)
            if m:
                return m.group(1), int(m.group(2))
        time.sleep(0.1)
    pytest.fail("no DTRAIN_REPORT_ADDR in the job's processes")


def test_strangers_on_the_report_port_are_ignored(spawn):
    import socket
    p = spawn(launch_argv(2, 1, [TRAIN, "--epochs", "1", "--limit-train", "12000",
                                 "--disp-batches", "0"]))
    address = report_address(p.pid)
    for payload in (b"", b"garbage\n",
                    b'{"kind":"hello","token":"wrong","role":"worker","rank":0}\n',
                    b'{"kind":"failure","node":{"role":"worker","rank":0},"cause":"x"}\n'):
        with socket.create_connection(address, timeout=5) as conn:
            conn.sendall(payload)
    assert p.wait(120) == 0, p.output()
    out = p.output()
    assert "ignoring a connection to the report port" in out, out
    assert "failed for" not in out, out
