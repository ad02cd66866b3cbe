"""A meter's export, made after the run, attributed to a finished profile's windows.

The Nordic PPK2 and Otii apps write their CSV only once the recording is stopped, so ``--power-log``
(read when the command ends) cannot be given to the run. ``profile --meter-export`` holds each
configuration's idle stretch and timed window as ``--power-log`` would and records them in the result
(``meter_windows``); ``attribute`` then reads the export and gives the result the measured figures the run
would have had with ``--power-log``: each configuration's ``power`` record, the board figures in
``host_energy``, and on the device itself the measured energy per inference as the headline (the modelled
one beside it), with its budget, carbon and provenance.
"""
from __future__ import annotations

from dataclasses import fields

from .. import __version__, energy
from ..errors import UsageError

_FIX_RUN = "run `edgetrain profile --meter-export ... --json RESULT` with this edgetrain while the meter records"


def attribute(result: dict, log, where: str) -> dict:
    """``result`` (a profile's JSON) with the meter log ``log`` (a ``PowerLog``) read over its windows."""
    from .profiling import ProfileResult, collect_figures, log_power

    if not isinstance(result, dict) or not isinstance(result.get("configs"), list):
        raise UsageError("not an edgetrain profile result (no 'configs')", where, _FIX_RUN)
    windows = result.get("meter_windows")
    if not isinstance(windows, dict) or not windows.get("configs"):
        raise UsageError("the result records no measured windows (written by an edgetrain before they were kept)",
                         where, _FIX_RUN)
    if windows.get("command") != "profile" or windows.get("edgetrain_version") != __version__:
        raise UsageError(f"the result was written by {windows.get('command')} of edgetrain "
                         f"{windows.get('edgetrain_version')}, this is edgetrain {__version__}", where,
                         "attribute the export with the edgetrain that wrote the result, or profile again")
    if not windows.get("held_for_a_meter"):
        raise UsageError("the result's windows were not held for a meter (the run had no --meter-export): its timed "
                         "windows are too short for a meter's samples and it has no idle stretch", where, _FIX_RUN)
    if len(windows["configs"]) != len(result["configs"]):
        raise UsageError("the result's windows do not match its configurations (edited?)", where, _FIX_RUN)
    out = dict(result)
    configs = []
    for c, w in zip(result["configs"], windows["configs"]):
        if not w.get("timed"):
            raise UsageError(f"the result has no timed window for {w.get('threads')} thread(s)", where, _FIX_RUN)
        c = {**c, "power": {**(c.get("power") or {}), "window_wall": w["timed"]}, "wall_idle": w.get("idle")}
        c["power"] = log_power(log, c)
        c["power"]["attributed"] = {"by": "edgetrain energy attribute", "log": str(log)}
        configs.append(c)
    out["configs"] = configs
    board = [{"threads": c["threads"], **energy.measured_per_inference(c["power"])} for c in configs
             if energy.measured_per_inference(c["power"]) is not None]
    he = dict(out.get("host_energy") or {})
    he.pop("board_note", None)
    he["board"] = board
    out["host_energy"] = he
    en = out.get("energy")
    if windows.get("on_device") and en and en.get("per_inference"):
        threads = (out.get("verdict", {}).get("latency") or {}).get("threads")
        mine = next((b for b in board if b["threads"] == threads), None)
        if mine is not None:
            out["energy"] = _measured_headline(dict(en), {k: v for k, v in mine.items() if k != "threads"})
    res = ProfileResult(**{f.name: out[f.name] for f in fields(ProfileResult) if f.name in out})
    res.figures = collect_figures(res)
    return res.to_dict()


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
