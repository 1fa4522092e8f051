"""Shared fixtures for the Python tests: real processes started the way users start them
(`dtrain launch`, `mpirun`, or by hand with DMLC_* variables), each in its own process group that
is killed on every path, with bounded waits.

The tests use the build tree: DTRAIN_BUILD_DIR (default <repo>/build), whose python/ folder holds
the staged package; ctest sets both. With DTRAIN_TEST_INSTALLED=1 they use what `pip install` put
in the running interpreter's environment instead: its dtrain package and the dtrain and
dtrain-train commands on PATH (scripts/test-pip.sh runs them so, in venvs).
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("DTRAIN_BUILD_DIR", os.path.join(REPO, "build"))
PROGRAMS = os.path.join(REPO, "tests", "python", "programs")
PYTHON = sys.executable
INSTALLED = os.environ.get("DTRAIN_TEST_INSTALLED") == "1"

if INSTALLED:
    def _installed_command(name):
        path = shutil.which(name, path=os.path.dirname(PYTHON) + os.pathsep + os.environ["PATH"])
        assert path, "DTRAIN_TEST_INSTALLED=1 but %s is not on PATH" % name
        return path
    DTRAIN = _installed_command("dtrain")
    TRAIN = _installed_command("dtrain-train")
    PACKAGE_PATH = []
else:
    DTRAIN = os.path.join(BUILD, "src", "tools", "dtrain")
    TRAIN = os.path.join(BUILD, "src", "train", "dtrain-train")
    PACKAGE_PATH = [os.path.join(BUILD, "python")]
    sys.path.insert(0, PACKAGE_PATH[0])


def job_env(extra=None):
    """The environment of a job's processes: the build's package first on PYTHONPATH, quick
    failure detection, and no DMLC_* variables of the caller's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DMLC_", "DTRAIN_NODE", "OMPI_", "PMIX_"))}
    env["PYTHONPATH"] = os.pathsep.join(PACKAGE_PATH + [PROGRAMS])
    env.setdefault("DTRAIN_FAILURE_EXIT_MS", "5000")
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


class Process:
    """A child in its own process group; output (stdout and stderr) goes to a file."""

    def __init__(self, argv, env=None, cwd=None):
        self.log = tempfile.NamedTemporaryFile(prefix="dtrain-test-", suffix=".log", delete=False)
        self.argv = argv
        self.proc = subprocess.Popen(argv, env=env or job_env(), cwd=cwd, stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)

    @property
    def pid(self):
        return self.proc.pid

    def wait(self, timeout):
        """The exit code; fails the test (and kills the group) past `timeout` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail("%s did not finish within %s s; output:\n%s"
                        % (" ".join(self.argv), timeout, self.output()))

    def output(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def kill(self, sig=signal.SIGKILL):
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def close(self):
        self.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        os.unlink(self.log.name)


@pytest.fixture
def spawn():
    """spawn(argv, env=None) starts a Process; every one is killed when the test ends."""
    started = []

    def start(argv, env=None, cwd=None):
        p = Process(argv, env, cwd)
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_argv(workers, servers, command, *flags):
    return [DTRAIN, "launch", "-n", str(workers), "-s", str(servers), "--launcher", "local",
            *flags, "--"] + command


def program(name, *args):
    return [PYTHON, os.path.join(PROGRAMS, name), *map(str, args)]


def run_ok(spawn, argv, timeout=120, env=None):
    """Runs a job to the end and returns its output; fails the test on a non-zero exit."""
    p = spawn(argv, env)
    code = p.wait(timeout)
    out = p.output()
    assert code == 0, "exit %d from %s:\n%s" % (code, " ".join(argv), out)
    return out


def descendants_gone(pids, within=10.0):
    """True once none of `pids` is alive (zombies count as gone)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return True
        time.sleep(0.1)
    return False


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def mpirun_argv(n, command):
    argv = ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    return argv + ["-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-x", "DTRAIN_FAILURE_EXIT_MS"] + command


def run_example_on_an_engine(script, args, cwd, drop_prefix, extra_env=None):
    """An examples/python script that starts its own Ray or Spark, run as a user runs it (with the
    package under test on its path, as the suite has it, and none of the engine's variables this
    process has: `drop_prefix`, but `extra_env`): its output, after a check that it exited 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith((drop_prefix, "DMLC_"))}
    env.update(extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    p = subprocess.run([sys.executable, os.path.join(REPO, "examples", "python", script), *args],
                       cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout
    return p.stdout


def elastic_steps(steps, marker, sleep_s=0.0, kill_parent=False):
    """Horovod's elastic loop, run by the engines' elastic jobs (Ray's, Spark's): rank 1 of the
    first membership dies at step 8 (once: `marker` records it), or with `kill_parent` kills the
    process that runs it (the engine's actor or task); the job rolls back to the last commit and
    goes on without it (or with a worker started on the freed slot)."""
    import torch

    import dtrain.torch as hvd

    hvd.init()
    state = hvd.elastic.ObjectState(step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            if state.step == 8 and hvd.rank() == 1 and not os.path.exists(marker):
                open(marker, "w").close()
                if kill_parent:
                    os.kill(os.getppid(), signal.SIGKILL)
                os._exit(3)  # the worker's process dies without a word
            hvd.allreduce(torch.ones(1))
            time.sleep(sleep_s)
            state.step += 1
            state.commit()
        return state.step, hvd.size()

    return train(state)
