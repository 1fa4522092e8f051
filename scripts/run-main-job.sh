#!/usr/bin/env bash
# Sets up (installs, scripts/install.sh), then runs the main job: LeNet on Fashion-MNIST with 2
# workers and 2 servers (dist_sync) on this machine, started with one `dtrain launch` command.
# Extra arguments go to dtrain-train (e.g. --epochs 5).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec dtrain launch -n 2 -s 2 --launcher local -- \
  dtrain-train --dataset fashion-mnist --network lenet --kvstore dist_sync "$@"
