#!/usr/bin/env bash
# Sets up, builds, and runs the main job: distributed training with 2 workers and 2 servers on
# this machine, started with one `dtrain launch` command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
exec build/src/tools/dtrain launch -n 2 -s 2 --launcher local -- \
  build/examples/dtrain-example-softmax --kvstore dist_sync --epochs 5 "$@"
