"""The fleet's results: the coordinator's round-by-round report (RUNDIR/fleet.json) and a device's, and
the fleet's section of an edgetrain report (HTML or Markdown), rendered from fleet.json alone: the
fleet's own page (RUNDIR/fleet-report.html) and a recipe's report step naming the RUNDIR show the same."""
from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UsageError
from ..results import Result, seal_whole, sealed_as_written

RESULT = "fleet.json"  # in a fleet RUNDIR: the round-by-round report
HTML = "fleet-report.html"  # in a fleet RUNDIR: the report page (the run report's page, this section)


@dataclass
class FleetResult(Result):
    rundir: str
    model: str
    address: str
    tls: bool
    codec: str
    aggregate: str
    train_layers: str
    rounds_requested: int
    rounds_completed: int  # rounds that aggregated an update (a round without one is run, not completed)
    initial_accuracy: float | None
    final_accuracy: float | None
    bytes_up: int
    bytes_up_fp32: int
    bytes_down: int
    rounds: list[dict]
    resumed_after: int = 0
    report: str | None = None
    notes: list[str] = field(default_factory=list)
    rounds_run: int = 0
    rounds_without_update: list[int] = field(default_factory=list)
    devices: list[dict] = field(default_factory=list)  # per device (by its name): rounds asked, updates aggregated
    models: dict = field(default_factory=dict)  # the deployable global model (RUNDIR/model): prefix, onnx, int8
    model_checks: list[str] = field(default_factory=list)  # of the deployable model (export, int8 budget)
    chance: dict | None = None  # figures.Chance of the final held-out top-1
    finite: bool = True  # every array of the final global model is finite

    @property
    def uplink_reduction(self) -> float | None:
        return self.bytes_up_fp32 / self.bytes_up if self.bytes_up else None

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["uplink_reduction"] = self.uplink_reduction
        return seal_whole(d)  # a recipe's report step reads it back (read_report)

    def checks(self) -> list[str]:
        from ..compare import chance_failure

        failed = []
        if not self.finite:
            failed.append("the global model ended non-finite (NaN or inf among its arrays)")
        if self.rounds_completed < self.rounds_requested:
            stale = (f"; round(s) {', '.join(map(str, self.rounds_without_update))} aggregated no update "
                     "(--min-updates)") if self.rounds_without_update else ""
            failed.append(f"only {self.rounds_completed} of {self.rounds_requested} rounds completed{stale}")
        at_chance = chance_failure(self.chance, "the global model's held-out") if self.rounds else None
        return failed + ([at_chance] if at_chance else []) + self.model_checks


@dataclass
class JoinResult(Result):
    name: str
    state: str
    address: str
    rounds_trained: int  # rounds of this device the coordinator aggregated (its committed state), in all runs
    last_round: int
    final_accuracy: float | None
    rounds_asked: int = 0  # this run: rounds the coordinator asked this device for an update
    updates_accepted: int = 0  # this run: of those, rounds whose update the coordinator aggregated
    notes: list[str] = field(default_factory=list)


def read_report(rundir: str | Path, where: str = "fleet RUNDIR") -> dict:
    """RUNDIR/fleet.json as written by ``edgetrain fleet serve``; a one-line UsageError when it is not there."""
    path = Path(rundir) / RESULT
    fix = "give the RUNDIR of an `edgetrain fleet serve -o RUNDIR` run that finished (it writes fleet.json)"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"no fleet report in {rundir} ({RESULT} missing)", where, fix) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {type(exc).__name__}", where, fix) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rounds"), list):
        raise UsageError(f"{path} is not a fleet report (no rounds)", where, fix)
    if not sealed_as_written(doc):
        raise UsageError(f"{path} is not as `fleet serve` wrote it: it was changed after the run, or written by an "
                         "edgetrain before fleet reports were sealed (its seal does not match)", where,
                         "give the RUNDIR's fleet.json as the fleet run wrote it, or run the fleet again")
    return doc


def round_rows(doc: dict) -> list[dict]:
    """Per round, the figures both renderings show: held-out top-1, who took part, bytes, time, memory, energy."""
    rows = []
    for r in doc["rounds"]:
        parts = r.get("participants") or []
        joules = [p["joules"] for p in parts if p.get("joules")]
        rows.append({
            "round": r["round"], "accuracy": r.get("accuracy"), "updates": r.get("updates", len(parts)),
            "updated": bool(r.get("updated", True)),
            "asked": len(parts) + sum(len(r.get(k, [])) for k in ("refused", "failed", "timed_out", "missing")),
            "bytes_up": r.get("bytes_up", 0), "bytes_down": r.get("bytes_down", 0), "seconds": r.get("seconds", 0.0),
            "peak_rss_mb": max((p.get("peak_rss_mb") or 0.0 for p in parts), default=0.0),
            "joules": sum(joules) if joules else None,
            "devices": [{"client": p.get("client"), "device": p.get("device"), "seconds": p.get("seconds", 0.0),
                         "peak_rss_mb": p.get("peak_rss_mb") or 0.0, "bytes_up": p.get("bytes_up", 0),
                         "joules": p.get("joules"), "energy": p.get("energy_provenance") or ""} for p in parts],
            "left_out": [f"{k}: {x.get('client') or x.get('node_id')}: {str(x.get('reason', ''))[-160:]}"
                         for k in ("refused", "failed") for x in r.get(k, [])]
                        + [f"timed out: {x.get('client')}: no answer within the round" for x in r.get("timed_out", [])]
                        # fleet.json written before devices were named: node ids
                        + [f"no answer within the round timeout: node {n}" for n in r.get("missing", [])]})
    return rows


def _headline(doc: dict) -> str:
    red = doc.get("uplink_reduction")
    red = f"{red:.2f}x fewer than float32" if red else "n/a"
    return (f"{doc['rounds_completed']} of {doc['rounds_requested']} rounds, {doc.get('aggregate')}, "
            f"--train-layers {doc.get('train_layers') or 'head'}, codec {doc.get('codec')} (uplink {red}); held-out "
            f"top-1 {doc.get('initial_accuracy') or 0:.4f} before, {doc.get('final_accuracy') or 0:.4f} after; "
            f"coordinator {doc.get('address')}{' (TLS)' if doc.get('tls') else ' (no TLS)'}; "
            f"{doc.get('bytes_up', 0)} bytes up, {doc.get('bytes_down', 0)} bytes down in all")


def _device_line(d: dict) -> str:
    line = (f"{d['client']} ({d['device']}): {d['seconds']:.1f}s, peak {d['peak_rss_mb']:.0f} MB, "
            f"{d['bytes_up']} B up")
    return line + (f", {d['joules']:.2f} J {d['energy']}".rstrip() if d.get("joules") else "")


def accuracy_svg(doc: dict) -> str:
    """Held-out top-1 per round as an inline SVG line chart (the profile report's chart frame): round 0 is the
    starting model; a round that accepted no update is an open grey circle, labelled as such."""
    from ..svgchart import H, PAD_B, PAD_R, PAD_T, W, axes, pad_left, svg, text

    points = [(0, doc.get("initial_accuracy"), True)] + [(r["round"], r.get("accuracy"), bool(r.get("updated", True)))
                                                         for r in doc["rounds"]]
    points = [(n, 100.0 * a, ok) for n, a, ok in points if a is not None]
    ymax = 100.0
    pad_l = pad_left(ymax)
    plot_w, plot_h = W - pad_l - PAD_R - 8, H - PAD_B - PAD_T
    last = max((n for n, _, _ in points), default=1) or 1
    x = lambda n: pad_l + 8 + plot_w * n / last  # noqa: E731
    y = lambda v: H - PAD_B - plot_h * v / ymax  # noqa: E731
    out = [axes(ymax, "top-1 %")]
    if points:
        out.append('<polyline fill="none" stroke="#0969da" stroke-width="2" points="'
                   + " ".join(f"{x(n):.1f},{y(v):.1f}" for n, v, _ in points) + '"/>')
    for n, v, ok in points:
        what = "starting model" if n == 0 else f"round {n}" + ("" if ok else ": no update accepted")
        style = 'fill="#0969da"' if ok else 'fill="#fff" stroke="#8c959f" stroke-width="2"'
        out.append(f'<circle cx="{x(n):.1f}" cy="{y(v):.1f}" r="4" {style}><title>{what}: {v:.2f}%</title></circle>')
    ticks = sorted({round(last * i / min(last, 5)) for i in range(min(last, 5) + 1)})
    for i, n in enumerate(ticks):
        out.append(text(x(n), H - PAD_B + 14, str(n), "end" if i == len(ticks) - 1 and i else "middle"))
    stale = [n for n, _, ok in points if not ok]
    caption = "round (0: the start)" + ("; open circle: no update accepted" if stale else "")
    out.append(text(pad_l + plot_w / 2, H - 4, caption, "middle"))
    return svg("".join(out), title="held-out top-1 per round")


def html_section(doc: dict | FleetResult) -> str:
    """The fleet's section of an HTML report: one row per round, one line per device."""
    doc = doc.to_dict() if isinstance(doc, FleetResult) else doc
    e = html.escape
    rows = []
    for r in round_rows(doc):
        energy = f"{r['joules']:.2f}" if r["joules"] is not None else "-"
        updates = f"{r['updates']} of {r['asked']}" + ("" if r["updated"] else " (no update accepted: not completed)")
        rows.append(f"<tr><td>{r['round']}</td><td>{r['accuracy']:.4f}</td><td>{e(updates)}</td>"
                    f"<td>{r['bytes_up']}</td><td>{r['bytes_down']}</td><td>{r['seconds']:.1f}</td>"
                    f"<td>{r['peak_rss_mb']:.0f}</td><td>{energy}</td>"
                    f"<td>{'<br>'.join(e(_device_line(d)) for d in r['devices'])}</td>"
                    f"<td>{'<br>'.join(e(x) for x in r['left_out'])}</td></tr>")
    return (f"<section id='fleet'><h2>Fleet: {e(str(doc['model']))}</h2><p>{e(_headline(doc))}.</p>"
            f"<p>Run folder <code>{e(str(doc.get('rundir')))}</code></p>{_models_html(doc)}"
            f"<h3>Held-out top-1 per round</h3>{accuracy_svg(doc)}"
            "<table class='fleet'><tr><th>round</th><th>held-out top-1</th><th>updates</th><th>bytes up</th>"
            "<th>bytes down</th><th>seconds</th><th>peak RSS (MB, max)</th><th>energy (J, all devices)</th>"
            "<th>devices (time, peak RSS, bytes up, energy)</th><th>left out</th></tr>"
            + "".join(rows) + "</table></section>")


def _models_html(doc: dict) -> str:
    models = doc.get("models") or {}
    if not models:
        return ""
    names = {"prefix": "PREFIX (Gluon)", "onnx": "ONNX fp32", "int8": "ONNX int8"}
    items = "".join(f"<li>{names.get(k, k)}: <code>{html.escape(str(v))}</code></li>" for k, v in models.items())
    return f"<p>The global model, to deploy (<code>edgetrain predict</code>, <code>edgetrain profile</code>):</p><ul>{items}</ul>"


def markdown_section(doc: dict | FleetResult) -> str:
    """The same section in Markdown."""
    doc = doc.to_dict() if isinstance(doc, FleetResult) else doc
    models = doc.get("models") or {}
    deploy = ["The global model, to deploy: " + ", ".join(f"{k} `{v}`" for k, v in models.items()), ""] if models else []
    lines = [f"## Fleet: {doc['model']}", "", _headline(doc) + ".", "", *deploy,
             "| round | held-out top-1 | updates | bytes up | bytes down | seconds | peak RSS (MB, max) | energy (J) | "
             "devices | left out |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in round_rows(doc):
        energy = f"{r['joules']:.2f}" if r["joules"] is not None else "-"
        updates = f"{r['updates']} of {r['asked']}" + ("" if r["updated"] else " (no update accepted: not completed)")
        cells = [str(r["round"]), f"{r['accuracy']:.4f}", updates, str(r["bytes_up"]),
                 str(r["bytes_down"]), f"{r['seconds']:.1f}", f"{r['peak_rss_mb']:.0f}", energy,
                 "<br>".join(_device_line(d) for d in r["devices"]), "<br>".join(r["left_out"])]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"
