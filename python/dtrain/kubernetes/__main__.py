"""``dtrain launch --launcher kubernetes [options] -- command...`` (also ``python -m
dtrain.kubernetes``): a dtrain job as Kubernetes objects (see dtrain.kubernetes.manifests).

    dtrain launch --launcher kubernetes -n 2 -s 2 --image registry/team/train:1 --dry-run \\
        -- python3 train.py --kvstore dist_sync | kubectl apply -f -

``--dry-run`` prints the manifests as YAML, with a fresh job secret in the Secret. Creating them
through the Kubernetes API and following the pods is not built yet: without ``--dry-run`` this
says so and exits 2.
"""

from __future__ import annotations

import argparse
import secrets
import sys

from .manifests import JobSpec, RoleResources, manifests


def _env_arg(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError("--env takes NAME:VALUE, not %r" % text)
    return name, value


def parse(argv: list[str]) -> tuple[JobSpec, bool]:
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
    args = ap.parse_args(argv)
    if args.max_restarts < 0:
        ap.error("--max-restarts must be at least 0")
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
    return spec, args.dry_run


def main(argv: list[str] | None = None) -> int:
    spec, dry_run = parse(sys.argv[1:] if argv is None else argv)
    if not dry_run:
        print("dtrain launch --launcher kubernetes: creating the objects through the Kubernetes "
              "API is not built yet; print them with --dry-run and apply them with "
              "`kubectl apply -f -`", file=sys.stderr)
        return 2
    import yaml  # Debian's python3-yaml, PyYAML on PyPI

    yaml.safe_dump_all(manifests(spec), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
