"""`edgetrain predict MODEL DATA`: classify with an ONNX model written by edgetrain (no mxnet loaded).

On a Pi Zero 2 W the start-up is the cost: this command must start and stay as small as a hand-written
ONNX Runtime loop (issue 16: within 10%). Its flags are declared once, by ``options.PredictOptions``, but
building them from pydantic at every start would double the start-up (pydantic plus every command's
model: ~0.3 s of CPU). So the click options are made from ``predict_flags.json``, derived from that
declaration by ``python -m edgetrain.cli.predict --write-flags`` and checked equal to it by a test, and
the values are checked by click's types with the declaration's bounds. ``--device`` (a profile to read)
takes the full pydantic path.
"""
from __future__ import annotations

import csv
import io
import json
import typing
from dataclasses import dataclass
from pathlib import Path

import click

from .common import finish, json_option, quiet, say, setup
from .render import ProgressLine

CONFUSION_ROWS = 10  # classes shown in the confusion summary (the worst recall first)
FLAGS = Path(__file__).with_name("predict_flags.json")


def flag_specs() -> list[dict]:
    """The click options PredictOptions declares, as plain data (imports pydantic: for writing and checking)."""
    from ..options import PredictOptions, flag_of
    from .options import SHARED

    specs = []
    own = [n for n in PredictOptions.model_fields if n not in SHARED]
    for name in own + [n for n in PredictOptions.model_fields if n in SHARED]:
        info = PredictOptions.model_fields[name]
        extra = info.json_schema_extra or {}
        spec = {"name": name, "decls": [extra.get("flag") or flag_of(PredictOptions, name)]
                + ([extra["short"]] if extra.get("short") else []), "help": info.description,
                "metavar": extra.get("metavar"), "default": info.default, "type": "str"}
        for arg in (info.annotation, *typing.get_args(info.annotation)):
            if typing.get_origin(arg) is typing.Literal:
                spec.update(type="choice", choices=[str(a) for a in typing.get_args(arg)])
            base = typing.get_args(arg)[0] if typing.get_origin(arg) is typing.Annotated else arg
            if base is int:
                spec["type"] = "int"
                meta = list(info.metadata) + [m for a in typing.get_args(arg)[1:] for m in getattr(a, "metadata", [])]
                for m in meta:
                    if hasattr(m, "ge"):
                        spec["min"] = m.ge
                    if hasattr(m, "le"):
                        spec["max"] = m.le
        if spec["type"] == "str" and not spec["metavar"]:
            spec["metavar"] = "TEXT"
        if spec["type"] == "int" and not spec["metavar"]:
            spec["metavar"] = "N"
        specs.append(spec)
    return specs


def _flag_options(f):
    specs = json.loads(FLAGS.read_text(encoding="utf-8")) if FLAGS.is_file() else flag_specs()
    for spec in reversed(specs):
        kw = {"help": spec["help"], "metavar": spec["metavar"], "default": spec["default"],
              "show_default": spec["default"] is not None}
        if spec["type"] == "choice":
            kw["type"] = click.Choice(spec["choices"])
            kw.pop("metavar")
        elif spec["type"] == "int":
            kw["type"] = click.IntRange(spec.get("min"), spec.get("max"))
        f = click.option(*spec["decls"], spec["name"], **kw)(f)
    return f


@dataclass(frozen=True)
class _Options:
    """PredictOptions' values as click checked them (no device profile to load)."""

    top_k: int
    format: str
    batch: int
    output: str | None
    threads: int | None
    device: None = None

    def thread_cap(self) -> int | None:
        return self.threads


@click.command()
@click.argument("model")
@click.argument("data")
@_flag_options
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
    if values.get("device") is not None:  # a device profile to read: the declaration's own parser
        from ..options import PredictOptions
        from .options import parse

        opts = parse(PredictOptions, values)
    else:
        opts = _Options(**{k: v for k, v in values.items() if k != "device"})
    from ..fileio import check_outputs

    check_outputs({"MODEL": model, "DATA": data}, {"-o": opts.output, "--json": json_path})
    setup(opts)
    from ..ops.predict import predict as run

    rows = Rows(opts.format, to_stdout=opts.output is None and not quiet(json_path))
    res = run(model, data, opts, progress=ProgressLine(not quiet(json_path) and opts.output is not None),
              on_rows=rows.add)
    if opts.output is not None:
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


def render(opts):
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


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--write-flags"]:
        FLAGS.write_text(json.dumps(flag_specs(), indent=1) + "\n", encoding="utf-8")
