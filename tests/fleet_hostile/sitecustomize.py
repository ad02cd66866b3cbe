"""A hostile fleet device, for tests only: on a device's PYTHONPATH (ahead of edgetrain) this module is
imported by every Python process of that device (its `fleet join`, SuperNode and ClientApp) and, when
EDGETRAIN_TEST_HOSTILE is set, wraps ``edgetrain.fleet.client.train``: the device trains for real, then
sends what the variable says instead of its update. The variable is a comma list, one entry per round
(the last repeats): ``nan``, ``inf``, ``huge`` (1e30 in every value) poison the arrays (sent as fp32);
``count=V`` reports V samples; ``scale=V`` reports V as its control scale (ternary), ``scale=none`` none;
``replay`` sends the reply it sent the round before, byte for byte (kept in EDGETRAIN_TEST_HOSTILE_DIR);
``drop`` leaves one array out of the update, ``extra`` adds one the model does not have; ``honest`` sends
its update as it is.
The product code has no such switch; this lives in tests/ only."""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

PLAN = [x for x in os.environ.get("EDGETRAIN_TEST_HOSTILE", "").split(",") if x]
TARGET = "edgetrain.fleet.client"
VALUES = {"nan": float("nan"), "inf": float("inf"), "huge": 1e30}


def _poison(module) -> None:
    import numpy as np

    real = module.train

    def train(join_path, global_arrays, config):
        import pickle
        from pathlib import Path

        encoded, metrics, facts = real(join_path, global_arrays, config)
        round_no = int(config["round"])
        mode = PLAN[min(round_no, len(PLAN)) - 1]
        keep = Path(os.environ["EDGETRAIN_TEST_HOSTILE_DIR"]) if os.environ.get("EDGETRAIN_TEST_HOSTILE_DIR") else None
        if keep is not None:
            (keep / f"reply-{round_no}.pkl").write_bytes(pickle.dumps((encoded, metrics, facts)))
        metrics = dict(metrics)
        if mode == "honest":
            pass
        elif mode == "replay":
            encoded, metrics, facts = pickle.loads((keep / f"reply-{round_no - 1}.pkl").read_bytes())
        elif mode == "drop":
            encoded = dict(list(encoded.items())[1:])
        elif mode == "extra":
            first = next(iter(encoded.values()))
            encoded = {**encoded, "not_in_this_model": first}
        elif mode in VALUES:
            encoded = {k: module.Encoded("fp32", e.shape, np.full(e.shape, VALUES[mode], "<f4").tobytes())
                       for k, e in encoded.items()}
        elif mode.startswith("count="):
            metrics["num-examples"] = float(mode[len("count="):])
        elif mode == "scale=none":
            metrics.pop("control-scale")
        elif mode.startswith("scale="):
            metrics["control-scale"] = float(mode[len("scale="):])
        else:
            raise ValueError(f"EDGETRAIN_TEST_HOSTILE: unknown entry {mode!r}")
        return encoded, metrics, facts

    module.train = train


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            _poison(module)

        spec.loader.exec_module = exec_module
        return spec


if PLAN:
    sys.meta_path.insert(0, _Finder())
