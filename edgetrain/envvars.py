"""Every environment variable edgetrain reads, declared once: its name and what it does.

Code reads them through ``get`` (an undeclared name is a bug, raised at once), and the README's table of
variables is checked against ``DECLARED`` by a test, so neither can drift. Variables that are only
extended or passed on (PASSED_THROUGH) are not settings and are not in the table.
"""
from __future__ import annotations

import os

DECLARED: dict[str, str] = {
    # for users
    "EDGETRAIN_DEBUG": "1: a user error is re-raised with its traceback, and a child's output is shown",
    "EDGETRAIN_CACHE_DIR": "the per-user cache of exported base models (default ~/.cache/edgetrain; empty: no cache)",
    "XDG_CACHE_HOME": "where the cache folder lies when EDGETRAIN_CACHE_DIR is not set",
    "EDGETRAIN_MAX_IMAGE_PIXELS": "the largest image (in pixels) a data folder or predict may decode",
    "EDGETRAIN_POWER": "off: no power sensor is read (energy figures are modelled)",
    "EDGETRAIN_POWER_CALIBRATION": "a calibration file (edgetrain.energy.calibrate): the board's sensor is read "
                                   "through its fit to a meter (default: the file `edgetrain energy calibrate` writes; "
                                   "empty: none)",
    "XDG_CONFIG_HOME": "where `edgetrain energy calibrate` writes the calibration later runs read (default ~/.config)",
    "EDGETRAIN_PROFILE_TIMEOUT": "seconds a profile child may run before it is stopped",
    "EDGETRAIN_DOCTOR_TIMEOUT": "seconds each doctor probe may run",
    "EDGETRAIN_ALLOW_OVERSUBSCRIBE": "1: more threads than the machine's cores are allowed",
    "OMP_NUM_THREADS": "the thread cap in force when no --threads is given (OpenMP's own; edgetrain sets it for children)",
    "MXNET_GLUON_REPO": "the mirror the pretrained zoo weights are fetched from (mxnet's own variable)",
    "EDGETRAIN_DOWNLOAD_DEADLINE": "seconds a pretrained download may take in all (default 1800): a stalled or "
                                   "trickling mirror is given up then, and nothing is left in the cache",
    # for tests and edgetrain's own processes (a user never sets them)
    "EDGETRAIN_TEST_KILL_AT": "PHASE:N: a fine-tune SIGKILLs itself the N-th time it reaches PHASE",
    "EDGETRAIN_SYSFS_ROOT": "the folder read as /sys by the power sensors",
    "EDGETRAIN_VCGENCMD": "the vcgencmd program the Raspberry Pi sensor runs",
    "EDGETRAIN_WATCHED": "1: set on the command's own child under an address-space limit (its parent reports a crash)",
    "EDGETRAIN_FLEET_TAG": "set by edgetrain on the Flower processes a fleet starts, so all of them can be ended",
    "EDGETRAIN_FLEET_TEST_DELAY": "ROUND:SECONDS[:PHASE]: a fleet device (training, sending) or coordinator "
                                  "(aggregating, saving, pruning, pruned) waits that long at that phase of that round (tests)",
}


# Not settings: variables edgetrain only extends or sets around a library's load and then restores, or
# passes on to a child (a library directory, the child's import path, ONNX Runtime's cache folder).
PASSED_THROUGH = ("LD_LIBRARY_PATH", "PYTHONPATH", "XDG_CACHE_HOME")


def get(name: str, default: str | None = None) -> str | None:
    """The variable's value (or ``default``); ``name`` must be declared above."""
    if name not in DECLARED:
        raise KeyError(f"environment variable {name} is not declared in edgetrain.envvars")
    return os.environ.get(name, default)
