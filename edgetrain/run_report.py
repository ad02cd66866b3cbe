"""The run folder's summary: terminal rows and a self-contained report.html / report.md.

The per-model detail (latency histogram, thread sweep, memory, energy over a day) is the profile
step's own report; this page puts the whole run on one screen and links to it. A recipe's report step
may name fleet run folders (``report: {fleet: RUNDIR}``): each one's round-by-round report becomes a
section of this page. ``page()`` is the one HTML page shell (title, style) of these reports; the
fleet's own RUNDIR/fleet-report.html is that page holding the fleet section.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from .figures import compared
from .fileio import atomic_write_text
from .fleet.report import html_section as fleet_html_section
from .fleet.report import markdown_section as fleet_markdown_section

_LABELS = [
    ("finetune_accuracy_pct", "fine-tuned top-1 (held out)", "pct"),
    ("accuracy_fp32_pct", "top-1 fp32 (held out)", "pct"),
    ("accuracy_int8_pct", "top-1 int8 (held out)", "pct"),
    ("accuracy_drop_pts", "int8 accuracy drop", "pts"),
    ("size_fp32_bytes", "size fp32 ONNX", "bytes"),
    ("size_int8_bytes", "size int8 ONNX", "bytes"),
    ("export_passed", "ONNX equals Gluon", "bool"),
    ("latency_p50_ms", "latency p50 per inference", "ms"),
    ("peak_rss_mb", "peak memory (RSS)", "mb"),
    ("energy_per_inference_mj", "energy per inference", "mj"),
    ("finetune_energy_j", "fine-tune energy", "j"),
    ("carbon_per_inference_g", "CO2e per inference", "g"),
    ("carbon_per_day_g", "CO2e per day", "g"),
    ("finetune_carbon_g", "CO2e of the fine-tune", "g"),
    ("battery_life_days", "battery life", "days"),
]
_PROVENANCE = {"latency_p50_ms": "latency_provenance", "energy_per_inference_mj": "energy_provenance",
               "finetune_energy_j": "finetune_energy_provenance"}
_UNCERTAINTY = {"energy_per_inference_mj": ("energy_per_inference_uncertainty_mj", "mJ"),
                "finetune_energy_j": ("finetune_energy_uncertainty_j", "J")}


def _with_interval(summary: dict, key: str, kind: str) -> str:
    """The figure and its interval, +a/−b where the ends differ (``energy.interval_text``); a summary
    written before the ends were kept gives its ± (the larger end)."""
    from .energy import energy_digits, interval_text

    sigma, unit = _UNCERTAINTY[key]
    stem = sigma[: -len("uncertainty_" + unit.lower())]
    plus, minus = summary.get(stem + "plus_" + unit.lower()), summary.get(stem + "minus_" + unit.lower())
    if plus is None and minus is None:
        plus = minus = summary.get(sigma)
    return interval_text(summary[key], plus, minus, unit, lambda v: _fmt(v, kind).rsplit(" ", 1)[0], energy_digits)


def _fmt(value, kind: str) -> str:
    if kind == "pct":
        return f"{value:.2f} %"
    if kind == "pts":
        return f"{value:+.2f} pts"
    if kind == "bytes":
        return f"{value / 1024:.1f} KiB" if value < 1 << 20 else f"{value / (1 << 20):.2f} MiB"
    if kind == "bool":
        return "yes" if value else "NO"
    if kind == "ms":
        return f"{value:.3f} ms"
    if kind == "mb":
        return f"{value:.0f} MB"
    if kind == "mj":
        return f"{value:.3f} mJ"
    if kind == "j":
        return f"{value:.3g} J"
    if kind == "g":
        return (f"{value:.3g} g" if value >= 1 else f"{value * 1e3:.3g} mg" if value >= 1e-3
                else f"{value * 1e6:.3g} µg")
    if kind == "days":
        return f"{value:.2f} days ({value * 24:.1f} h)"
    return str(value)


def summary_rows(summary: dict) -> list[tuple[str, str]]:
    """(label, formatted value) for each figure present, with its provenance where it has one."""
    rows = []
    for key, label, kind in _LABELS:
        if summary.get(key) is None:
            continue
        text = _fmt(summary[key], kind)
        if key in _UNCERTAINTY:
            text = _with_interval(summary, key, kind)
        if key in _PROVENANCE and summary.get(_PROVENANCE[key]):
            text += f" [{summary[_PROVENANCE[key]]}]"
        if kind == "g" and summary.get("carbon_g_per_kwh"):
            text += f" at {summary['carbon_g_per_kwh']:g} g/kWh"
        if key == "size_int8_bytes" and summary.get("size_fp32_bytes"):
            words = compared(summary[key], summary["size_fp32_bytes"], "smaller", "larger", same="")
            text += f" ({words} than fp32)" if words else " (the same size as fp32)"
        if key == "battery_life_days" and summary.get("battery_wh"):
            text += f" on {summary['battery_wh']:g} Wh at {summary.get('rate_per_h', 0):g} inferences/h"
        rows.append((label, text))
    return rows


def duty_cycle(steps) -> dict | None:
    """A day of fine-tuning then inference on the device's battery, from the finetune and profile steps.

    The fine-tune (this run's, measured or modelled) takes the place of the same stretch of the
    inference day (the profile step's daily figure at its rate); the battery lasts ``battery_wh`` over
    that day's energy. Also given with one fine-tune a week, the rest of the week inference only.
    """
    by = {s.name: (s.result or {}) for s in steps}
    ft = (by.get("finetune") or {}).get("energy") or {}
    daily = ((by.get("profile") or {}).get("energy") or {}).get("daily") or {}
    if not ft.get("joules") or not daily.get("energy_wh_per_day"):
        return None
    ft_wh = ft["joules"] / 3600.0
    ft_s = min(float(ft.get("seconds") or 0.0), 86400.0)
    day_wh = daily["energy_wh_per_day"] * (86400.0 - ft_s) / 86400.0 + ft_wh
    week_wh = 6 * daily["energy_wh_per_day"] + day_wh
    both_measured = ft.get("provenance") == "measured" and daily.get("provenance") == "measured"
    out = {"finetune_wh": ft_wh, "finetune_s": ft_s, "finetune_provenance": ft.get("provenance"),
           "inference_wh_per_day": daily["energy_wh_per_day"], "inference_provenance": daily.get("provenance"),
           "rate_per_h": daily.get("rate_per_h"), "daily_with_finetune_wh": day_wh,
           "weekly_finetune_wh_per_day": week_wh / 7.0,
           "provenance": "measured" if both_measured else "modelled",
           "source": (f"one fine-tune ({ft_wh:.3g} Wh over {ft_s:.0f} s, {ft.get('provenance')}) + the rest of the day "
                      f"at {daily.get('rate_per_h', 0):g} inferences/h ({daily['energy_wh_per_day']:.3g} Wh/day, "
                      f"{daily.get('provenance')})")}
    if daily.get("battery_wh"):
        out["battery_wh"] = daily["battery_wh"]
        out["battery_days_daily_finetune"] = daily["battery_wh"] / day_wh
        out["battery_days_weekly_finetune"] = daily["battery_wh"] / (week_wh / 7.0)
        out["battery_days_inference_only"] = daily.get("battery_days")
    return out


def energy_notes(steps) -> list[str]:
    """How much the energy per inference may move, and whether the host was too busy to trust it."""
    by = {s.name: (s.result or {}) for s in steps}
    e = (by.get("profile") or {}).get("energy") or {}
    pi = e.get("per_inference") or {}
    out = []
    sp = pi.get("spread") or (e.get("modelled_per_inference") or {}).get("spread")
    if sp:
        out.append(f"energy per inference at the p10 to p90 latency: {sp['p10']['total_mj']:.3g} to "
                   f"{sp['p90']['total_mj']:.3g} mJ (modelled from the p50: {pi.get('total_mj', 0):.3g} mJ)")
    if pi.get("provenance") == "measured":
        out.append(f"energy per inference measured by {pi.get('meter')}: {pi.get('samples')} samples over "
                   f"{pi.get('inferences')} inferences")
    reasons = (e.get("reliability") or {}).get("reasons")
    if reasons:
        out.append("the latency and energy estimates are unreliable: " + "; ".join(reasons))
    return out


def duty_cycle_rows(dc: dict | None) -> list[tuple[str, str]]:
    if not dc:
        return []
    tag = f" [{dc['provenance']}]"
    rows = [("fine-tune energy", f"{dc['finetune_wh']:.3g} Wh ({dc['finetune_s']:.0f} s) [{dc['finetune_provenance']}]"),
            ("day: fine-tune then infer", f"{dc['daily_with_finetune_wh']:.3g} Wh (inference only "
                                          f"{dc['inference_wh_per_day']:.3g} Wh){tag}")]
    if dc.get("battery_wh"):
        rows.append(("battery, fine-tune daily", f"{_fmt(dc['battery_days_daily_finetune'], 'days')} on "
                                                 f"{dc['battery_wh']:g} Wh{tag}"))
        rows.append(("battery, fine-tune weekly", f"{_fmt(dc['battery_days_weekly_finetune'], 'days')}{tag}"))
    return rows


STYLE = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;margin:1rem 0}th,td{padding:.3rem .8rem;border-bottom:1px solid #ddd;text-align:left}
tr.done td:nth-child(2){color:#060}tr.failed td:nth-child(2),tr.budget td:nth-child(2),.bad{color:#a00}
table.fleet td{vertical-align:top;font-size:.9rem}
pre{background:#f6f6f6;padding:.5rem;overflow:auto;font-size:.8rem}
table{display:block;max-width:100%;overflow-x:auto}td.why{min-width:12rem;max-width:28rem;overflow-wrap:break-word}
code,h1,h2{overflow-wrap:anywhere}svg{max-width:100%;height:auto;display:block}
@media (max-width:600px){body{margin:1rem auto;padding:0 .6rem}th,td{padding:.25rem .4rem}svg text{font-size:15px}}"""


def page(title: str, body: str) -> str:
    """A self-contained edgetrain report page."""
    return (f'<!doctype html><html><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1"><title>{html.escape(title)}</title>\n'
            f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>\n")


def why(step) -> str | None:
    """Why a step did not pass, in a line: its error, else the checks it failed, else its log's last line."""
    if not step.exit_code:
        return None
    if step.error:
        return step.error
    checks = (step.result or {}).get("failed_checks") or []
    if checks:
        return "; ".join(c if isinstance(c, str) else str(c.get("message") or c) for c in checks)
    try:
        lines = [ln.strip() for ln in Path(step.log).read_text(encoding="utf-8", errors="replace").splitlines()
                 if ln.strip()]
    except OSError:
        lines = []
    return f"its log ends: {lines[-1]}" if lines else f"exit code {step.exit_code}, no message (log {step.log})"


def write_run_report(result, path: Path, fleets: list[dict] = ()) -> None:
    """``fleets``: fleet reports (RUNDIR/fleet.json, read by edgetrain.fleet.report.read_report) shown as sections."""
    text = _markdown(result, fleets) if path.suffix == ".md" else _html(result, path.parent, fleets)
    atomic_write_text(path, text, "report")


def _markdown(result, fleets=()) -> str:
    lines = [f"# edgetrain run: {result.recipe}", "", f"Device: **{result.device}** · run folder `{result.rundir}`", "",
             "| figure | value |", "|---|---|"]
    lines += [f"| {label} | {value} |" for label, value in summary_rows(result.summary)]
    lines += [f"\n- {n}" for n in energy_notes(result.steps)]
    lines += [f"\n- warning: {w}" for w in getattr(result, "warnings", [])]  # each once, whatever step said it
    dc = duty_cycle(result.steps)
    if dc:
        lines += ["", "## Fine-tune then infer: a day on the battery", "", "| figure | value |", "|---|---|"]
        lines += [f"| {label} | {value} |" for label, value in duty_cycle_rows(dc)]
        lines += ["", dc["source"]]
    lines += ["\n" + fleet_markdown_section(doc) for doc in fleets]
    failed = next((s for s in result.steps if s.name == result.failed_step), None)
    if failed is not None:
        lines += ["", f"**Step {failed.name} did not pass** (exit {failed.exit_code}): {why(failed)}"]
    lines += ["", "| step | status | exit | seconds | why | log |", "|---|---|---|---|---|---|"]
    lines += [f"| {s.name} | {s.status} | {s.exit_code} | {s.seconds:.1f} | {(why(s) or '').replace('|', '/')} | {s.log} |"
              for s in result.steps]
    return "\n".join(lines) + "\n"


def _html(result, folder: Path, fleets=()) -> str:
    esc = html.escape
    rows = "".join(f"<tr><th>{esc(label)}</th><td>{esc(value)}</td></tr>" for label, value in summary_rows(result.summary))
    steps = "".join(
        f"<tr class='{esc(s.status.split()[0])}'><td>{esc(s.name)}</td><td>{esc(s.status)}</td><td>{s.exit_code}</td>"
        f"<td>{s.seconds:.1f}</td><td class='why'>{esc(why(s) or '')}</td><td>{esc(_rel(s.log, folder))}</td></tr>"
        for s in result.steps)
    profile = folder / "profile.html"
    link = "<p>Latency, memory and energy detail: <a href='profile.html'>profile.html</a></p>" if profile.exists() else ""
    notes = "".join(f"<p class='{'bad' if 'unreliable' in n else 'src'}'>{esc(n)}</p>"
                    for n in energy_notes(result.steps))
    dc = duty_cycle(result.steps)
    duty = notes + ("<h2>Fine-tune then infer: a day on the battery</h2><table>"
            + "".join(f"<tr><th>{esc(label)}</th><td>{esc(value)}</td></tr>" for label, value in duty_cycle_rows(dc))
            + f"</table><p>{esc(dc['source'])}</p>") if dc else ""
    failed_run = next((s for s in result.steps if s.name == result.failed_step), None)
    failed = (f"<p class='bad'>Step <b>{esc(result.failed_step)}</b> did not pass (exit code {result.exit_code})"
              + (f": {esc(why(failed_run))}" if failed_run is not None else "") + "</p>" if result.failed_step else "")
    failed += "".join(f"<p class='bad'>warning: {esc(w)}</p>" for w in getattr(result, "warnings", []))
    details = "".join(f"<details><summary>{esc(s.name)} result</summary><pre>{esc(json.dumps(s.result, indent=2))}</pre>"
                      f"</details>" for s in result.steps if s.result)
    fleet = "".join(fleet_html_section(doc) for doc in fleets)
    return page(f"edgetrain run: {result.recipe}", f"""<h1>edgetrain run: {esc(result.recipe)}</h1>
<p>Device profile <b>{esc(result.device)}</b> · recipe {esc(result.source)} · run folder <code>{esc(result.rundir)}</code></p>
{failed}<h2>Summary</h2><table>{rows}</table>{duty}{link}{fleet}
<h2>Steps</h2><table><tr><th>step</th><th>status</th><th>exit</th><th>seconds</th><th>why</th><th>log</th></tr>{steps}</table>
<h2>Step results</h2>{details}""")


def _rel(path: str, folder: Path) -> str:
    try:
        return str(Path(path).relative_to(folder))
    except ValueError:
        return path
