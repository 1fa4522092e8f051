"""`python -m dtrain launch ...`: the dtrain command, run by this interpreter's package."""

import sys

from _dtrain_cli import run

run("dtrain", sys.argv[1:])
