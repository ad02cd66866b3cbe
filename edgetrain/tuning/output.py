"""What a tune run leaves in OUTDIR: the chosen trial's model as OUTDIR/model.onnx (its configuration in the
metadata, ``edgetrain.tune``), the trials table (trials.csv, and in tune.json with the rest of the result) and
report.html (the table and a chart of held-out accuracy against device seconds, the chosen trial marked).
Each written atomically."""
from __future__ import annotations

import csv
import html
import io
import json
import time
from pathlib import Path

from .. import procmem
from ..cputime import cpu_seconds
from ..fileio import atomic_write_text
from ..svgchart import H, PAD_B, PAD_R, PAD_T, W, axes, fmt, nice_max, pad_left, svg, text
from .records import TuneResult, score

META_KEY = "edgetrain.tune"
# what a tune writes into OUTDIR: the chosen model, the trials table, the JSON, the report; each trial in TRIALS_DIR
MODEL, CSV, JSON, REPORT, TRIALS_DIR = "model.onnx", "trials.csv", "tune.json", "report.html", "trials"
CSV_COLUMNS = ("trial", "status", "lr", "lr_used", "optimizer", "momentum", "weight_decay", "batch_size",
               "train_layers", "epochs", "epochs_run", "val_accuracy", "accuracy_by_rung", "device_seconds",
               "cpu_seconds", "train_seconds", "feature_seconds", "peak_mb", "estimate_mb", "energy_j",
               "energy_provenance", "latency_ms", "energy_per_inference_mj", "score", "why")


def write_model(src: Path, dst: Path, config: dict) -> None:
    """The chosen trial's model with its configuration in the metadata (written atomically, streamed)."""
    from ..training import with_metadata_streamed

    with_metadata_streamed(src, dst, META_KEY, json.dumps(config, sort_keys=True), "model")


def csv_text(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        cells = []
        for col in CSV_COLUMNS:
            value = row.get(col)
            if col == "accuracy_by_rung":
                value = " ".join(f"{r['epochs']}:{r['val_accuracy']:.4f}" for r in value if r["val_accuracy"] is not None)
            cells.append("" if value is None else value)
        writer.writerow(cells)
    return buf.getvalue()


def chart_svg(rows: list[dict]) -> str:
    """Held-out accuracy against device seconds, one point per trial (its last rung), the chosen one ringed,
    each trial's rungs joined by a line."""
    pts = [r for r in rows if r["accuracy_by_rung"]]
    if not pts:
        return ""
    xmax = nice_max(max(r["device_seconds"] for r in pts) or 1.0)
    ymax = 100.0
    left = pad_left(ymax)
    plot_w, plot_h = W - left - PAD_R, H - PAD_B - PAD_T
    colours = {"head": "#1f77b4", "bias": "#ff7f0e", "lite": "#2ca02c", "all": "#d62728"}

    def xy(sec, acc):
        return left + plot_w * sec / xmax, H - PAD_B - plot_h * (100.0 * acc) / ymax

    body = [axes(ymax, "held-out top-1 %")]
    for i in range(5):
        x = left + plot_w * i / 4
        body.append(text(x, H - PAD_B + 14, fmt(xmax * i / 4), "middle"))
    body.append(text(left + plot_w / 2, H - 4, "device seconds (the trial's, all its rungs)", "middle"))
    for r in pts:
        colour = colours.get(str(r["train_layers"]).split(":")[0], "#9467bd")
        line = [xy(a["device_seconds"], a["val_accuracy"] or 0.0) for a in r["accuracy_by_rung"]]
        if len(line) > 1:
            body.append('<polyline fill="none" stroke="%s" stroke-opacity="0.4" points="%s"/>'
                        % (colour, " ".join(f"{x:.1f},{y:.1f}" for x, y in line)))
        x, y = line[-1]
        tip = html.escape(f"trial {r['trial']}: {r['train_layers']} lr={r['lr_used']} {r['optimizer']} "
                          f"batch {r['batch_size']}: {100 * (r['val_accuracy'] or 0):.1f}% at {r['epochs_run']} "
                          f"epochs, {r['device_seconds']:.2f}s")
        body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}"><title>{tip}</title></circle>')
        if r["status"] == "chosen":
            body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="9" fill="none" stroke="#000" stroke-width="2"/>')
            body.append(text(x + 12, y - 8, f"chosen: trial {r['trial']}", extra='font-weight="bold"'))
    legend = [(k, c) for k, c in colours.items() if any(str(r["train_layers"]).startswith(k) for r in pts)]
    for i, (k, c) in enumerate(legend):
        body.append(f'<circle cx="{left + 10 + 70 * i}" cy="{PAD_T + 6}" r="4" fill="{c}"/>')
        body.append(text(left + 18 + 70 * i, PAD_T + 10, k))
    return svg("".join(body), title="held-out accuracy against device seconds per trial")


def html_report(result: dict) -> str:
    from ..run_report import page

    rows = result["trials"]
    head = ["trial", "status", "train_layers", "lr", "optimizer", "batch", "epochs", "held-out top-1 by rung",
            "device s", "peak MB", "energy J", "score", "why"]
    body_rows = []
    for r in rows:
        rungs = ", ".join(f"{a['epochs']}: {100 * a['val_accuracy']:.1f}%" for a in r["accuracy_by_rung"]
                          if a["val_accuracy"] is not None)
        energy = f"{r['energy_j']:.3g} [{r['energy_provenance']}]" if r.get("energy_j") is not None else ""
        cells = [r["trial"], r["status"], r["train_layers"], r["lr_used"] if r["lr_used"] is not None else r["lr"],
                 " ".join([r["optimizer"]] + [f"{k}={r[k]}" for k in ("momentum", "weight_decay") if k in r]),
                 r["batch_size"], f"{r['epochs_run']}/{r['epochs']}", rungs,
                 f"{r['device_seconds']:.2f}", fmt(r["peak_mb"]), energy,
                 f"{r['score']:.2f}" if r["score"] is not None else "", r["why"]]
        style = ' style="font-weight:bold;background:#eef"' if r["status"] == "chosen" else ""
        body_rows.append(f"<tr{style}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    chosen = result["chosen"] or {}
    summary = (f"<p>{html.escape(result['strategy'])} over {result['tried']} of {result['points']} grid points, "
               f"objective {html.escape(result['objective'])}: chose trial {chosen.get('trial')} "
               f"({html.escape(chosen.get('label', ''))}), {100 * (chosen.get('val_accuracy') or 0):.1f}% held-out "
               f"top-1. {result['epochs_run']} epochs trained where the full grid trains {result['grid_epochs']}; "
               f"{result['seconds']:.1f} s in all, {result['trial_seconds']:.1f} s in the trials, tuner overhead "
               f"{result['overhead_pct']:.2f}%.</p>")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in result["notes"])
    body = (f"<h1>edgetrain tune</h1>{summary}<h2>Accuracy against device time</h2>{chart_svg(rows)}"
            f"<h2>Trials</h2><table><thead><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr></thead>"
            f"<tbody>{''.join(body_rows)}</tbody></table>" + (f"<h2>Notes</h2><ul>{notes}</ul>" if notes else ""))
    return page("edgetrain tune", body)


def write_outputs(tuner, grid, points: list[dict], best, objective: str, rungs, resumed: bool) -> TuneResult:
    out = tuner.outdir
    t_out = time.monotonic()
    config = {**best.config, "lr": best.lr_used, "trial": best.number, "epochs_run": best.epochs_run,
              "val_accuracy": best.accuracy, "strategy": tuner.opts.strategy, "objective": objective,
              "seed": tuner.opts.seed, "grid": grid.to_dict()}
    write_model(out / TRIALS_DIR / f"{best.number:03d}" / MODEL, out / MODEL, config)
    rows = [t.row(objective, t is best) for t in tuner.trials]
    trial_s = sum(t.seconds for t in tuner.trials)
    caps = [p.get("epochs", tuner.opts.epochs) for p in points]  # every point of the grid, trained fully
    total = tuner.clock()
    shared = {k: round(v, 4) for k, v in tuner.timers.items()}
    store = tuner.store
    features = {"computed": store.computed if store else 0, "shared": store.shared if store else 0}
    if features["shared"]:
        tuner.notes.append(f"frozen features computed {features['computed']} time(s), reused by {features['shared']} "
                           "trial rung(s)")
    builds = tuner.builds
    features["builds"] = {"made": builds.made if builds else 0, "reused": builds.reused if builds else 0}
    if features["builds"]["reused"]:
        tuner.notes.append(f"the model's build (its graphs, step session and memory plan) made {builds.made} time(s), "
                           f"taken by {builds.reused} later trial rung(s) of the same trained part")
    skipped = [t for t in tuner.trials if t.status == "skipped"]
    if skipped:
        tuner.notes.append(f"{len(skipped)} trial(s) skipped before running: {skipped[0].why}")
    result = TuneResult(
        model=str(out / MODEL), outdir=str(out), strategy=tuner.opts.strategy, objective=objective,
        grid=grid.to_dict(), points=len(points), tried=len(tuner.trials),
        rungs=[{"epochs": r.epochs, "keep": r.keep} for r in rungs], trials=rows,
        chosen={"trial": best.number, "label": best.label(), **config, "score": score(best, objective)},
        seconds=0.0, trial_seconds=round(trial_s, 4), shared_seconds=shared, cpu_seconds=0.0,
        trial_cpu_seconds=round(sum(t.cpu_seconds for t in tuner.trials), 4), overhead_seconds=0.0, overhead_pct=0.0,
        epochs_run=sum(t.epochs_run for t in tuner.trials), grid_epochs=sum(caps), features=features,
        peak_rss_mb=max([t.peak_mb for t in tuner.trials if t.peak_mb]
                        + [tuner.setup_peak_mb or 0.0, procmem.peak_rss_mb() or 0.0]) or None,
        budget_mb=tuner.budget_mb, time_budget_s=tuner.opts.time_budget,
        stopped_by_time=tuner.stopped_by_time, csv=str(out / CSV), report=str(out / REPORT), resumed=resumed,
        notes=tuner.notes)
    atomic_write_text(out / CSV, csv_text(rows), "trials table")
    _finish_times(result, tuner, total + time.monotonic() - t_out)
    atomic_write_text(out / REPORT, html_report(result.to_dict()), "report")
    _finish_times(result, tuner, tuner.clock())
    atomic_write_text(out / JSON, json.dumps(result.to_dict(), indent=2, default=str) + "\n", "tune result")
    return result


def _finish_times(result: TuneResult, tuner, total: float) -> None:
    result.seconds = round(total, 4)
    overhead = max(total - result.trial_seconds - sum(tuner.timers.values()), 0.0)
    result.overhead_seconds = round(overhead, 4)
    result.overhead_pct = round(100.0 * overhead / max(total, 1e-9), 3)
    result.cpu_seconds = round(cpu_seconds() - tuner.cpu0, 4)
