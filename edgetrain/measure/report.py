"""Self-contained profile reports: HTML with inline SVG charts, or Markdown; and the terminal summary.

Everything renders from the profile result's dict (the same numbers ``--json`` writes), so the report
can never disagree with the JSON. No external assets: one file a person can mail or attach to a PR.
"""
from __future__ import annotations

import html
import math
from pathlib import Path

from ..errors import UsageError
from ..svgchart import CHART_FONT, CHART_FONT_MAX, H, PAD_B, PAD_R, PAD_T, W  # noqa: F401 - the charts' frame
from ..svgchart import axes as _axes
from ..svgchart import fmt as _fmt
from ..svgchart import nice_max as _nice_max
from ..svgchart import pad_left as _pad_left
from ..svgchart import svg as _svg
from ..svgchart import text as _text
from ..svgchart import text_width as _text_width
from ..fileio import atomic_write_text, check_output_path

REPORT_SUFFIXES = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md"}
PROVENANCE_COLOURS = {"measured": "#1a7f37", "estimated": "#9a6700", "modelled": "#0969da", "emulated": "#cf222e"}


def check_report_path(path: Path) -> Path:
    """Fail before any work when the report cannot be written or its format is unknown."""
    if path.suffix.lower() not in REPORT_SUFFIXES:
        raise UsageError(f"unknown report format '{path.suffix or path.name}'", "--report",
                         "name the file .html or .md")
    return check_output_path(path, "--report")


def write_report(path: Path, result: dict) -> Path:
    kind = REPORT_SUFFIXES[check_report_path(Path(path)).suffix.lower()]
    atomic_write_text(Path(path), render_html(result) if kind == "html" else render_markdown(result), "--report")
    return Path(path)


# --- shared pieces ------------------------------------------------------------------------------------

def _best(result: dict) -> dict:
    t = result["best"]["threads"]
    return next(c for c in result["configs"] if c["threads"] == t)


def _histogram(values: list[float], bins: int = 20) -> list[tuple[float, float, int]]:
    lo, hi = min(values), max(values)
    if hi <= lo:
        return [(lo, hi, len(values))]
    # Long tails squash the body of the histogram: bin up to p99 and count the rest in the last bin.
    xs = sorted(values)
    cap = xs[min(len(xs) - 1, int(math.ceil(0.99 * len(xs))) - 1)]
    hi = max(cap, lo + 1e-9)
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - lo) / width))] += 1
    return [(lo + i * width, lo + (i + 1) * width, c) for i, c in enumerate(counts)]


def against_plan(p: dict) -> str:
    """The measured peak RSS relative to the prediction, in words that cannot be read backwards ("(-4.5%)"
    beside "predicted 63.7 MB, measured 66.7 MB" read as measured below). ``p`` is a result's ``prediction``."""
    planned, measured = p["peak_rss_mb"], p["measured_peak_rss_mb"]
    if not planned:
        return "no plan to compare"
    rel = 100.0 * (measured - planned) / planned
    if round(abs(rel), 1) == 0:
        return "as planned"
    return f"{abs(rel):.1f}% {'above' if rel > 0 else 'below'} the plan"


def text_summary(d: dict) -> list[str]:
    """The terminal rendering: what a user reads after the command ends."""
    lines = [f"model      {d['model']} ({d['runtime']}, input {'x'.join(map(str, d['input_shape']))}, "
             f"batch {d['batch']})"]
    for c in d["configs"]:
        lat, mem = c["latency"], c["memory"]
        lines.append(f"threads {c['threads']:<3} p50 {_fmt(lat['p50_ms'])} ms  p90 {_fmt(lat['p90_ms'])}  "
                     f"p99 {_fmt(lat['p99_ms'])} (p99/p50 {_fmt(lat['spread_p99_p50'])})  load {_fmt(c['load_s'])} s  "
                     f"first {_fmt(c['first_inference_ms'])} ms  peak RSS {_fmt(mem['peak_rss_mb'])} MB  "
                     f"[{c['provenance']}]")
    b = d["best"]
    lines.append(f"best       {b['threads']} thread(s): p50 {_fmt(b['p50_ms'])} ms, p99/p50 {_fmt(b['spread_p99_p50'])}")
    p = d["prediction"]
    lines.append(f"memory     predicted {_fmt(p['peak_rss_mb'])} MB before running, measured "
                 f"{_fmt(p['measured_peak_rss_mb'])} MB ({against_plan(p)})")
    ops = _best(d).get("ops") or {}
    if ops.get("available"):
        top = ", ".join(f"{r['op']} {r['share'] * 100:.0f}%" for r in ops["table"][:4])
        busy = f" [busy host: load {ops['loadavg']:.1f} over {d['host']['cores_usable']} cores, shares doubtful]" \
            if ops.get("busy_host") else ""
        lines.append(f"ops        {top}{busy}")
    elif ops:
        lines.append(f"ops        {ops.get('note')}")
    v = d.get("verdict") or {}
    if v.get("memory"):
        m = v["memory"]
        lines.append(f"device     {d['device']['name']}: peak {_fmt(m['peak_rss_mb'])} MB "
                     f"{'fits' if m['fits'] else 'does NOT fit'} in {m['available_mb']} MB "
                     f"(RAM {m['ram_mb']} - OS reserve {m['os_reserve_mb']} MB), headroom {_fmt(m['headroom_mb'])} MB "
                     f"[{m['provenance']}]")
    if v.get("latency"):
        lat = v["latency"]
        if lat.get("mean_ms") is not None:
            lines.append(f"latency    on {d['device']['name']}: mean {_fmt(lat['mean_ms'])} ms, p50 "
                         f"{_fmt(lat['p50_ms'])} ms [{lat['provenance']}: {lat['source']}]")
        else:
            lines.append(f"latency    on {d['device']['name']}: {lat.get('note')}")
    # The profile's warnings (the busy host) are a field of its result, printed once below, with or without
    # a device; energy_lines prints the energy's own only for results without them (export --device).
    lines.extend(energy_lines(d.get("energy") or {}, warn="warnings" not in d))
    lines.extend(host_energy_lines(d.get("host_energy") or {}))
    for note in d.get("notes", []):
        lines.append(f"note       {note}")
    for warning in d.get("warnings", []):
        lines.append(f"warning    {warning}")
    return lines


def host_energy_lines(he: dict) -> list[str]:
    """This machine's own measurements, each labelled as what it is: of the host ("host, measured") unless this
    machine is the device; never in the device's headline's place."""
    from ..energy import EnergyRecord

    lines = []
    for h in map(EnergyRecord.of, he.get("configs", [])):
        lines.append(f"host       RAPL {h.text(with_detail=False)} per inference at {h['threads']} thread(s) "
                     f"[{h.label}, CPU package]")
    for h in map(EnergyRecord.of, he.get("board", [])):
        lines.append(f"{'host' if h.machine == 'host' else 'board':<10} {h.fields.get('meter')} "
                     f"{h.text(with_detail=False)} per inference at {h['threads']} thread(s), {h.samples} samples "
                     f"[{h.label}{', this machine is not the device' if h.machine == 'host' else ''}]")
    return lines


def _per_inference_lines(pi) -> list[str]:
    from ..energy import EnergyRecord

    rec = EnergyRecord.of(pi, "mJ")
    f = rec.fields
    above = f", {_fmt(f['above_idle_mj'])} mJ above idle" if f.get("above_idle_mj") is not None else ""
    head = rec.text()
    if rec.provenance == "measured":
        lines = [f"energy     {head} per inference total{above} [{f.get('inferences')} inferences, idle "
                 f"{_fmt(f.get('idle_w'))} W]"]
        cost = f.get("sampler") or {}
        if cost.get("core_percent") is not None:
            lines.append(f"sampler    {cost['core_percent']:.2f}% of one core at {cost['rate_hz']:g} Hz "
                         f"(goal under {cost['goal_core_percent']:g}%)")
        return lines
    text = (f"energy     {head} per inference total{above} [modelled: p50 latency x "
            f"{_fmt(f['power_w'])} W")
    if f.get("threads") is not None:
        text += f" at {min(f['threads'], f['cores'])} of {f['cores']} cores busy"
    text += "]"
    if f.get("spread"):
        sp = f["spread"]
        text += f"; p10-p90 latency: {_fmt(sp['p10']['total_mj'])}-{_fmt(sp['p90']['total_mj'])} mJ"
    return [text]


def energy_lines(e: dict, warn: bool = True) -> list[str]:
    """The energy-budget report's terminal lines (profile's, and export --device's)."""
    from ..energy import EnergyRecord

    lines: list[str] = []
    if e.get("per_inference"):
        lines.extend(_per_inference_lines(e["per_inference"]))
        if e.get("modelled_per_inference"):
            m = EnergyRecord.of(e["modelled_per_inference"], "mJ")
            lines.append(f"energy     modelled for comparison: {m.text(with_detail=False)} per inference "
                         f"(p50 latency x {_fmt(m['power_w'])} W)")
        rel = e.get("reliability") or {}
        if rel.get("reasons") and warn:
            lines.append("warning    the latency and energy estimates are unreliable: " + "; ".join(rel["reasons"]))
    elif e.get("note"):
        lines.append(f"energy     {e['note']}")
    if e.get("measured_per_inference"):
        m = EnergyRecord.of(e["measured_per_inference"], "mJ")
        lines.append(f"energy     {m.text(with_detail=False)} per inference measured by RAPL on the device itself "
                     "(CPU package only) [measured]")
    if e.get("daily"):
        dd = e["daily"]
        text = (f"day        {dd['inferences_per_day']:g} inferences: {_fmt(dd['energy_wh_per_day'])} Wh "
                f"({_fmt(dd['busy_wh_per_day'])} busy + {_fmt(dd['idle_wh_per_day'])} idle), average "
                f"{_fmt(dd['average_power_w'])} W")
        if dd.get("inferences_per_wh"):
            text += f", {_fmt(dd['inferences_per_wh'])} inferences/Wh"
        lines.append(text)
        if "battery_hours" in dd:
            lines.append(f"battery    {dd['battery_wh']:g} Wh lasts {_fmt(dd['battery_hours'])} h "
                         f"({_fmt(dd['battery_days'])} days)")
        if dd.get("note"):
            lines.append(f"note       {dd['note']}")
    if e.get("continuous"):
        c = e["continuous"]
        lines.append(f"battery    {c['battery_wh']:g} Wh lasts {_fmt(c['battery_hours'])} h of continuous inference")
    if e.get("carbon"):
        from ..energy import carbon_text

        c = e["carbon"]
        text = f"carbon     {carbon_text(c, per_inference=True)} per inference"
        if c.get("per_day_g") is not None:
            text += f"; {c['per_day_g']:.3g} g CO2e per day at the rate above"
        lines.append(text)
    if e.get("budget"):
        bg = e["budget"]
        lines.append(f"budget     {_fmt(bg['energy_mj'])} mJ vs {bg['budget_mj']:g} mJ per inference: "
                     f"{'PASS' if bg['passed'] else 'OVER BUDGET'}")
    return lines


# --- SVG charts ---------------------------------------------------------------------------------------

def latency_histogram_svg(lat: list[float], p50: float, p99: float) -> str:
    bins = _histogram(lat)
    ymax = _nice_max(max(c for _, _, c in bins))
    PAD_L = _pad_left(ymax)  # noqa: N806
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_B - PAD_T
    lo, hi = bins[0][0], bins[-1][1]
    span = (hi - lo) or 1.0
    x = lambda v: PAD_L + plot_w * (min(max(v, lo), hi) - lo) / span  # noqa: E731
    out = [_axes(ymax, "runs")]
    for a, b, c in bins:
        h = plot_h * c / ymax
        out.append(f'<rect x="{x(a) + 0.5:.1f}" y="{H - PAD_B - h:.1f}" width="{max(x(b) - x(a) - 1, 1):.1f}" '
                   f'height="{h:.1f}" fill="#54aeff"><title>{_fmt(a)}-{_fmt(b)} ms: {c} runs</title></rect>')
    for row, (v, name, colour) in enumerate(((p50, "p50", "#1a7f37"), (p99, "p99", "#cf222e"))):
        out.append(f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{PAD_T}" y2="{H - PAD_B}" stroke="{colour}" '
                   f'stroke-dasharray="4 3"/>')
        # p99 sits at the right edge (the last bin holds everything above it): its label goes to the left of the
        # line where it would not fit on the right, one row below p50's so the two never overlap
        label = f"{name} {_fmt(v)} ms"
        right = x(v) + 3 + _text_width(label) <= W - 2
        out.append(_text(x(v) + 3 if right else x(v) - 3, PAD_T + 10 + 16 * row, label, "start" if right else "end",
                         f'fill="{colour}"'))
    for i in range(5):
        v = lo + span * i / 4
        out.append(_text(x(v), H - PAD_B + 14, _fmt(v), "end" if i == 4 else "start" if i == 0 else "middle"))
    out.append(_text(PAD_L + plot_w / 2, H - 4, "latency per inference (ms); the last bin: above p99", "middle"))
    return _svg("".join(out), title="latency histogram")


def thread_sweep_svg(configs: list[dict]) -> str:
    ymax = _nice_max(max(c["latency"]["p99_ms"] for c in configs))
    PAD_L = _pad_left(ymax)  # noqa: N806
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_B - PAD_T
    n = len(configs)
    slot = plot_w / n
    bar = min(60.0, slot * 0.35)
    out = [_axes(ymax, "ms")]
    for i, c in enumerate(configs):
        cx = PAD_L + slot * (i + 0.5)
        for j, (key, colour) in enumerate((("p50_ms", "#54aeff"), ("p99_ms", "#ff8182"))):
            v = c["latency"][key]
            h = plot_h * v / ymax
            bx = cx - bar + j * bar
            out.append(f'<rect x="{bx:.1f}" y="{H - PAD_B - h:.1f}" width="{bar - 2:.1f}" height="{h:.1f}" '
                       f'fill="{colour}"><title>{c["threads"]} thread(s) {key[:3]} {_fmt(v)} ms</title></rect>')
            out.append(_text(bx + bar / 2 - 1, H - PAD_B - h - 3, _fmt(v), "middle"))
        out.append(_text(cx, H - PAD_B + 14, f"{c['threads']} thread(s)", "middle"))
    out.append(f'<rect x="{W - 150}" y="{PAD_T}" width="10" height="10" fill="#54aeff"/>'
               + _text(W - 136, PAD_T + 9, "p50")
               + f'<rect x="{W - 100}" y="{PAD_T}" width="10" height="10" fill="#ff8182"/>'
               + _text(W - 86, PAD_T + 9, "p99"))
    return _svg("".join(out), title="thread sweep")


def memory_svg(configs: list[dict], prediction: dict, verdict_memory: dict | None) -> str:
    rows = len(configs)
    height = PAD_T + 30 * rows + 116  # the legend may take three rows at the phone's font
    top = max([c["memory"]["peak_rss_mb"] for c in configs] + [prediction["peak_rss_mb"]])
    # A 8 GB board would squash a 100 MB model to a sliver: draw the device limit only when it is near.
    off_scale = verdict_memory is not None and verdict_memory["available_mb"] > 2.5 * top
    if verdict_memory is not None and not off_scale:
        top = max(top, verdict_memory["available_mb"])
    xmax = _nice_max(top * 1.05)
    plot_w = W - 110 - 70  # room on the right for the last bar's label
    x = lambda v: 110 + plot_w * v / xmax  # noqa: E731
    parts = (("runtime_mb", "runtime after import", "#8c959f"), ("load_mb", "+ weights / session", "#54aeff"),
             ("inference_mb", "+ inference", "#ffb77c"))
    out = []
    for i in range(5):
        v = xmax * i / 4
        out.append(f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{PAD_T}" y2="{PAD_T + 30 * rows}" stroke="#ddd"/>')
        out.append(_text(x(v), PAD_T + 30 * rows + 14, f"{_fmt(v)} MB", "middle"))
    for r, c in enumerate(configs):
        y = PAD_T + 30 * r + 5
        out.append(_text(104, y + 14, f"{c['threads']} thread(s)", "end"))
        start = 0.0
        for key, name, colour in parts:
            v = max(c["memory"][key], 0.0)
            out.append(f'<rect x="{x(start):.1f}" y="{y}" width="{max(x(start + v) - x(start), 0):.1f}" height="20" '
                       f'fill="{colour}"><title>{name}: {_fmt(v)} MB</title></rect>')
            start += v
        out.append(_text(max(x(start), x(prediction["peak_rss_mb"])) + 6, y + 14,
                         f"{_fmt(c['memory']['peak_rss_mb'])} MB"))
    marks = [(prediction["peak_rss_mb"], "predicted", "#0969da")]
    if verdict_memory and not off_scale:
        marks.append((verdict_memory["available_mb"], "device RAM - OS reserve", "#cf222e"))
    elif off_scale:
        out.append(_text(110, PAD_T + 30 * rows + 106, f"the device leaves {verdict_memory['available_mb']} MB "
                         "(RAM - OS reserve), off this scale", "start", 'fill="#cf222e"'))
    for v, name, colour in marks:
        out.append(f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{PAD_T - 4}" y2="{PAD_T + 30 * rows}" '
                   f'stroke="{colour}" stroke-width="2" stroke-dasharray="5 3"><title>{name} {_fmt(v)} MB</title></line>')
    ly = PAD_T + 30 * rows + 30
    lx = 110
    # the legend: as many entries to a row as fit at the phone's font, then the next row
    entries = [(name, f'<rect x="{{x}}" y="{{y}}" width="10" height="10" fill="{colour}"/>') for _k, name, colour in parts]
    entries += [(name, f'<line x1="{{x}}" x2="{{x12}}" y1="{{y5}}" y2="{{y5}}" stroke="{colour}" stroke-width="2" '
                       'stroke-dasharray="4 2"/>') for _v, name, colour in marks]
    lx, row = 16, 0
    for name, mark in entries:
        width = 18 + _text_width(name) + 14
        if lx + width > W - 4 and lx > 16:
            lx, row = 16, row + 1
        yy = ly + 20 * row
        out.append(mark.format(x=lx, y=yy, x12=lx + 12, y5=yy + 5) + _text(lx + 18, yy + 9, name))
        lx += width
    return _svg("".join(out), height, "memory breakdown")


def energy_day_svg(daily: dict) -> str:
    """Cumulative energy over one day: the idle floor and the inferences on top of it."""
    ymax = _nice_max(daily["energy_wh_per_day"] * 1.05)
    battery = daily.get("battery_wh")
    if battery and battery < ymax * 3:
        ymax = _nice_max(max(ymax, battery * 1.05))
    PAD_L = _pad_left(ymax)  # noqa: N806
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_B - PAD_T
    x = lambda hour: PAD_L + plot_w * hour / 24  # noqa: E731
    y = lambda wh: H - PAD_B - plot_h * min(wh, ymax) / ymax  # noqa: E731
    idle, busy = daily["idle_wh_per_day"], daily["busy_wh_per_day"]
    out = [_axes(ymax, "Wh")]
    out.append(f'<polygon points="{x(0):.1f},{y(0):.1f} {x(24):.1f},{y(idle):.1f} {x(24):.1f},{y(0):.1f}" '
               f'fill="#d0d7de"><title>idle {_fmt(idle)} Wh/day</title></polygon>')
    out.append(f'<polygon points="{x(0):.1f},{y(0):.1f} {x(24):.1f},{y(idle + busy):.1f} {x(24):.1f},{y(idle):.1f}" '
               f'fill="#ffb77c"><title>inference {_fmt(busy)} Wh/day</title></polygon>')
    out.append(f'<line x1="{x(0):.1f}" y1="{y(0):.1f}" x2="{x(24):.1f}" y2="{y(idle + busy):.1f}" stroke="#bc4c00" '
               f'stroke-width="2"/>')
    if battery and battery <= ymax:
        out.append(f'<line x1="{PAD_L:.1f}" x2="{W - PAD_R}" y1="{y(battery):.1f}" y2="{y(battery):.1f}" stroke="#cf222e" '
                   f'stroke-dasharray="5 3"/>' + _text(PAD_L + 4, y(battery) - 4, f"battery {battery:g} Wh",
                                                          extra='fill="#cf222e"'))
    for hour in range(0, 25, 4):
        out.append(_text(x(hour), H - PAD_B + 14, f"{hour:02d}:00", "end" if hour == 24 else "middle"))
    out.append(_text(x(24) - 4, y(idle + busy) - 6, f"{_fmt(idle + busy)} Wh/day", "end"))
    out.append(_text(PAD_L + plot_w / 2, H - 4, f"energy over a day at {daily['rate_per_h']:g}/h (grey idle, orange "
                                                "inference)", "middle"))
    return _svg("".join(out), title="energy over a day")


# --- HTML ---------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,sans-serif;max-width:980px;margin:24px auto;padding:0 16px;color:#1f2328}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
.sub{color:#59636e;margin-top:0}table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}th{background:#f6f8fa}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.tag{display:inline-block;border-radius:10px;padding:0 7px;color:#fff;font-size:11px}
.cards{display:flex;flex-wrap:wrap;gap:10px}.card{border:1px solid #d0d7de;border-radius:6px;padding:8px 12px;min-width:170px}
.card b{display:block;font-size:20px}.ok{color:#1a7f37}.bad{color:#cf222e}.src{color:#59636e;font-size:12px}
svg{max-width:100%;height:auto;display:block}
table{display:block;max-width:100%;overflow-x:auto}
@media (max-width:600px){body{margin:12px auto;padding:0 10px}svg text{font-size:15px}.card{min-width:0;flex:1 1 140px}}
"""


def _tag(prov: str) -> str:
    colour = PROVENANCE_COLOURS.get(prov.rsplit(", ", 1)[-1], "#59636e")  # 'host, measured': measured's colour
    return f'<span class="tag" style="background:{colour}">{html.escape(prov)}</span>'


def _table(head: list[str], rows: list[list], num_cols: set[int] = frozenset()) -> str:
    out = ["<table>" + ("<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>" if any(head) else "")]
    for row in rows:
        cells = []
        for i, v in enumerate(row):
            cls = ' class="num"' if i in num_cols else ""
            cells.append(f"<td{cls}>{v}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "".join(out) + "</table>"


def _card(title: str, value: str, prov: str | None = None, cls: str = "") -> str:
    return (f'<div class="card">{html.escape(title)}<b class="{cls}">{html.escape(value)}</b>'
            f'{_tag(prov) if prov else ""}</div>')


def render_html(d: dict) -> str:
    e = html.escape
    best = _best(d)
    b = d["best"]
    v = d.get("verdict") or {}
    en = d.get("energy") or {}
    dev = d.get("device")
    title = f"edgetrain profile: {d['model']}"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'>"
             f"<meta name='viewport' content='width=device-width,initial-scale=1'><title>{e(title)}</title><style>{_CSS}</style>"
             f"</head><body><h1>{e(title)}</h1>",
             f"<p class='sub'>{e(d['runtime'])}, input {'x'.join(map(str, d['input_shape']))}, batch {d['batch']}, "
             f"{d['warmup']} warm-up + {d['runs']} timed runs per configuration, each in a fresh process. Host: "
             f"{e(d['host']['cpu'])} ({e(d['host']['arch'])}, {d['host']['cores_usable']} cores)"
             + (f"; device profile: {e(dev['title'])} ({e(dev['name'])})" if dev else "") + ".</p>"]
    if d.get("failed_checks"):
        parts.append("<p class='bad'><b>Failed: " + e("; ".join(d["failed_checks"])) + "</b></p>")
    cards = [_card(f"p50 on this host ({b['threads']} thr)", f"{_fmt(b['p50_ms'])} ms", b["provenance"]),
             _card("p99 / p50 spread", _fmt(b["spread_p99_p50"]), b["provenance"]),
             _card("peak RSS (VmHWM)", f"{_fmt(best['memory']['peak_rss_mb'])} MB", "measured"),
             _card("predicted before running", f"{_fmt(d['prediction']['peak_rss_mb'])} MB "
                   f"(measured {against_plan(d['prediction'])})", "modelled")]
    if v.get("memory"):
        m = v["memory"]
        cards.append(_card(f"fits {dev['name']}?", f"{'yes' if m['fits'] else 'NO'}, {_fmt(m['headroom_mb'])} MB spare",
                           m["provenance"], "ok" if m["fits"] else "bad"))
    if v.get("latency") and v["latency"].get("mean_ms") is not None:
        cards.append(_card(f"mean latency on {dev['name']}", f"{_fmt(v['latency']['mean_ms'])} ms",
                           v["latency"]["provenance"]))
    from ..energy import EnergyRecord, carbon_text

    if en.get("per_inference"):
        pi = EnergyRecord.of(en["per_inference"], "mJ")
        cards.append(_card("energy / inference", pi.text(with_detail=False), pi.label))
        if en.get("carbon"):
            cards.append(_card("CO2e / inference", carbon_text(en["carbon"], per_inference=True).split(" CO2e")[0]
                               + " CO2e", "modelled" if en["carbon"]["energy_provenance"] != "measured" else "measured"))
    if en.get("daily") and "battery_hours" in en["daily"]:
        cards.append(_card("battery life", f"{_fmt(en['daily']['battery_days'])} days", en["daily"]["provenance"]))
    if en.get("budget"):
        ok = en["budget"]["passed"]
        cards.append(_card("energy budget", f"{'pass' if ok else 'OVER'} ({en['budget']['budget_mj']:g} mJ)",
                           en["budget"]["provenance"], "ok" if ok else "bad"))
    parts.append("<div class='cards'>" + "".join(cards) + "</div>")

    parts.append(f"<h2>Latency ({b['threads']} thread(s), {_tag(best['provenance'])})</h2>")
    lat = best["latency"]
    parts.append(latency_histogram_svg(best["latencies_ms"], lat["p50_ms"], lat["p99_ms"]))
    parts.append(_table(["load", "first inference", "mean", "p50", "p90", "p99", "min", "max", "std"],
                        [[f"{_fmt(best['load_s'])} s", f"{_fmt(best['first_inference_ms'])} ms"]
                         + [f"{_fmt(lat[k])} ms" for k in ("mean_ms", "p50_ms", "p90_ms", "p99_ms", "min_ms", "max_ms",
                                                         "std_ms")]], set(range(9))))
    parts.append(f"<p class='src'>{e(best['source'])}</p>")

    parts.append("<h2>Thread sweep</h2>")
    if len(d["configs"]) > 1:
        parts.append(thread_sweep_svg(d["configs"]))
    parts.append(_table(["threads", "p50 ms", "p90 ms", "p99 ms", "p99/p50", "load s", "first ms", "peak RSS MB"],
                        [[c["threads"], _fmt(c["latency"]["p50_ms"]), _fmt(c["latency"]["p90_ms"]),
                          _fmt(c["latency"]["p99_ms"]), _fmt(c["latency"]["spread_p99_p50"]), _fmt(c["load_s"]),
                          _fmt(c["first_inference_ms"]), _fmt(c["memory"]["peak_rss_mb"])] for c in d["configs"]],
                        set(range(8))))
    parts.append(f"<p>Best: <b>{b['threads']} thread(s)</b>, p50 {_fmt(b['p50_ms'])} ms, p99/p50 "
                 f"{_fmt(b['spread_p99_p50'])}.</p>")

    parts.append("<h2>Memory</h2>")
    parts.append(memory_svg(d["configs"], d["prediction"], v.get("memory")))
    p = d["prediction"]
    parts.append(_table(["part", "MB", "provenance"], [
        ["runtime after import", _fmt(best["memory"]["runtime_mb"]), _tag("measured")],
        ["+ weights / session (load)", _fmt(best["memory"]["load_mb"]), _tag("measured")],
        ["+ inference", _fmt(best["memory"]["inference_mb"]), _tag("measured")],
        ["= peak RSS (VmHWM)", _fmt(best["memory"]["peak_rss_mb"]), _tag("measured")],
        ["predicted before running", f"{_fmt(p['peak_rss_mb'])} (measured {against_plan(p)})", _tag("modelled")],
    ], {1}))
    parts.append(f"<p class='src'>Prediction: {e(p['source'])}</p>")
    if v.get("memory"):
        m = v["memory"]
        verdict = "fits" if m["fits"] else "does NOT fit"
        parts.append(f"<p>On <b>{e(dev['name'])}</b> the peak of {_fmt(m['peak_rss_mb'])} MB <b class="
                     f"'{'ok' if m['fits'] else 'bad'}'>{verdict}</b> in {m['available_mb']} MB "
                     f"(RAM {m['ram_mb']} MB minus an OS reserve of {m['os_reserve_mb']} MB: {e(m['os_reserve_why'])})"
                     f"; headroom {_fmt(m['headroom_mb'])} MB. {_tag(m['provenance'])} <span class='src'>"
                     f"{e(m['source'])}</span></p>")

    if v.get("latency"):
        lt = v["latency"]
        parts.append(f"<h2>Latency on {e(dev['name'])} {_tag(lt['provenance'])}</h2>")
        if lt.get("mean_ms") is not None:
            parts.append(f"<p>Mean {_fmt(lt['mean_ms'])} ms, p50 {_fmt(lt['p50_ms'])} ms, p99 {_fmt(lt.get('p99_ms'))} ms."
                         f"</p><p class='src'>{e(lt['source'])}</p>")
            if lt.get("reference"):
                parts.append(f"<p class='src'>Reference figure: {e(lt['reference']['source'])}</p>")
        else:
            parts.append(f"<p>{e(lt.get('note', ''))}</p><p class='src'>{e(lt.get('source', ''))}</p>")

    parts.append("<h2>Energy</h2>")
    if en.get("per_inference"):
        pi = EnergyRecord.of(en["per_inference"], "mJ")
        parts.append(f"<p>Per inference: <b>{e(pi.text())}</b> total, "
                     f"{_fmt(pi.get('above_idle_mj'))} mJ "
                     f"above idle {_tag(pi.provenance)}; {_fmt(en['inferences_per_wh_busy'])} inferences per Wh of "
                     f"busy time.</p><p class='src'>{e(pi.source)}</p>")
        for key in ("per_inference", "modelled_per_inference"):
            sp = (en.get(key) or {}).get("spread")
            if sp:
                parts.append(f"<p>How much it may move: {_fmt(sp['p10']['total_mj'])} mJ at the p10 latency to "
                             f"{_fmt(sp['p90']['total_mj'])} mJ at the p90 latency {_tag('modelled')}.</p>")
        if en.get("modelled_per_inference"):
            m = EnergyRecord.of(en["modelled_per_inference"], "mJ")
            parts.append(f"<p>Modelled for comparison: {e(m.text(with_detail=False))} {_tag('modelled')}</p>"
                         f"<p class='src'>{e(m.source)}</p>")
        if pi.get("rails_mj"):
            parts.append(_table(["rail", "mJ / inference"], [[e(k), _fmt(v)] for k, v in pi["rails_mj"].items()], {1}))
        rel = en.get("reliability") or {}
        if rel.get("reasons"):
            parts.append("<p class='bad'>The latency and energy estimates are unreliable: "
                         + e("; ".join(rel["reasons"])) + ".</p>")
        if en.get("daily"):
            dd = en["daily"]
            parts.append(energy_day_svg(dd))
            rows = [["inferences per day", _fmt(dd["inferences_per_day"])],
                    ["energy per day", f"{_fmt(dd['energy_wh_per_day'])} Wh ({_fmt(dd['busy_wh_per_day'])} busy + "
                                       f"{_fmt(dd['idle_wh_per_day'])} idle)"],
                    ["average power", f"{_fmt(dd['average_power_w'])} W"],
                    ["inferences per Wh (incl. idle)", _fmt(dd["inferences_per_wh"])]]
            if "battery_hours" in dd:
                rows.append(["battery life", f"{_fmt(dd['battery_hours'])} h = {_fmt(dd['battery_days'])} days "
                                             f"on {dd['battery_wh']:g} Wh"])
            parts.append(_table(["", ""], rows))
            parts.append(f"<p class='src'>{e(dd['source'])}</p>")
            if dd.get("note"):
                parts.append(f"<p class='bad'>{e(dd['note'])}</p>")
        if en.get("carbon"):
            c = en["carbon"]
            day = f"; {c['per_day_g']:.3g} g CO2e per day at the rate above" if c.get("per_day_g") is not None else ""
            parts.append(f"<p>Carbon: <b>{e(carbon_text(c, per_inference=True))}</b> per inference{e(day)}. "
                         f"<span class='src'>{e(c['intensity']['source'])}</span></p>")
        if en.get("continuous"):
            c = en["continuous"]
            parts.append(f"<p>Battery {c['battery_wh']:g} Wh: {_fmt(c['battery_hours'])} h of continuous inference "
                         f"(no --rate given).</p>")
        if en.get("budget"):
            bg = en["budget"]
            parts.append(f"<p>Budget {bg['budget_mj']:g} mJ per inference: <b class='{'ok' if bg['passed'] else 'bad'}'>"
                         f"{'pass' if bg['passed'] else 'OVER BUDGET'}</b> ({_fmt(bg['energy_mj'])} mJ, margin "
                         f"{_fmt(bg['margin_mj'])} mJ).</p>")
    elif en.get("note"):
        parts.append(f"<p>{e(en['note'])}</p>")
    else:
        parts.append("<p>No device profile given (--device), so no modelled energy.</p>")
    he = d.get("host_energy") or {}
    if he.get("configs"):
        rapl = [EnergyRecord.of(h, "mJ") for h in he["configs"]]
        parts.append(_table(["threads", "host mJ / inference", "average W", "provenance"],
                            [[h["threads"], e(h.text(with_detail=False)), _fmt(h.get("average_power_w")),
                              _tag(h.label)] for h in rapl], {1, 2}))
        parts.append(f"<p class='src'>{e(rapl[0].source)}</p>")
    elif he.get("note"):
        parts.append(f"<p class='src'>{e(he['note'])}</p>")
    if he.get("board"):
        board = [EnergyRecord.of(h, "mJ") for h in he["board"]]
        off = any(h.machine == "host" for h in board)
        parts.append(_table(["threads", f"{'this host' if off else 'board'} mJ / inference", "above idle mJ",
                             "samples", "provenance"],
                            [[h["threads"], e(h.text(with_detail=False)), _fmt(h.get("above_idle_mj")), h.samples,
                              _tag(h.label)] for h in board], {1, 2, 3}))
        if off:
            parts.append("<p class='src'>Measured on this machine, which is not the device: shown as what it is, "
                         "beside the device's figure above, never in its place.</p>")
        parts.append(f"<p class='src'>{e(he['board'][0]['source'])}</p>")
    elif he.get("board_note"):
        parts.append(f"<p class='src'>{e(he['board_note'])}</p>")

    parts.append(f"<h2>Where the time goes ({b['threads']} thread(s))</h2>")
    ops = best.get("ops") or {}
    if ops.get("available"):
        parts.append(_table(["op type", "calls / run", "ms / run", "share"],
                            [[e(r["op"]), _fmt(r["calls_per_run"]), _fmt(r["ms_per_run"]),
                              f"<span style='display:inline-block;background:#54aeff;height:9px;width:"
                              f"{max(1, int(r['share'] * 120))}px'></span> {r['share'] * 100:.1f}%"]
                             for r in ops["table"]], {1, 2}))
        parts.append(f"<p class='src'>{e(ops['source'])}; profiled over {ops['runs']} extra runs after the timed "
                     "ones (the profiler slows the run down, so these times are for shares, not latency).</p>")
        if ops.get("busy_note"):
            parts.append(f"<p class='bad'>{e(ops['busy_note'])}</p>")
    else:
        parts.append(f"<p>{e(ops.get('note', 'no per-op timings'))}</p>")

    parts.append("<h2>Provenance of every figure</h2>")
    parts.append(_table(["figure", "value", "provenance", "source"],
                        [[e(f["name"]), f"{_fmt(f['value'])} {e(f['unit'])}", _tag(f["provenance"]),
                          f"<span class='src'>{e(f['source'])}</span>"] for f in d["figures"]], {1}))
    parts.append("<p class='src'>measured: timed or read on this machine; estimated: a measurement here scaled or "
                 "carried over to the device; modelled: computed from a model and cited figures; emulated: "
                 "measured under emulation, not indicative of the device.</p>")
    if d.get("warnings"):
        parts.append("<h2>Warnings</h2><ul>" + "".join(f"<li class='bad'>{e(w)}</li>" for w in d["warnings"]) + "</ul>")
    if d.get("notes"):
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in d["notes"]) + "</ul>")
    parts.append("</body></html>\n")
    return "".join(parts)


# --- Markdown -----------------------------------------------------------------------------------------

def _md_table(head: list[str], rows: list[list]) -> str:
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def render_markdown(d: dict) -> str:
    best = _best(d)
    b = d["best"]
    lat = best["latency"]
    out = [f"# edgetrain profile: {d['model']}\n",
           f"{d['runtime']}, input {'x'.join(map(str, d['input_shape']))}, batch {d['batch']}, {d['warmup']} warm-up + "
           f"{d['runs']} timed runs per configuration, each in a fresh process. Host: {d['host']['cpu']} "
           f"({d['host']['arch']}, {d['host']['cores_usable']} cores)."
           + (f" Device profile: {d['device']['title']} ({d['device']['name']})." if d.get("device") else "") + "\n"]
    if d.get("failed_checks"):
        out.append("**Failed:** " + "; ".join(d["failed_checks"]) + "\n")
    out.append("## Summary\n")
    out.append("\n".join(f"- {line}" for line in text_summary(d)) + "\n")
    out.append(f"## Latency ({b['threads']} thread(s), {best['provenance']})\n")
    out.append(_md_table(["load", "first inference", "mean", "p50", "p90", "p99", "min", "max"],
                         [[f"{_fmt(best['load_s'])} s", f"{_fmt(best['first_inference_ms'])} ms"]
                          + [f"{_fmt(lat[k])} ms" for k in ("mean_ms", "p50_ms", "p90_ms", "p99_ms", "min_ms", "max_ms")]]))
    bins = _histogram(best["latencies_ms"])
    peak = max(c for _, _, c in bins) or 1
    out.append("```\n" + "\n".join(f"{_fmt(a):>8} ms {'#' * max(0, round(40 * c / peak)):<40} {c}" for a, _, c in bins)
               + "\n```\n")
    out.append("## Thread sweep\n")
    out.append(_md_table(["threads", "p50 ms", "p90 ms", "p99 ms", "p99/p50", "peak RSS MB"],
                         [[c["threads"], _fmt(c["latency"]["p50_ms"]), _fmt(c["latency"]["p90_ms"]),
                           _fmt(c["latency"]["p99_ms"]), _fmt(c["latency"]["spread_p99_p50"]),
                           _fmt(c["memory"]["peak_rss_mb"])] for c in d["configs"]]))
    out.append("## Memory\n")
    p = d["prediction"]
    out.append(_md_table(["part", "MB", "provenance"], [
        ["runtime after import", _fmt(best["memory"]["runtime_mb"]), "measured"],
        ["+ weights / session", _fmt(best["memory"]["load_mb"]), "measured"],
        ["+ inference", _fmt(best["memory"]["inference_mb"]), "measured"],
        ["= peak RSS (VmHWM)", _fmt(best["memory"]["peak_rss_mb"]), "measured"],
        ["predicted before running", f"{_fmt(p['peak_rss_mb'])} (measured {against_plan(p)})", "modelled"]]))
    en = d.get("energy") or {}
    if en.get("daily"):
        dd = en["daily"]
        out.append("## Energy over a day\n")
        rows = [["inferences per day", _fmt(dd["inferences_per_day"])],
                ["energy per day", f"{_fmt(dd['energy_wh_per_day'])} Wh"],
                ["busy / idle", f"{_fmt(dd['busy_wh_per_day'])} / {_fmt(dd['idle_wh_per_day'])} Wh"],
                ["average power", f"{_fmt(dd['average_power_w'])} W"]]
        if "battery_hours" in dd:
            rows.append(["battery life", f"{_fmt(dd['battery_hours'])} h ({_fmt(dd['battery_days'])} days)"])
        out.append(_md_table(["", ""], rows))
    out.append(f"## Where the time goes ({b['threads']} thread(s))\n")
    ops = best.get("ops") or {}
    if ops.get("available"):
        out.append(_md_table(["op type", "calls / run", "ms / run", "share"],
                             [[r["op"], _fmt(r["calls_per_run"]), _fmt(r["ms_per_run"]), f"{r['share'] * 100:.1f}%"]
                              for r in ops["table"]]))
        out.append(f"_{ops['source']}_\n")
        if ops.get("busy_note"):
            out.append(f"**{ops['busy_note']}**\n")
    else:
        out.append(f"{ops.get('note', 'no per-op timings')}\n")
    out.append("## Provenance of every figure\n")
    out.append(_md_table(["figure", "value", "provenance", "source"],
                         [[f["name"], f"{_fmt(f['value'])} {f['unit']}", f["provenance"], f["source"]]
                          for f in d["figures"]]))
    return "\n".join(out)
