"""Every environment variable edgetrain reads, declared once: its name and what it does.

Code reads them through ``get`` (an undeclared name is a bug, raised at once), and the README's table of
variables is checked against ``DECLARED`` by a test, so neither can drift. Variables that only pass
through to a child's environment (OMP_NUM_THREADS and the other thread caps, PYTHONPATH) are not reads.
"""
from __future__ import annotations

import os

DECLARED: dict[str, str] = {
    # for users
    "EDGETRAIN_DEBUG": "set (to anything) to re-raise a user error with its traceback",
    "EDGETRAIN_CACHE_DIR": "the per-user cache of exported base models (default ~/.cache/edgetrain; empty: no cache)",
    "XDG_CACHE_HOME": "where the cache folder lies when EDGETRAIN_CACHE_DIR is not set",
    "EDGETRAIN_MAX_IMAGE_PIXELS": "the largest image (in pixels) a data folder or predict may decode",
    "EDGETRAIN_POWER": "the power sensor to read (a reader's name, or 'none')",
    "EDGETRAIN_PROFILE_TIMEOUT": "seconds a profile child may run before it is stopped",
    "EDGETRAIN_DOCTOR_TIMEOUT": "seconds each doctor probe may run",
    "EDGETRAIN_ALLOW_OVERSUBSCRIBE": "set to 1 to allow more threads than the machine's cores",
    "MXNET_GLUON_REPO": "the mirror the pretrained zoo weights are fetched from (mxnet's own variable)",
    # for tests (a user never sets them)
    "EDGETRAIN_TEST_KILL_AT": "PHASE:N: a fine-tune SIGKILLs itself the N-th time it reaches PHASE",
    "EDGETRAIN_SYSFS_ROOT": "the folder read as /sys by the power sensors",
    "EDGETRAIN_VCGENCMD": "the vcgencmd program the Raspberry Pi sensor runs",
    "EDGETRAIN_FLEET_TAG": "a tag on the Flower processes a fleet starts, so a test can find them",
    "EDGETRAIN_FLEET_TEST_DELAY": "seconds a fleet device sleeps inside a round",
}


def get(name: str, default: str | None = None) -> str | None:
    """The variable's value (or ``default``); ``name`` must be declared above."""
    if name not in DECLARED:
        raise KeyError(f"environment variable {name} is not declared in edgetrain.envvars")
    return os.environ.get(name, default)
