"""edgetrain tune: the grid, the schedule, the outputs, the budgets and every bad input (one line, exit 2,
before any training), on the shipped digits CNN as ONNX (no mxnet in these runs)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

import edgetrain
from clitools import assert_user_error, run_edgetrain
from edgetrain.errors import UsageError
from edgetrain.tuning import halving, planned_epochs, read_grid, rung_epochs
from tunetools import digits_task, model_weights, trials_of, what_was_decided


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> dict:
    return digits_task(tmp_path_factory.mktemp("tune-task"))


GRID = {"lr": [0.003, 0.03], "train_layers": ["head", "lite"]}


@pytest.fixture(scope="module")
def tuned(task, tmp_path_factory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("tuned") / "out"
    res = edgetrain.tune(task["model"], task["train"], out, val=task["val"], grid=GRID, epochs=3, threads=1,
                         progress=None)
    return out, res


# --- the schedule and the grid -------------------------------------------------------------------------------

def test_halving_on_the_issue_grid_trains_a_quarter_of_the_grid_epochs():
    assert rung_epochs(6) == [1, 2, 6]
    assert rung_epochs(10) == [1, 3, 10]
    assert rung_epochs(3) == [1, 3]
    assert rung_epochs(1) == [1]
    assert rung_epochs(2) == [1, 2]
    rungs = halving(15, 6)
    assert [(r.epochs, r.keep) for r in rungs] == [(1, 15), (2, 5), (6, 1)]
    assert planned_epochs(rungs, [6] * 15) == 24  # 15 x 1 + 5 x 1 + 1 x 4, where the grid trains 90


def test_a_first_rung_of_a_fraction_of_an_epoch_with_min_rung():
    assert rung_epochs(6, min_rung=0.5) == [0.6667, 2, 6]   # two thirds of an epoch's steps
    assert rung_epochs(6, eta=4, min_rung=0.5) == [0.5, 2, 6]
    assert rung_epochs(10, min_rung=0.5) == [1, 3, 10]      # 1/3 of an epoch is under 0.5
    assert rung_epochs(2, min_rung=0.8) == [1, 2]
    assert rung_epochs(1, min_rung=0.2) == [0.3333, 1]
    rungs = halving(15, 6, min_rung=0.5)
    assert [(r.epochs, r.keep) for r in rungs] == [(0.6667, 15), (2, 5), (6, 1)]
    assert planned_epochs(rungs, [6] * 15) == pytest.approx(15 * 0.6667 + 5 * (2 - 0.6667) + 4)


def test_a_tie_in_held_out_accuracy_goes_to_the_cheaper_work_not_to_the_less_loaded_run():
    """Two trials of the same work (trained part, batch size, epochs) tie on device time and memory whatever their
    runs measured (the load's share), so a tie in accuracy goes to grid order; another kind of work that costs less
    per epoch wins it. Costs per kind come from the first rung's runs."""
    from edgetrain.tuning.records import Trial, rank_key, work_costs

    def trial(number, layers, seconds, peak, acc=0.95):
        t = Trial(number, {"lr": 0.01 * number, "optimizer": "adam", "batch_size": 32, "train_layers": layers,
                           "epochs": 6})
        t.rungs = [{"rung": 0, "epochs": 6, "trained": 6, "val_accuracy": acc, "seconds": seconds, "peak_mb": peak}]
        return t

    a, b = trial(1, "lite", 8.6, 101.0), trial(2, "lite", 8.4, 100.5)   # b's run was less slowed
    costs = work_costs([a, b])
    assert costs[("lite", 32)] == (pytest.approx(8.5 / 6), 101.0)
    assert min([b, a], key=lambda t: rank_key(t, "accuracy", costs=costs)) is a        # grid order
    assert min([a, b], key=lambda t: rank_key(t, "accuracy")) is b                      # (measured: the load's pick)
    c = trial(3, "bias", 4.0, 99.0)
    costs = work_costs([a, b, c])
    assert min([a, b, c], key=lambda t: rank_key(t, "accuracy", costs=costs)) is c     # cheaper work wins the tie
    d = trial(4, "lite", 9.0, 101.0, acc=0.96)
    assert min([a, b, c, d], key=lambda t: rank_key(t, "accuracy", costs=work_costs([a, b, c, d]))) is d


def test_a_grid_in_the_seeds_form_reads_as_the_flags_do(tmp_path):
    f = tmp_path / "grid.yaml"
    f.write_text("param_dict:\n  learning_rate: [0.1, 0.01, 1e-3]\n  train_layers: [head, last:2]\n"
                 "objective: validation_accuracy\n")
    grid = read_grid(str(f))
    assert grid.axes == {"lr": [0.1, 0.01, 0.001], "train_layers": ["head", "last:2"]}
    assert grid.objective == "accuracy"
    assert len(grid.points()) == 6
    assert read_grid("lr=0.1,0.01,0.001;train_layers=head,last:2").axes == grid.axes


def test_momentum_and_weight_decay_are_searched_in_the_seeds_form(tmp_path):
    f = tmp_path / "grid.yaml"
    f.write_text("param_dict:\n  learning_rate: [0.1, 0.01]\n  momentum: [0.9, 0.95]\n  wd: [0, 1e-3]\n"
                 "  optimizer: [sgd]\n")
    grid = read_grid(str(f))
    assert grid.axes == {"lr": [0.1, 0.01], "momentum": [0.9, 0.95], "weight_decay": [0.0, 0.001],
                         "optimizer": ["sgd"]}
    assert len(grid.points()) == 8


@pytest.mark.parametrize("text, fragment", [
    ("param_dict:\n  learning_rate: [0.1]\nmomentum: 0.9\n", "unknown key 'momentum'"),
    ("param_dict: {}\n", "param_dict is missing or empty"),
    ("param_dict:\n  learning_rate: [-0.1]\n", "finetune refuses --lr"),
    ("param_dict:\n  learning_rate: [0.1]\nobjective: validation_loss\n", "objective 'validation_loss'"),
    ("- 1\n- 2\n", "a grid file is a mapping"),
])
def test_a_bad_grid_file_is_refused_naming_the_file_and_field(tmp_path, text, fragment):
    f = tmp_path / "grid.yaml"
    f.write_text(text)
    with pytest.raises(UsageError) as err:
        read_grid(str(f))
    assert fragment in err.value.what
    assert str(f) in err.value.where


# --- bad input: one line, exit 2, before any training, nothing left behind -------------------------------------

BAD = {
    "empty grid": ([], "the grid is empty"),
    "empty grid text": (["--grid", ""], "the grid is empty"),
    "unknown name": (["--grid", "learning_speed=0.1"], "unknown name 'learning_speed'"),
    "negative lr": (["--grid", "lr=0.01,-1"], "finetune refuses --lr '-1'"),
    "last:0": (["--grid", "train_layers=head,last:0"], "finetune refuses --train-layers 'last:0'"),
    "more layers than the model has": (["--grid", "train_layers=head,last:99"], "last:99"),
    "unknown optimizer": (["--grid", "optimizer=sgd,rmsprop"], "'sgd' or 'adam'"),
    "batch size 0": (["--grid", "batch_size=0,32"], "--batch-size"),
    "epochs 0": (["--grid", "epochs=0"], "--epochs"),
    "min-rung 0": (["--grid", "lr=0.01", "--min-rung", "0"], "--min-rung"),
    "min-rung over an epoch": (["--grid", "lr=0.01", "--min-rung", "1.5"], "--min-rung"),
    "a name twice": (["--grid", "lr=0.1", "--grid", "learning_rate=0.2"], "names 'lr' twice"),
    "momentum with adam": (["--grid", "momentum=0.9,0.95"], "--momentum has no effect without --optimizer sgd"),
    "momentum of 1": (["--grid", "optimizer=sgd", "--grid", "momentum=0.9,1"], "finetune refuses --momentum '1'"),
    "negative weight decay": (["--grid", "wd=0,-1e-4"], "finetune refuses --weight-decay '-1e-4'"),
    "no point fits the memory budget": (["--grid", "lr=0.01,0.1", "--grid", "train_layers=head,lite",
                                         "--memory-budget", "40MB"], "no point of the grid fits the memory budget"),
    "energy without a device": (["--grid", "lr=0.01", "--objective", "energy:1"], "needs the device's power"),
    "a missing grid file": (["--grid", "nowhere.yaml"], "grid file not found"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_and_exit_2_before_any_training(task, tmp_path, case):
    args, fragment = BAD[case]
    out = tmp_path / "out"
    res = run_edgetrain("tune", task["model"], "--data", task["train"], "--val", task["val"], *args, "-o", out,
                        "--threads", "1", env={"EDGETRAIN_TEST_KILL_AT": "step:1"})  # a step would die (-9)
    assert_user_error(res, 2, fragment)
    assert not out.exists()


def test_a_gluon_model_is_refused_with_the_export_to_make(task, tmp_path):
    res = run_edgetrain("tune", "edgetrain.nets:pretrained_digits", "--data", task["train"], "--grid", "lr=0.01",
                        "-o", tmp_path / "out")
    assert_user_error(res, 2, "tune trains from an ONNX file")


# --- a run: the choice, the outputs ---------------------------------------------------------------------------

def test_the_chosen_trial_is_the_best_held_out_and_its_model_is_written(tuned, task):
    out, res = tuned
    rows = trials_of(out)
    assert [r["trial"] for r in rows] == [1, 2, 3, 4]
    assert [(r["lr"], r["train_layers"]) for r in rows] == [(0.003, "head"), (0.003, "lite"), (0.03, "head"),
                                                             (0.03, "lite")]
    # rung 1 (1 epoch): all four; rung 2 (3 epochs): the best one and, if it is a head trial, the best lite one
    # (lite trains more weights: it may learn slower and end higher)
    finished = [r for r in rows if r["epochs_run"] == 3]
    first = lambda r: (r["accuracy_by_rung"][0]["val_accuracy"], -r["accuracy_by_rung"][0]["device_seconds"])  # noqa: E731
    leader = max(rows, key=first)
    want = {leader["train_layers"]} | ({"lite"} if leader["train_layers"] == "head" else set())
    assert sorted(r["train_layers"] for r in finished) == sorted(want)
    for kind in want:
        assert max((r for r in rows if r["train_layers"] == kind), key=first)["epochs_run"] == 3
    chosen = max(finished, key=lambda r: (r["val_accuracy"], -r["device_seconds"]))
    assert chosen["status"] == "chosen" and res.chosen["trial"] == chosen["trial"] and res.passed
    assert res.epochs_run == 4 + 2 * len(finished) < res.grid_epochs == 12
    finished = [chosen]

    # OUTDIR/model.onnx is the chosen trial's, its configuration in the metadata, and it scores what was recorded
    import onnx
    import onnxruntime as ort

    proto = onnx.load(str(out / "model.onnx"))
    meta = {p.key: p.value for p in proto.metadata_props}
    config = json.loads(meta["edgetrain.tune"])
    assert (config["train_layers"], config["lr"], config["epochs_run"]) == (finished[0]["train_layers"], finished[0]["lr"], 3)
    weights = model_weights(out / "model.onnx")
    trial_w = model_weights(out / "trials" / f"{finished[0]['trial']:03d}" / "model.onnx")
    assert weights.keys() == trial_w.keys() and all(np.array_equal(weights[k], trial_w[k]) for k in weights)
    from edgetrain.data import load_data
    from edgetrain.models import load_onnx

    ds = load_data(str(task["val"]), load_onnx(out / "model.onnx").preprocess)
    x, y = ds.arrays()
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    top1 = float(np.mean(np.argmax(sess.run(None, {sess.get_inputs()[0].name: x})[0], axis=1) == y))
    assert top1 == pytest.approx(finished[0]["val_accuracy"], abs=1e-9)


def test_the_trials_table_is_in_the_csv_the_json_and_the_report(tuned):
    out, res = tuned
    with open(out / "trials.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["trial"]) for r in rows] == [t["trial"] for t in res.trials]
    assert [r["status"] for r in rows] == [t["status"] for t in res.trials]
    for r, t in zip(rows, res.trials):
        assert float(r["val_accuracy"]) == pytest.approx(t["val_accuracy"])
        assert r["accuracy_by_rung"].startswith("1:")
        assert float(r["device_seconds"]) > 0 and float(r["peak_mb"]) > 0
    stopped = [t for t in res.trials if t["status"] == "stopped"]
    ran_on = [t for t in res.trials if t["epochs_run"] == 3]
    assert len(stopped) == 4 - len(ran_on) and all("not among the best 1 at rung 1" in t["why"] for t in stopped)
    assert [t["status"] for t in res.trials].count("finished") == len(ran_on) - 1
    doc = json.loads((out / "tune.json").read_text())
    assert doc["trials"] == json.loads(json.dumps(res.to_dict()["trials"]))
    html = (out / "report.html").read_text()
    assert html.count("<circle") >= 4 + 1 and "chosen: trial" in html  # a point per trial, the chosen one ringed
    assert f"chosen: trial {res.chosen['trial']}" in html


def test_head_trials_share_one_feature_pass_and_data_is_decoded_once(tuned):
    out, res = tuned
    rows = {t["trial"]: t for t in res.trials}
    head_runs = sum(len(t["accuracy_by_rung"]) for t in res.trials if t["train_layers"] == "head")
    features = {k: res.features[k] for k in ("computed", "shared")}
    assert head_runs >= 2 and features == {"computed": 1, "shared": head_runs - 1}  # every head run, one pass
    # the first rung's two trials of each part run together, the second on the first one's build
    assert res.features["builds"]["reused"] >= 2
    assert rows[1]["feature_seconds"] > 0 and rows[3]["feature_seconds"] == 0
    data = np.load(out / "data" / "train.npz")
    assert data["data"].shape[1:3] == (16, 16)  # at the model's input size: no trial resizes again


@pytest.fixture(scope="module")
def mobilenet_task(tmp_path_factory) -> dict:
    """MobileNetV2's layout at 1x80x80 (random weights), where bias and head need different memory; 40 digits."""
    import onnx

    from onnx_models import mobilenet_v2
    from tunetools import SHIPPED

    folder = tmp_path_factory.mktemp("tune-mnv2")
    proto = onnx.load_from_string(mobilenet_v2((1, 1, 80, 80), classes=5))
    for value in (proto.graph.input[0], proto.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    props = {p.key: p.value for p in onnx.load(str(SHIPPED)).metadata_props if p.key != "edgetrain.source_model"}
    props["edgetrain.preprocess"] = json.dumps({**json.loads(props["edgetrain.preprocess"]), "input_shape": [1, 80, 80]})
    props["edgetrain.random_weights"] = "true"
    onnx.helper.set_model_props(proto, props)
    onnx.save(proto, str(folder / "mnv2.onnx"))
    task = digits_task(folder / "data", train=40, val=20)
    return {**task, "model": folder / "mnv2.onnx"}


def _least_mb(task, layers: str, tmp_path) -> int:
    """The least budget the plan says ``layers`` needs here (its refusal of a budget far too small)."""
    res = run_edgetrain("tune", task["model"], "--data", task["train"], "--val", task["val"], "--grid",
                        f"train_layers={layers}", "--epochs", "1", "--threads", "1", "--memory-budget", "40MB",
                        "-o", tmp_path / f"least-{layers}")
    assert_user_error(res, 2, "no point of the grid fits the memory budget")
    import re

    return int(re.search(r"(?:to at least|a budget below) (\d+) MB", res.err).group(1))


@pytest.mark.slow
def test_a_trial_that_would_not_fit_is_skipped_before_it_runs(mobilenet_task, tmp_path):
    """Budgets from below what either of all and head needs alone upwards, on a grid of both (their plans need
    different memory here): at every budget each trial is skipped before it runs (no folder, no epoch, the table
    says why) or trains within the budget; at one of them one is skipped while the other trains."""
    task = mobilenet_task
    least = min(_least_mb(task, "all", tmp_path), _least_mb(task, "head", tmp_path))
    split = []
    for budget in range(least - 40, least + 80, 8):
        out = tmp_path / f"out{budget}"
        res = run_edgetrain("tune", task["model"], "--data", task["train"], "--val", task["val"], "--grid",
                            "train_layers=all,head", "--epochs", "1", "--threads", "1", "--memory-budget",
                            f"{budget}MB", "-o", out, "--json", "-")
        if res.code == 2:
            assert_user_error(res, 2, "no point of the grid fits the memory budget")
            assert not out.exists()
            continue
        assert res.code == 0, res.err[-2000:]
        doc = res.json()
        assert 0 < doc["peak_rss_mb"] <= budget
        with open(out / "trials.csv", newline="") as fh:
            table = {r["train_layers"]: r for r in csv.DictReader(fh)}
        for t in doc["trials"]:
            if t["status"] == "skipped":
                assert "would not fit" in t["why"] and t["epochs_run"] == 0
                assert not (out / "trials" / f"{t['trial']:03d}").exists()
                assert table[t["train_layers"]]["status"] == "skipped" and "would not fit" in table[t["train_layers"]]["why"]
            else:
                assert t["epochs_run"] == 1 and t["peak_mb"] <= budget
        statuses = sorted(t["status"] for t in doc["trials"])
        if statuses[-1] == "skipped" and statuses[0] in ("chosen", "finished"):
            split.append(budget)
        if "skipped" not in statuses:
            break
    assert split, f"no budget from {least - 40} MB on which one of all and head was skipped and the other trained"


def test_the_time_budget_stops_within_one_trial_epoch(task, tmp_path):
    res = edgetrain.tune(task["model"], task["train"], tmp_path / "out", val=task["val"],
                         grid={"lr": [0.001, 0.003, 0.01, 0.03], "train_layers": ["lite"]}, epochs=20, threads=1,
                         strategy="grid", time_budget=3, progress=None)
    assert res.stopped_by_time
    # one trial-epoch as measured: the most a trial's run took per epoch, its set-up with it (under load, longer)
    epoch_s = res.trial_epoch_s()
    one_run = [r["device_seconds"] for t in res.trials for r in t["accuracy_by_rung"][:1] if r["epochs"] == 1]
    assert one_run and epoch_s >= max(one_run)   # (a trial's first run is one epoch: all of it counts)
    assert res.seconds <= 3 + epoch_s, (res.seconds, epoch_s)
    assert any(t["status"] == "not run" and t["why"] == "time budget" for t in res.trials)
    assert res.passed and res.chosen["epochs_run"] >= 1


# --- resume ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, fragment", [
    (["--grid", "lr=0.003,0.01", "--grid", "train_layers=head,lite"], "different grid"),
    (["--grid", "lr=0.003,0.03", "--grid", "train_layers=head,lite", "--seed", "1"], "different --seed"),
    (["--grid", "lr=0.003,0.03", "--grid", "train_layers=head,lite", "--min-rung", "0.5"], "different --min-rung"),
    (["--grid", "lr=0.003,0.03", "--grid", "train_layers=head,lite", "--data-is-val"], "different DATA"),
])
def test_a_resume_with_a_changed_grid_data_or_seed_is_refused(tuned, task, change, fragment, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(tuned[0], out)
    before = (out / "journal.jsonl").read_bytes()
    data = task["val"] if "--data-is-val" in change else task["train"]
    args = [a for a in change if a != "--data-is-val"]
    res = run_edgetrain("tune", task["model"], "--data", data, "--val", task["val"], *args, "--epochs", "3",
                        "-o", out, "--threads", "1", "--resume")
    assert_user_error(res, 2, "cannot resume", fragment)
    assert (out / "journal.jsonl").read_bytes() == before


def test_each_journal_line_is_on_the_disk_before_any_later_checkpoint(task, tmp_path, monkeypatch):
    """A line's fsync runs beside the next trial's set-up: every checkpoint a later job writes comes after it is
    waited for (a power cut then finds every fact the checkpoint builds on)."""
    from edgetrain.training import checkpoint
    from edgetrain.tuning import journal

    journals, unsynced_at_save = [], []
    append, save = journal.Journal.append, checkpoint.save

    def appending(self, *records):
        journals.append(self)
        append(self, *records)

    def saving(*args, **kwargs):
        unsynced_at_save.append(any(j._syncing is not None for j in journals))
        save(*args, **kwargs)

    monkeypatch.setattr(journal.Journal, "append", appending)
    monkeypatch.setattr(checkpoint, "save", saving)
    edgetrain.tune(task["model"], task["train"], tmp_path / "out", val=task["val"], grid=GRID, epochs=2, threads=1,
                   progress=None)
    assert journals and len(unsynced_at_save) >= 4 and not any(unsynced_at_save)   # 4 trials, one or more each


def test_a_resume_after_a_torn_journal_line_decides_the_same(tuned, task, tmp_path):
    """A power cut in the middle of the journal's last line: the line is dropped and its fact measured again."""
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(tuned[0], out)
    journal = out / "journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:-1]) + lines[-1][:len(lines[-1]) // 2])
    for name in ("model.onnx", "tune.json", "trials.csv", "report.html"):
        (out / name).unlink()
    res = edgetrain.tune(task["model"], task["train"], out, val=task["val"], grid=GRID, epochs=3, threads=1,
                         resume=True, progress=None)
    assert res.resumed
    assert what_was_decided(out) == what_was_decided(tuned[0])
    assert all(json.loads(line) for line in journal.read_bytes().splitlines())  # no torn line left inside


def test_with_a_device_each_trial_has_its_energy_and_the_objective_weighs_latency(task, tmp_path):
    """--device: each trial's energy is the job's, labelled as finetune labels it; --objective latency:W takes
    W points off per ms of one inference of the trial's model (measured once per kind of graph)."""
    res = edgetrain.tune(task["model"], task["train"], tmp_path / "out", val=task["val"], grid=GRID, epochs=2,
                         threads=1, device="rpi4b-4gb", objective="latency:2", progress=None)
    assert res.objective == "latency:2"
    for t in res.trials:
        assert t["energy_j"] > 0 and t["energy_provenance"] == "modelled"
        assert t["latency_ms"] > 0 and t["energy_per_inference_mj"] > 0
        assert t["score"] == pytest.approx(100 * t["val_accuracy"] - 2 * t["latency_ms"])
    latency = {t["train_layers"]: t["latency_ms"] for t in res.trials}
    assert all(t["latency_ms"] == latency[t["train_layers"]] for t in res.trials)  # once per kind of graph
    best = max((t for t in res.trials if t["epochs_run"] == 2), key=lambda t: t["score"])
    assert res.chosen["trial"] == best["trial"]


def test_an_objective_from_the_grid_file_measures_every_trial_model(task, tmp_path):
    """The grid file's objective (latency:W) is the run's: every trial's model is written for its latency, the
    trials that stopped at the first rung too."""
    f = tmp_path / "grid.yaml"
    f.write_text("param_dict:\n  learning_rate: [0.003, 0.03]\n  train_layers: [head, lite]\nobjective: latency:1\n")
    res = edgetrain.tune(task["model"], task["train"], tmp_path / "out", val=task["val"], grid=str(f), epochs=3,
                         threads=1, progress=None)
    assert res.objective == "latency:1"
    assert any(t["status"] == "stopped" for t in res.trials)
    assert all(t["latency_ms"] > 0 for t in res.trials)


@pytest.mark.slow
def test_a_recipe_tune_step_hands_its_model_to_the_next_step(tmp_path):
    """export -> tune -> quantize: quantize's MODEL is tune/model.onnx."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: tune-step\ndevice: rpi4b-4gb\nmodel: edgetrain.nets:pretrained_digits\n"
                      "data: builtin:digits\nval_split: 0.2\nthreads: 1\nsteps:\n  - export:\n"
                      "  - tune:\n      grid: {lr: [0.01, 0.03], train_layers: [head, lite]}\n      epochs: 2\n"
                      "  - quantize:\n      max_drop: 5.0\n")
    res = run_edgetrain("run", recipe, "-o", tmp_path / "run", "--json", "-")
    assert res.code == 0, res.err[-3000:]
    run = tmp_path / "run"
    spec = json.loads((run / "steps" / "quantize.options.json").read_text())
    assert Path(spec["model"]) == run / "tune" / "model.onnx"
    tuned = json.loads((run / "steps" / "tune.json").read_text())
    assert tuned["passed"] and Path(tuned["model"]) == run / "tune" / "model.onnx"
    assert (run / "tune" / "trials.csv").is_file() and (run / "steps" / "tune.files.json").is_file()


def _top_fields(data: bytes) -> list[tuple[int, int, int, int]]:
    """The top-level protobuf fields of ``data``: (number, start, end of tag and value/length, end)."""
    def varint(i):
        n = shift = 0
        while True:
            n |= (data[i] & 0x7F) << shift
            shift += 7
            i += 1
            if data[i - 1] < 0x80:
                return n, i

    fields, i = [], 0
    while i < len(data):
        tag, j = varint(i)
        value, k = varint(j)   # (ModelProto: varint and length-delimited fields only)
        fields.append((tag >> 3, i, k, k + (value if tag & 7 == 2 else 0)))
        i = fields[-1][3]
    return fields


def test_a_model_cut_inside_any_field_is_refused_not_written_with_a_zero(tmp_path):
    """with_metadata_streamed on a real ONNX file (the shipped digits CNN, with a model_version of 6 varint bytes)
    cut at every byte inside each varint field, inside each length-delimited field's tag and length, at the
    last byte of its payload and at every byte of its metadata entries: each refused, naming the file, and the
    output (there before) left as it was."""
    import onnx

    from edgetrain.training import with_metadata_streamed

    model = onnx.load(str(Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx"))
    model.model_version = 2**40 + 12345
    data = model.SerializeToString()
    fields = _top_fields(data)
    assert {n for n, *_ in fields} >= {1, 5, 7, 8, 14}   # ir_version, model_version, graph, opset, metadata
    cuts = set()
    for number, start, head, end in fields:
        if head == end:   # a varint field: every byte after its start
            cuts.update(range(start + 1, end))
        else:
            cuts.update(range(start + 1, head + 1))
            cuts.update(range(head + 1, end) if number == 14 else [end - 1])
    assert len(cuts) > 100 and all(0 < c < len(data) for c in cuts)
    dst = tmp_path / "out.onnx"
    dst.write_bytes(b"kept")
    for cut in sorted(cuts):
        src = tmp_path / "cut.onnx"
        src.write_bytes(data[:cut])
        with pytest.raises(UsageError, match="truncated") as info:
            with_metadata_streamed(src, dst, "k", "v", "model")
        assert info.value.where.endswith("cut.onnx"), cut
        assert dst.read_bytes() == b"kept", cut
    src.write_bytes(data)   # whole, it is copied
    with_metadata_streamed(src, dst, "k", "v", "model")
    assert onnx.load(str(dst)).model_version == model.model_version


def test_the_chosen_model_is_written_streamed_with_its_configuration_replacing_any_earlier(tuned, tmp_path):
    """output.write_model copies the trial's file field by field (not loaded: 36 MB at MobileNetV2 80x80 where a
    budgeted run peaked): the same model onnx's load and save would give, its entry set once however often."""
    import onnx

    from edgetrain.tuning.output import META_KEY, write_model

    out, res = tuned
    src = out / "trials" / f"{res.chosen['trial']:03d}" / "model.onnx"
    first, second = tmp_path / "first.onnx", tmp_path / "second.onnx"
    write_model(src, first, {"a": 1})
    write_model(first, second, {"b": 2})
    expected = onnx.load(str(src))
    expected.metadata_props.add(key=META_KEY, value=json.dumps({"b": 2}))
    got = onnx.load(str(second))
    assert got == expected
    assert [p.value for p in got.metadata_props if p.key == META_KEY] == ['{"b": 2}']
    onnx.checker.check_model(got)
