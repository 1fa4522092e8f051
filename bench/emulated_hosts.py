"""Emulated hosts for the benchmarks that run jobs over ssh: the launcher tests' cluster
(build/tests/programs/ssh_test_cluster: network namespaces, each with its own sshd; needs root),
held for the length of a `with` block."""
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def emulated_hosts(helper: str, count: int) -> Iterator[dict]:
    """The cluster's description (hosts, ssh_opts, ...); the hosts are deleted on leaving."""
    with subprocess.Popen([helper, str(count)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as process:
        assert process.stdout is not None and process.stdin is not None
        line = process.stdout.readline()
        if not line:
            sys.exit("no emulated hosts here (ssh_test_cluster exited %s)" % process.wait())
        cluster = json.loads(line)
        print("%d emulated hosts over ssh: %s" % (count, ", ".join(cluster["hosts"])),
              flush=True)
        try:
            yield cluster
        finally:
            process.stdin.close()  # the helper deletes the hosts
            process.wait(60)
