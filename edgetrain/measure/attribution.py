"""A meter's export, made after the run, attributed to a finished profile's windows.

The Nordic PPK2 and Otii apps write their CSV only once the recording is stopped, so ``--power-log``
(read when the command ends) cannot be given to the run. ``profile --meter-export`` holds each
configuration's idle stretch and timed window as ``--power-log`` would and records them in the result
(``meter_windows``; a fine-tune records its run's in ``energy.meter_windows``, ``finetune --meter-export``
holding the idle stretch); ``attribute`` then reads the export and gives the result the measured figures the run
would have had with ``--power-log``: each configuration's ``power`` record, the board figures in
``host_energy``, and on the device itself the measured energy per inference as the headline (the modelled
one beside it), with its budget, carbon and provenance; a fine-tune's joules, per epoch and per sample.
"""
from __future__ import annotations

from dataclasses import fields

from .. import __version__, energy
from ..errors import UsageError
from ..results import seal_windows, sealed_as_written

_FIX_RUN = ("run `edgetrain profile` (or `finetune`) with --meter-export and --json RESULT, with this edgetrain, while "
            "the meter records")


# The latest clock time a window may hold (Unix s, the year 2242): beyond it a window was edited, not recorded.
_LATEST = 2.0 ** 33


def clock_window(w) -> tuple[float, float] | None:
    """``w`` as a window of this machine's clock (two Unix times, the start before the end), None when it is not
    one (an edited result: NaN, strings, a reversed or out-of-range pair)."""
    if not (isinstance(w, (list, tuple)) and len(w) == 2
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in w)):
        return None
    t0, t1 = float(w[0]), float(w[1])
    return (t0, t1) if 0 < t0 < t1 < _LATEST else None  # NaN fails every comparison


def first_window(result) -> float | None:
    """When the first window ``result`` records starts (Unix s): the day a log with the time of day alone is
    placed on, as the run's own read would have placed it; None when the result records none (or not as one)."""
    try:
        if isinstance(result.get("configs"), list):
            w = clock_window(result["meter_windows"]["configs"][0]["timed"])
        else:
            w = clock_window(result["energy"]["meter_windows"]["timed"])
    except (AttributeError, KeyError, IndexError, TypeError):
        return None
    return w[0] if w else None


def attribute(result: dict, log, where: str, parsed=None, grid: dict | None = None) -> dict:
    """``result`` (a profile's or a fine-tune's JSON) with the meter log ``log`` (a ``PowerLog``) read over its
    windows; ``parsed``: the log as ``energy.read_meter_export`` read it (else it is read here), placed on the
    day of ``first_window(result)``. ``grid``: the grid intensity the grams use (--country/--grid-intensity),
    else the one the run used, if any."""
    from .profiling import ProfileResult, collect_figures, host_board, log_power

    if isinstance(result, dict) and "configs" not in result and isinstance(result.get("energy"), dict) \
            and "trained_parameters" in result:
        return _attribute_run(result, log, where, parsed, grid)
    if not isinstance(result, dict) or not isinstance(result.get("configs"), list):
        raise UsageError("not an edgetrain profile or finetune result (no 'configs', no fine-tune energy)", where,
                         _FIX_RUN)
    windows = result.get("meter_windows")
    _check_windows(result, windows, "profile", where)
    if len(windows["configs"]) != len(result["configs"]):
        raise UsageError("the result's windows do not match its configurations (edited?)", where, _FIX_RUN)
    out = dict(result)
    configs, read = [], ({"log": parsed} if parsed is not None else {})
    for c, w in zip(result["configs"], windows["configs"]):
        if not isinstance(c, dict):
            raise UsageError("the result's configurations are not records (edited?)", where, _FIX_RUN)
        c = {**c, "power": {**(c.get("power") or {}), "window_wall": list(w["timed"])}, "wall_idle": w.get("idle")}
        c["power"] = log_power(log, c, read, _board_w(windows))
        c["power"]["attributed"] = {"by": "edgetrain energy attribute", "log": str(log)}
        configs.append(c)
    out["configs"] = configs
    board = host_board(configs, bool(windows.get("on_device")))
    he = dict(out.get("host_energy") or {})
    he.pop("board_note", None)
    he["board"] = board
    out["host_energy"] = he
    en = out.get("energy")
    if grid is not None and not (en and en.get("per_inference")):
        raise UsageError("grams of CO2e need the device's energy figures, and the result has none (it was run "
                         "without --device)", "--country/--grid-intensity",
                         "leave --country/--grid-intensity out, or profile again with --device NAME")
    if windows.get("on_device") and en and en.get("per_inference"):
        threads = (out.get("verdict", {}).get("latency") or {}).get("threads")
        mine = next((b for b in board if b["threads"] == threads), None)
        if mine is not None:
            en = out["energy"] = _measured_headline(dict(en), {k: v for k, v in mine.items() if k != "threads"})
    if grid is not None:
        out["energy"] = {**en, "carbon": energy.carbon_of_report(en, grid)}
    res = ProfileResult(**{f.name: out[f.name] for f in fields(ProfileResult) if f.name in out})
    res.figures = collect_figures(res)
    return res.to_dict()


def _board_w(windows: dict) -> tuple[float, float] | None:
    """The device's idle and busy watts the run recorded beside its windows (sealed with them), if any."""
    pair = windows.get("board_w")
    if isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                          and 0 < x < 1e6 for x in pair):
        return float(pair[0]), float(pair[1])
    return None


def _check_windows(result: dict, windows, command: str, where: str) -> None:
    if not isinstance(windows, dict) or not (windows.get("configs") or windows.get("timed")):
        raise UsageError("the result records no measured windows (written by an edgetrain before they were kept)",
                         where, _FIX_RUN)
    if windows.get("command") != command or windows.get("edgetrain_version") != __version__:
        raise UsageError(f"the result was written by {windows.get('command')} of edgetrain "
                         f"{windows.get('edgetrain_version')}, this is edgetrain {__version__}", where,
                         f"attribute the export with the edgetrain that wrote the result, or run {command} again")
    if not windows.get("held_for_a_meter"):
        raise UsageError("the result's windows were not held for a meter (the run had no --meter-export): its "
                         "timed windows may be too short for a meter's samples and it has no idle stretch", where,
                         _FIX_RUN)
    if not sealed_as_written(result):
        raise UsageError("the result is not as edgetrain wrote it: it was changed after the run (its meter windows' "
                         "seal does not match)", where, "attribute the --json file as the run wrote it, or run "
                         f"{command} again")
    spans = windows.get("configs") if command == "profile" else [windows]
    for w in spans if isinstance(spans, list) else [None]:
        if not isinstance(w, dict) or w.get("timed") is None:
            raise UsageError("the result has no timed window" + (f" for {w.get('threads')} thread(s)" if isinstance(
                w, dict) else ""), where, _FIX_RUN)
        if clock_window(w["timed"]) is None or (w.get("idle") is not None and clock_window(w["idle"]) is None):
            raise UsageError(f"the result's windows are not pairs of clock times, start before end (timed "
                             f"{w.get('timed')!r}, idle {w.get('idle')!r}: edited?)", where, _FIX_RUN)


# What a fine-tune's energy record carries besides its figure (EnergyMeter.stop, ops.finetune).
_RUN_EXTRAS = ("measured_here", "wall", "meter_windows", "one_time", "epochs", "joules_per_epoch", "samples_trained",
               "joules_per_sample", "carbon", "modelled")


def _attribute_run(result: dict, log, where: str, parsed=None, grid: dict | None = None) -> dict:
    """A fine-tune's result with the meter's export read over its run (as EnergyMeter.stop with --power-log)."""
    en = result["energy"]
    w = en.get("meter_windows")
    _check_windows(result, w, "finetune", where)
    idle = tuple(w["idle"]) if w.get("idle") else None
    measured = energy.measured_run(energy.log_record(log, tuple(w["timed"]), idle, parsed, _board_w(w)))
    measured["attributed"] = {"by": "edgetrain energy attribute", "log": str(log)}
    if en.get("provenance") == "measured":  # a board sensor measured too: the meter's figure leads, it stays beside
        modelled = en.get("modelled")
        sensor = {k: en.get(k) for k in ("source", "joules", "samples", "instrument") if en.get(k) is not None}
    else:
        modelled, sensor = {k: v for k, v in en.items() if k not in _RUN_EXTRAS}, None
    new = energy.run_record(measured, modelled, bool(w.get("on_device")))
    new["wall"], new["meter_windows"] = list(w["timed"]), dict(w)
    if sensor:
        new["board_sensor"] = sensor
    energy.per_unit_of_run(new, en.get("epochs") or 0, en.get("samples_trained") or 0)
    grid = grid or (en.get("carbon") or {}).get("intensity")
    if grid:
        new["carbon"] = energy.carbon_of_run(new, grid)
    if en.get("one_time"):
        new["one_time"] = en["one_time"]
    out = {**result, "energy": new.to_dict()}
    out["joules_per_epoch"], out["joules_per_sample"] = new.get("joules_per_epoch"), new.get("joules_per_sample")
    return seal_windows(out)


def _measured_headline(en: dict, measured: dict) -> dict:
    """The energy report with the measured figure as the headline, as ``energy_report(measured=...)`` makes it."""
    modelled = en.get("modelled_per_inference") or en["per_inference"]
    if en.get("reliability") is not None:
        modelled.setdefault("reliability", en["reliability"])
    en["per_inference"], en["modelled_per_inference"] = measured, modelled
    en["inferences_per_wh_busy"] = 3600.0 / (measured["total_mj"] / 1000.0) if measured["total_mj"] else None
    if en.get("budget"):
        en["budget"] = energy.budget_verdict(measured["total_mj"], en["budget"]["budget_mj"], "measured")
    if en.get("carbon"):
        carbon = energy.carbon_of_report(en, en["carbon"].get("intensity"))
        if carbon is not None:
            en["carbon"] = carbon
    if en.get("daily"):
        en["daily"] = {**en["daily"], "note": "the daily figure stays modelled: attribute measured the inferences, "
                                              "not a day"}
    return en
