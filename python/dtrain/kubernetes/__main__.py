"""``dtrain launch --launcher kubernetes [options] -- command...`` (also ``python -m
dtrain.kubernetes``): a dtrain job as Kubernetes objects (see dtrain.kubernetes.manifests).

    dtrain launch --launcher kubernetes -n 2 -s 2 --image registry/team/train:1 \\
        -- python3 train.py --kvstore dist_sync

creates the objects in the cluster kubectl would use (KUBECONFIG, ~/.kube/config, or the pod's
service account), follows the pods (their output merged, each line prefixed with its member), names
the first failure (pod, node, reason), deletes every object when the job ends, fails or is
interrupted, and exits with the job's code. ``--dry-run`` prints the manifests as YAML instead, with
a fresh job secret in the Secret.
"""

from __future__ import annotations

import argparse
import secrets
import signal
import sys
from typing import Any

from .manifests import JobSpec, RoleResources, manifests


def _env_arg(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError("--env takes NAME:VALUE, not %r" % text)
    return name, value


def parse(argv: list[str]) -> tuple[JobSpec, argparse.Namespace]:
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1:]
    else:
        command = []
    ap = argparse.ArgumentParser(
        prog="dtrain launch --launcher kubernetes", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--num-workers", type=int, required=True)
    ap.add_argument("-s", "--num-servers", type=int, help="default: as many as workers")
    ap.add_argument("--image", required=True, help="the container image every pod runs")
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--name", help="the job's name (default: dtrain-<random>)")
    ap.add_argument("--port", type=int, default=9091, help="the rendezvous port")
    ap.add_argument("--max-restarts", type=int, default=0,
                    help="each role's Job retries a failed pod this often (backoffLimit)")
    ap.add_argument("--env", type=_env_arg, action="append", default=[],
                    metavar="NAME:VALUE", help="set in every pod (repeatable)")
    ap.add_argument("--image-pull-policy", choices=["Always", "IfNotPresent", "Never"])
    for role in ("worker", "server"):
        ap.add_argument("--%s-cpu" % role, help="requests and limits, as '2' or '500m'")
        ap.add_argument("--%s-memory" % role, help="requests and limits, as '4Gi'")
        ap.add_argument("--%s-gpus" % role, type=int, default=0, help="nvidia.com/gpu")
    ap.add_argument("--kubeflow", action="store_true",
                    help="one object of Kubeflow's training operator instead of Jobs: an MXJob "
                         "(with servers) or a PyTorchJob (-s 0)")
    ap.add_argument("--dry-run", action="store_true", help="print the manifests (YAML)")
    ap.add_argument("--start-timeout", type=float, default=900.0, metavar="SECONDS",
                    help="every member's pod must have started by then (default: %(default)g)")
    args = ap.parse_args(argv)
    if args.max_restarts < 0:
        ap.error("--max-restarts must be at least 0")
    if args.start_timeout <= 0:
        ap.error("--start-timeout must be positive")
    spec = JobSpec(
        name=args.name or "dtrain-" + secrets.token_hex(3),
        image=args.image, command=command, num_workers=args.num_workers,
        num_servers=args.num_workers if args.num_servers is None else args.num_servers,
        namespace=args.namespace, port=args.port, max_restarts=args.max_restarts,
        env=dict(args.env), image_pull_policy=args.image_pull_policy, kubeflow=args.kubeflow,
        worker=RoleResources(args.worker_cpu, args.worker_memory, args.worker_gpus),
        server=RoleResources(args.server_cpu, args.server_memory, args.server_gpus))
    try:
        spec.check()
    except ValueError as e:
        ap.error(str(e))
    return spec, args


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run(spec: JobSpec, start_timeout: float) -> int:
    """Creates the job's objects, follows its pods and deletes the objects again: the job's code."""
    from .api import Cluster, ClusterError
    from .follow import Follower

    def say(text: str) -> None:
        print("dtrain launch: " + text, file=sys.stderr, flush=True)

    signal.signal(signal.SIGTERM, _interrupted)
    created: list[dict[str, Any]] = []
    code = 1
    follower = None
    try:
        cluster = Cluster(spec.namespace)
        objects = manifests(spec)
        follower = Follower(cluster, spec, objects, start_timeout=start_timeout)
        for obj in objects:
            created.append(obj)  # first: an interrupted create is deleted too (404 is fine)
            try:
                cluster.create(obj)
            except ClusterError as e:
                if e.status is not None:  # refused (409: the name is another job's): not ours
                    created.pop()
                raise
        say("created %s in namespace %s at %s" % (
            ", ".join("%s %s" % (o["kind"], o["metadata"]["name"]) for o in created),
            spec.namespace, cluster.server))
        code = follower.run()
    except KeyboardInterrupt:
        say("interrupted: deleting the job")
        code = 130
    except ClusterError as e:
        say(str(e))
        code = 1
    finally:
        # The deletions finish whatever the user presses meanwhile: each has its deadline.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if follower is not None:
            follower.drain(5.0 if code == 0 else 1.0)
        left = [why for why in (cluster.delete(o) for o in reversed(created)) if why]
        for why in left:
            say(why + " (delete it yourself)")
        if created and not left:
            say("deleted the job's %d objects" % len(created))
    return code


def main(argv: list[str] | None = None) -> int:
    spec, args = parse(sys.argv[1:] if argv is None else argv)
    if not args.dry_run:
        return run(spec, args.start_timeout)
    import yaml  # Debian's python3-yaml, PyYAML on PyPI

    yaml.safe_dump_all(manifests(spec), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
