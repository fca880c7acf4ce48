"""``python -m realrun --job JOB.json --out DIR``: one rank of a real run (see
:mod:`realrun.worker`)."""

import os
import sys

from realrun.owner import OWNER_ENV, watch_owner


def _owner_gone() -> None:
    """Leave at once: the process that started this run is gone (killed with SIGKILL), so
    nobody would collect this rank's results or stop it."""
    owner = os.environ.get(OWNER_ENV, "?").split("-")[0]
    print(f"realrun: the run's owner (pid {owner}) is gone; stopping", file=sys.stderr)
    sys.stderr.flush()
    os._exit(3)


# Watch from the first moment: importing torch alone takes seconds.
watch_owner(os.environ.get(OWNER_ENV), _owner_gone)

from realrun.worker import main  # noqa: E402

code = main()
sys.stdout.flush()
sys.stderr.flush()
# Leave without running destructors: gloo's threads (and the messaging threads blocked in
# their last receive) can abort the interpreter's shutdown after a run that went well.
os._exit(code)
