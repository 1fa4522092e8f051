"""Whole jobs from Python as users start them: roles on import (one script for every role,
started by hand with DMLC_* variables), the GIL released while waiting, a worker killed mid-job
named to every other process within seconds with nothing left behind, and bad environments."""

import os
import signal
import time
import uuid

import pytest

from conftest import (PYTHON, descendants_gone, free_port, job_env, launch_argv, program,
                      run_ok)


def hand_started(spawn, workers, servers, command, extra=None, scheduler=True):
    """Every role runs `command` (roles on import), as with MXNet's manual launch."""
    port = free_port()
    token = uuid.uuid4().hex
    base = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": port,
            "DMLC_NUM_SERVER": servers, "DMLC_NUM_WORKER": workers, "DTRAIN_TEST_TOKEN": token}
    base.update(extra or {})
    procs = {}
    roles = ([("scheduler", 0)] if scheduler else []) + [("server", i) for i in range(servers)] + \
        [("worker", i) for i in range(workers)]
    for role, rank in roles:
        env = job_env(dict(base, DMLC_ROLE=role, DTRAIN_NODE_RANK=rank))
        procs[(role, rank)] = spawn(command, env)
    return procs, token


def with_token(token):
    """Pids of processes whose environment carries `token`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                if ("DTRAIN_TEST_TOKEN=" + token).encode() in f.read():
                    pids.append(int(entry))
        except OSError:
            pass
    return pids


def test_one_script_serves_every_role(spawn):
    procs, _ = hand_started(spawn, 2, 2, program("kv_worker.py", "dist_sync"))
    for key, p in procs.items():
        assert p.wait(90) == 0, "%s exited non-zero:\n%s" % (key, p.output())
    for r in range(2):
        assert "kv_worker OK rank %d of 2" % r in procs[("worker", r)].output()
    # The scheduler and servers ran their role inside `import dtrain` and never reached main().
    assert "kv_worker OK" not in procs[("server", 0)].output()


def test_importing_dtrain_as_a_server_does_not_return(spawn):
    script = "import dtrain; print('AFTER IMPORT'); dtrain.kv.create('dist_sync').close()"
    procs, _ = hand_started(spawn, 1, 1, [PYTHON, "-c", script])
    for key, p in procs.items():
        assert p.wait(60) == 0, "%s:\n%s" % (key, p.output())
    assert "AFTER IMPORT" in procs[("worker", 0)].output()
    assert "AFTER IMPORT" not in procs[("server", 0)].output()
    assert "AFTER IMPORT" not in procs[("scheduler", 0)].output()


def test_a_bad_variable_is_a_clear_error_at_import(spawn):
    env = job_env({"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "two"})
    p = spawn([PYTHON, "-c", "import dtrain"], env)
    assert p.wait(30) != 0
    out = p.output()
    assert "ConfigError" in out and "DMLC_NUM_WORKER" in out and "two" in out, out


def test_blocking_calls_release_the_gil(spawn):
    out = run_ok(spawn, launch_argv(2, 1, program("gil_check.py")))
    assert "gil_check OK" in out, out


@pytest.mark.parametrize("mode,servers", [("kv", 2), ("trainer", 1), ("hvd", 0)])
def test_a_killed_worker_is_named_to_every_other_process(spawn, mode, servers):
    command = program("fail_worker.py", mode, "--victim", 1)
    procs, token = hand_started(spawn, 3, servers, command, scheduler=servers > 0)
    victim = procs[("worker", 1)]
    assert victim.wait(60) == -signal.SIGKILL, victim.output()
    killed_at = time.monotonic()
    for r in (0, 2):
        p = procs[("worker", r)]
        code = p.wait(30)
        out = p.output()
        assert code == 3, "worker %d exited %d:\n%s" % (r, code, out)
        assert "CAUGHT PeerError" in out, out
        assert ("worker 1" in out) or ("rank 1" in out), out
    detect = time.monotonic() - killed_at
    assert detect < 20, "the others noticed after %.1f s" % detect
    for key, p in procs.items():
        if key[0] != "worker":
            assert p.wait(30) != 0, "%s should fail the job:\n%s" % (key, p.output())
    assert descendants_gone(with_token(token), within=15), "processes left behind"


@pytest.mark.parametrize("mode,servers,names", [
    ("kv", 1, "on server 0 (127.0.0.1:"),
    ("hvd", 0, "rank 1 had not submitted it"),
])
def test_a_stalled_worker_is_a_timeout_naming_what_it_waited_for(spawn, mode, servers, names):
    deadline = {"DTRAIN_REQUEST_TIMEOUT_MS": 2000, "DTRAIN_COLLECTIVE_TIMEOUT_MS": 2000}
    procs, _ = hand_started(spawn, 2, servers,
                            program("fail_worker.py", mode, "--victim", 1, "--stall"),
                            extra=deadline, scheduler=servers > 0)
    p = procs[("worker", 0)]
    assert p.wait(30) == 3, p.output()
    out = p.output()
    assert "CAUGHT TimeoutError" in out and names in out, out


def test_a_killed_worker_is_replaced_and_resumes_at_its_round(spawn):
    """dtrain launch --max-restarts: rank 1 dies after pushing half of round 3; its replacement
    gets the round from kv.rounds_done, and every round's pull stays exact (restart_worker.py)."""
    out = run_ok(spawn, launch_argv(2, 2, program("restart_worker.py", 8, 3), "--max-restarts", "1"))
    assert "rank 1 kills itself half-way through round 3" in out, out
    assert "rank 1 replaces a lost worker: resuming at round 3" in out, out
    assert "restart_worker OK rank 0, 8 rounds" in out and "restart_worker OK rank 1, 8 rounds" in out, out
    assert "CHECK FAILED" not in out, out
