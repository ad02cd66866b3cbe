"""Round 5 (issue 37.8): the per-user cache of the device speed reference is input too. A fine-tune's modelled
energy on --device is this host's CPU time x the device's speed factor, whose host half is kept in
EDGETRAIN_CACHE_DIR/device-speed-reference.json for 10 minutes. A kept record another edgetrain wrote, or an
edited one, with a negative, NaN or non-number time gave a negative or NaN energy with exit 0, and one without
its runtime a KeyError traceback (exit 1). Now a kept record whose figures are not finite positive numbers is not
used: the reference is timed again, the energy is finite and positive, exit 0."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import edgetrain
from tests.clitools import run_edgetrain

ONNX = str(Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx")
CACHE = "device-speed-reference.json"


def _finetune(tmp: Path, cache: Path, name: str):
    out = tmp / name
    res = run_edgetrain("finetune", ONNX, "--data", "builtin:digits", "--epochs", "1", "--threads", "1",
                        "--device", "rpi4b-4gb", "-o", out, "--json", tmp / f"{name}.json",
                        env={"EDGETRAIN_CACHE_DIR": str(cache)})
    return res, (json.loads((tmp / f"{name}.json").read_text()) if (tmp / f"{name}.json").is_file() else None)


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """A real kept record: the one a first fine-tune on the device writes."""
    tmp = tmp_path_factory.mktemp("speed")
    cache = tmp / "cache"
    res, doc = _finetune(tmp, cache, "first")
    assert res.code == 0, res.err[-2000:]
    record = json.loads((cache / CACHE).read_text())
    assert len(record) == 1 and doc["energy"]["joules"] > 0
    return record


EDITS = {
    "negative cpu time": {"cpu_p50_ms": -5.0},
    "NaN cpu time": {"cpu_p50_ms": float("nan")},
    "cpu time a string": {"cpu_p50_ms": "7.9"},
    "zero wall time": {"p50_ms": 0},
    "no runtime": {"runtime": None},
    "infinite wall time, no cpu time": {"p50_ms": float("inf"), "cpu_p50_ms": None},
}


@pytest.mark.parametrize("edit", EDITS, ids=list(EDITS))
def test_a_kept_speed_record_with_a_bad_figure_is_timed_again(kept, edit, tmp_path):
    key, rec = next(iter(kept.items()))
    rec = {**rec, **EDITS[edit]}
    if rec.get("runtime") is None:
        rec.pop("runtime")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / CACHE).write_text(json.dumps({key: rec}))
    res, doc = _finetune(tmp_path, cache, "run")
    assert res.code == 0, res.err[-3000:]
    assert "Traceback" not in res.err
    energy = doc["energy"]
    assert math.isfinite(energy["joules"]) and energy["joules"] > 0, energy["joules"]
    assert math.isfinite(energy["speed_factor"]) and energy["speed_factor"] > 0
    assert "timed after the run" in energy["speed"]["source"]  # timed again, not taken from the cache
    line = next(ln for ln in res.out.splitlines() + res.err.splitlines() if ln.startswith("energy"))
    assert "nan" not in line and " -" not in line, line
