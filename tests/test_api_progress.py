"""The progress stream of every API function that takes ``progress=`` holds to one contract (issue 37, item 6):
within a stage ``done`` never goes down and ``total`` stays; a counted stage's last event has ``done == total``
(finetune's feature events stopped at 1376/1797); epoch events count epochs (their done/total were None); and
the stream ends with ``final=True`` and ``done == total``. Each verb runs for real on the digits model."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import edgetrain

DOC = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"
VERBS = ("finetune", "export", "quantize", "profile", "predict", "tune", "run")


def contract_breaches(events: list) -> list[str]:
    """What in one call's events breaks the stream's contract ([] when nothing does)."""
    bad = [f"not a Progress: {e!r}" for e in events if not isinstance(e, edgetrain.Progress)]
    if bad or not events:
        return bad or ["no event at all"]
    last_seen: dict[str, edgetrain.Progress] = {}
    for e in events:
        if (e.done is None) != (e.total is None):
            bad.append(f"{e.stage}: done {e.done} with total {e.total}")
            continue
        if e.done is None:
            continue
        if not 0 <= e.done <= e.total:
            bad.append(f"{e.stage}: done {e.done} outside 0..{e.total}")
        prev = last_seen.get(e.stage)
        if prev is not None and (e.done < prev.done or e.total != prev.total):
            bad.append(f"{e.stage}: {prev.done}/{prev.total} then {e.done}/{e.total}")
        last_seen[e.stage] = e
    bad += [f"{stage} stopped at {e.done}/{e.total}" for stage, e in last_seen.items() if e.done != e.total]
    epochs = [e for e in events if e.stage == "epoch"]
    bad += [f"epoch {e.metrics.get('epoch')} counted {e.done}/{e.total}" for e in epochs
            if e.done is None or e.done != e.metrics.get("epoch")]
    end = events[-1]
    if not (end.final and end.done is not None and end.done == end.total):
        bad.append(f"the stream ends with {end!r}, not a final event with done == total")
    return bad


def test_the_contract_check_can_fail():
    """Each breach the check exists for is caught (a check that cannot fail is a defect)."""
    P = edgetrain.Progress
    end = P("done", 1, 1, final=True)
    assert contract_breaches([P("features", 32, 1797), P("features", 1376, 1797), end]) == \
        ["features stopped at 1376/1797"]
    assert contract_breaches([P("epoch", metrics={"epoch": 1}, final=True), end]) == ["epoch 1 counted None/None"]
    assert contract_breaches([P("predict", 64, 100), P("predict", 32, 100), P("predict", 100, 100), end]) == \
        ["predict: 64/100 then 32/100"]
    assert contract_breaches([P("x", 1, 2), P("x", 2, 3), P("x", 3, 3), end]) == ["x: 1/2 then 2/3"]
    assert contract_breaches([P("x", 1, 1)])[0].startswith("the stream ends with")
    assert contract_breaches([P("x", message="m", final=True)])[0].startswith("the stream ends with")
    assert contract_breaches([P("x", 2, 1), end])[0] == "x: done 2 outside 0..1"
    assert contract_breaches([]) == ["no event at all"]
    assert contract_breaches([P("x", 1, 1, final=True)]) == []


@pytest.fixture(scope="module")
def streams(tmp_path_factory) -> dict[str, list]:
    """Each verb's events, from one chain of real calls: fine-tune the digits base to ten classes, export it,
    quantize, profile and predict with it, tune on it, and run a two-step recipe."""
    tmp = tmp_path_factory.mktemp("progress")
    events: dict[str, list] = {verb: [] for verb in VERBS}
    got = {verb: events[verb].append for verb in VERBS}
    edgetrain.finetune("edgetrain.nets:pretrained_digits", "builtin:digits", tmp / "ft", epochs=2,
                       progress=got["finetune"])
    edgetrain.export(tmp / "ft" / "model", tmp / "m.onnx", progress=got["export"])
    edgetrain.quantize(tmp / "m.onnx", calib="builtin:digits", output=tmp / "q.onnx", val="builtin:digits",
                       samples=64, latency=False, progress=got["quantize"])
    edgetrain.profile(tmp / "q.onnx", threads=[1], runs=5, progress=got["profile"])
    edgetrain.predict(tmp / "q.onnx", "builtin:digits", progress=got["predict"])
    edgetrain.tune(tmp / "m.onnx", "builtin:digits", tmp / "tuned", grid={"lr": [0.003, 0.03]}, epochs=2,
                   progress=got["tune"])
    (tmp / "r.yaml").write_text("name: tiny\ndevice: rpi4b-4gb\nmodel: edgetrain.nets:pretrained_digits\n"
                                "data: builtin:digits\nsteps:\n  - finetune:\n      epochs: 1\n  - export:\n")
    edgetrain.run(tmp / "r.yaml", rundir=tmp / "run", progress=got["run"])
    return events


@pytest.mark.parametrize("verb", VERBS)
def test_every_stream_keeps_the_contract_and_ends_final_with_done_equal_total(streams, verb):
    events = streams[verb]
    assert contract_breaches(events) == [], [(e.stage, e.done, e.total, e.final) for e in events]
    end = events[-1]
    assert (end.stage, end.done, end.total, end.final) == ("done", 1, 1, True)
    assert end.message.startswith(f"{verb} done in ") and end.metrics["seconds"] >= 0
    assert [e for e in events[:-1] if e.stage == "done"] == []  # one closing event, the last


def test_finetunes_stream_counts_features_training_and_epochs(streams):
    """The feature pass reaches 1797 of 1797, training counts the samples of both epochs in one bar, and the
    epoch events carry 1/2 and 2/2 with their figures."""
    events = streams["finetune"]
    assert [(e.done, e.total) for e in events if e.stage == "features"][-1] == (1797, 1797)
    train = [e for e in events if e.stage == "train"]
    epochs = [e for e in events if e.stage == "epoch"]
    assert train[-1].done == train[-1].total == 2 * epochs[0].metrics["samples"] and train[-1].metrics["epoch"] == 2
    assert [(e.done, e.total, e.final) for e in epochs] == [(1, 2, True), (2, 2, True)]
    assert all(e.metrics["loss"] > 0 and e.metrics["samples_per_s"] > 0 for e in epochs)
    assert epochs[0].metrics["eta_s"] > 0 and epochs[1].metrics["eta_s"] == 0


def test_a_call_that_fails_sends_no_closing_event(tmp_path):
    """The closing event says the work is done: a call that raises does not send it."""
    events = []
    with pytest.raises(edgetrain.UsageError):
        edgetrain.quantize("edgetrain.nets:pretrained_digits", calib=tmp_path / "missing", output=tmp_path / "q.onnx",
                           progress=events.append)
    assert [e for e in events if e.stage == "done"] == []


def _bar_example() -> str:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S) if "def show(" in b]
    assert len(blocks) == 1, "docs/python-api.md shows one progress bar example"
    return blocks[0]


def test_the_docs_progress_bar_example_draws_a_bar_that_ends_full(tmp_path):
    """The progress bar of docs/python-api.md, run as written (in a fresh interpreter, on the digits model):
    what a terminal shows after its redraws is a full bar for each counted stage and the closing line last."""
    script = tmp_path / "bar.py"
    script.write_text("import edgetrain\n" + _bar_example())
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    # bytes: text mode would turn each \r into a line break; a terminal returns to the line's start instead
    out = proc.stdout.decode()
    screen = [line.rsplit("\r", 1)[-1].strip() for line in out.strip("\n").split("\n")]  # as a terminal leaves it
    full = "[" + "#" * 30 + "]"
    bars = [line for line in screen if "[" in line]
    assert [line.split(" [")[0] for line in bars] == ["features", "epoch", "train", "epoch", "done"] or \
        [line.split(" [")[0] for line in bars] == ["prepare", "features", "epoch", "train", "epoch", "done"], screen
    bars = {line.split(" [")[0]: line for line in bars}  # each stage's last line
    assert all(full in line for line in bars.values()), screen
    assert bars["epoch"].endswith("2/2") and bars["features"].endswith("1797/1797")
    assert screen[-1].startswith("done " + full) and "finetune done in" in screen[-1]
