"""Issue 26: a warning is said once. The thread cap above the cores is capped, with a warning, in every
process that applies it: a run's every step, a fine-tune's every epoch, a fleet's every round. Each
distinct warning reaches the user once per command (and once in a run's summary and report), whatever
number of processes said it; the step logs keep their own copies."""
from __future__ import annotations

import json

import yaml

from clitools import run_edgetrain
from edgetrain.runtime import usable_cores

TOO_MANY = usable_cores() + 3  # above this host's cores, whatever the host: every process caps it


def _said(text: str, fragment: str = "capped to") -> list[str]:
    return [ln for ln in text.splitlines() if "warning:" in ln and fragment in ln]


def test_a_run_says_each_warning_once_whatever_its_steps_say(tmp_path):
    recipe = {"name": "warn", "device": "rpi4b-4gb", "model": "edgetrain.nets:pretrained_digits",
              "data": "builtin:digits", "val_split": 0.2, "seed": 0, "threads": TOO_MANY,
              "steps": [{"finetune": {"epochs": 1, "train_layers": "head"}}, {"export": None},
                        {"report": None}]}
    path = tmp_path / "warn.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    res = run_edgetrain("run", path, "-o", tmp_path / "out", cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    said = _said(res.err + res.out)
    # said as the steps ran, and in the summary: twice in all, never once per step
    assert len(said) == 2 and said[0].strip() == said[1].strip(), said
    doc = json.loads((tmp_path / "out" / "result.json").read_text())
    assert len([w for w in doc["warnings"] if "capped to" in w]) == 1
    steps = [s for s in doc["steps"] if s["name"] != "report"]
    for s in steps:  # each step's own log still has it: the record is whole
        assert len(_said(open(s["log"]).read())) == 1, s["log"]
    assert len(_said((tmp_path / "out" / "report.html").read_text())) == 1


def test_finetune_says_the_cap_once_over_its_epochs(cli, tmp_path, digits_npz):
    res = cli("finetune", "edgetrain.nets:digits_cnn", "--data", digits_npz, "-o", tmp_path / "ft", "--epochs", "3",
              "--threads", TOO_MANY, cwd=tmp_path)
    assert res.code in (0, 3), res.err[-2000:]
    assert len(_said(res.err + res.out)) == 1, res.err


def test_predict_says_the_cap_once(cli, tmp_path, digits5_onnx):
    res = cli("predict", digits5_onnx, "builtin:digits", "--threads", TOO_MANY, "--format", "csv",
              "-o", tmp_path / "p.csv", cwd=tmp_path)
    assert res.code == 0, res.err[-2000:]
    assert len(_said(res.err + res.out)) == 1, res.err
