"""The run folder's summary: terminal rows and a self-contained report.html / report.md.

The per-model detail (latency histogram, thread sweep, memory, energy over a day) is the profile
step's own report; this page puts the whole run on one screen and links to it.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from .fileio import atomic_write_text

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
    ("battery_life_days", "battery life", "days"),
]
_PROVENANCE = {"latency_p50_ms": "latency_provenance", "energy_per_inference_mj": "energy_provenance"}


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
        if key in _PROVENANCE and summary.get(_PROVENANCE[key]):
            text += f" [{summary[_PROVENANCE[key]]}]"
        if key == "battery_life_days" and summary.get("battery_wh"):
            text += f" on {summary['battery_wh']:g} Wh at {summary.get('rate_per_h', 0):g} inferences/h"
        rows.append((label, text))
    return rows


def write_run_report(result, path: Path) -> None:
    text = _markdown(result) if path.suffix == ".md" else _html(result, path.parent)
    atomic_write_text(path, text, "report")


def _markdown(result) -> str:
    lines = [f"# edgetrain run: {result.recipe}", "", f"Device: **{result.device}** · run folder `{result.rundir}`", "",
             "| figure | value |", "|---|---|"]
    lines += [f"| {label} | {value} |" for label, value in summary_rows(result.summary)]
    lines += ["", "| step | status | exit | seconds | log |", "|---|---|---|---|---|"]
    lines += [f"| {s.name} | {s.status} | {s.exit_code} | {s.seconds:.1f} | {s.log} |" for s in result.steps]
    return "\n".join(lines) + "\n"


def _html(result, folder: Path) -> str:
    esc = html.escape
    rows = "".join(f"<tr><th>{esc(label)}</th><td>{esc(value)}</td></tr>" for label, value in summary_rows(result.summary))
    steps = "".join(
        f"<tr class='{esc(s.status.split()[0])}'><td>{esc(s.name)}</td><td>{esc(s.status)}</td><td>{s.exit_code}</td>"
        f"<td>{s.seconds:.1f}</td><td>{esc(_rel(s.log, folder))}</td></tr>" for s in result.steps)
    profile = folder / "profile.html"
    link = "<p>Latency, memory and energy detail: <a href='profile.html'>profile.html</a></p>" if profile.exists() else ""
    failed = (f"<p class='bad'>Step <b>{esc(result.failed_step)}</b> did not pass; exit code {result.exit_code}.</p>"
              if result.failed_step else "")
    details = "".join(f"<details><summary>{esc(s.name)} result</summary><pre>{esc(json.dumps(s.result, indent=2))}</pre>"
                      f"</details>" for s in result.steps if s.result)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>edgetrain run: {esc(result.recipe)}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}}
table{{border-collapse:collapse;margin:1rem 0}}th,td{{padding:.3rem .8rem;border-bottom:1px solid #ddd;text-align:left}}
tr.done td:nth-child(2){{color:#060}}tr.failed td:nth-child(2),tr.budget td:nth-child(2),.bad{{color:#a00}}
pre{{background:#f6f6f6;padding:.5rem;overflow:auto;font-size:.8rem}}</style></head><body>
<h1>edgetrain run: {esc(result.recipe)}</h1>
<p>Device profile <b>{esc(result.device)}</b> · recipe {esc(result.source)} · run folder <code>{esc(result.rundir)}</code></p>
{failed}<h2>Summary</h2><table>{rows}</table>{link}
<h2>Steps</h2><table><tr><th>step</th><th>status</th><th>exit</th><th>seconds</th><th>log</th></tr>{steps}</table>
<h2>Step results</h2>{details}
</body></html>
"""


def _rel(path: str, folder: Path) -> str:
    try:
        return str(Path(path).relative_to(folder))
    except ValueError:
        return path
