"""``python -m realrun --job JOB.json --out DIR``: one rank of a real run (see
:mod:`realrun.worker`)."""

import os
import sys

from realrun.worker import main

code = main()
sys.stdout.flush()
sys.stderr.flush()
# Leave without running destructors: gloo's threads (and the messaging threads blocked in
# their last receive) can abort the interpreter's shutdown after a run that went well.
os._exit(code)
