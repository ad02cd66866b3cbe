"""`edgetrain predict MODEL DATA`: classify with an ONNX model written by edgetrain (no mxnet loaded)."""
from __future__ import annotations

import csv
import io
import json

import click

from ..options import PredictOptions
from .common import finish, json_option, quiet, say, setup
from .options import declared_options, parse
from .render import ProgressLine

CONFUSION_ROWS = 10  # classes shown in the confusion summary (the worst recall first)


@click.command()
@click.argument("model")
@click.argument("data")
@declared_options(PredictOptions)
@json_option
def predict(model, data, json_path, **values):
    """Classify DATA with MODEL, an .onnx written by `edgetrain export` or `edgetrain quantize` (fp32 or
    int8), applying the preprocessing recorded in it. DATA is an image folder (one sub-folder per class:
    labelled; images directly in it: unlabelled), an image file, an .npz, builtin:digits, or '-' to read
    image paths from standard input, one per line.

    Prints each input's top-k labels and scores (--format table, csv or jsonl), then the throughput and
    latency; with labels, the top-1 and top-k accuracy and a confusion summary. Only ONNX Runtime, NumPy
    and Pillow are loaded (never mxnet).
    """
    opts = parse(PredictOptions, values)
    from ..fileio import check_outputs

    check_outputs({"MODEL": model, "DATA": data}, {"-o": opts.output, "--json": json_path})
    setup(opts)
    from ..ops.predict import predict as run

    rows = Rows(opts.format, to_stdout=opts.output is None and not quiet(json_path))
    res = run(model, data, opts, progress=ProgressLine(not quiet(json_path) and opts.output is not None),
              on_rows=rows.add)
    if opts.output is not None:
        from pathlib import Path

        from ..fileio import atomic_write_text

        atomic_write_text(Path(opts.output), rows.text(), what="-o")
    finish(json_path, res, render(opts))


class Rows:
    """Predictions in the chosen format: streamed to stdout as each batch is done, or kept for -o."""

    def __init__(self, fmt: str, to_stdout: bool):
        self.fmt, self.to_stdout = fmt, to_stdout
        self.header_done = False
        self.kept: list[str] = []

    def add(self, rows: list[dict]) -> None:
        lines = []
        if not self.header_done and rows:
            lines += self._header(rows[0])
            self.header_done = True
        lines += [self._line(r) for r in rows]
        if self.to_stdout:
            click.echo("\n".join(lines))
        else:
            self.kept.extend(lines)

    def text(self) -> str:
        return "".join(line + "\n" for line in self.kept)

    def _header(self, row: dict) -> list[str]:
        k = len(row["top"])
        if self.fmt == "csv":
            cols = ["input"] + (["label"] if "label" in row else [])
            cols += [c for i in range(1, k + 1) for c in (f"top{i}_label", f"top{i}_score")]
            return [_csv(cols)]
        if self.fmt == "table":
            return ["input" + ("\tlabel" if "label" in row else "") + "\t" + f"top-{k} (score)"]
        return []

    def _line(self, row: dict) -> str:
        if self.fmt == "jsonl":
            return json.dumps(row)
        if self.fmt == "csv":
            cols = [row["input"]] + ([row["label"]] if "label" in row else [])
            cols += [v for t in row["top"] for v in (t["label"], f"{t['score']:.6f}")]
            return _csv(cols)
        top = "  ".join(f"{t['label']} {t['score']:.3f}" for t in row["top"])
        return row["input"] + (f"\t{row['label']}" if "label" in row else "") + "\t" + top


def _csv(cols) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(cols)
    return buf.getvalue()


def render(opts: PredictOptions):
    def show(json_path, res) -> None:
        # the predictions may be on stdout in a machine format: the summary then goes to stderr
        err = quiet(json_path) or (opts.output is None and opts.format != "table")
        out = (lambda line: click.echo(line, err=True)) if err else (lambda line: say(json_path, line))
        t = res.timing
        classes = f"{len(res.classes)} classes" if res.classes else "no class names recorded"
        out(f"model      {res.model} ({res.precision}, {classes})")
        source = "standard input" if res.data == "-" else res.data
        out(f"classified {res.samples} input(s) of {source} in batches of {res.batch}, {res.threads} thread(s)"
            + (f" -> {opts.output}" if opts.output else ""))
        out(f"speed      {t['images_per_s']:.1f} images/s end to end (inference alone "
            f"{t['inference_images_per_s']:.1f}/s); batch p50 {t['batch_p50_ms']:.2f} ms, p90 "
            f"{t['batch_p90_ms']:.2f} ms ({t['per_image_ms']:.2f} ms per image)")
        out(f"start-up   model loaded in {t['load_s']:.2f} s, first result {t['first_result_s']:.2f} s after start")
        a = res.accuracy
        if a:
            topk = a["top" + str(a["k"])]
            out(f"accuracy   top-1 {a['top1']:.2f}%  top-{a['k']} {topk:.2f}% on {a['samples']} labelled input(s)")
            worst = sorted(a["per_class"], key=lambda c: (c["recall"], -c["samples"]))[:CONFUSION_ROWS]
            shown = "" if len(worst) == len(a["per_class"]) else f" (the {len(worst)} with the lowest recall)"
            out(f"confusion  class: recall, most often mistaken for{shown}")
            for c in worst:
                mistaken = (f"{c['most_confused_with']} ({c['confused_count']} of {c['samples']})"
                            if c["most_confused_with"] is not None else "-")
                out(f"           {c['label']}: {c['recall']:.1f}% of {c['samples']}, {mistaken}")
        for note in res.notes:
            out(f"note       {note}")
    return show
