"""`edgetrain predict` without click or pydantic: its command line, its run, its output.

On a Pi Zero 2 W the start-up is the cost: this command must start and stay as small as a hand-written
ONNX Runtime loop (issue 16: within 10%). Importing click (~35 ms of CPU here) and building the flags from
pydantic (~0.3 s) would not fit, so ``edgetrain.cli.main`` hands `predict`'s arguments to ``parse``:
the flags are the ones ``options.PredictOptions`` declares, as generated into ``predict_flags.json``
(``python -m edgetrain.cli.predict --write-flags``; a test checks it equals the declaration). ``parse``
takes only a command line it reads exactly as click would; anything else (``--help``, a value out of
range, an unknown flag, ``--device``: a profile to read) returns None and goes to the click command in
``edgetrain.cli.predict``, which gives the usual help and errors and then calls ``run`` here too.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from .common import JSON_DEST, JSON_FLAG, echo, finish, quiet, say, setup

CONFUSION_ROWS = 10  # classes shown in the confusion summary (the worst recall first)
FLAGS = Path(__file__).with_name("predict_flags.json")
_DIGITS = re.compile(r"[0-9]+")


def flag_specs_from_file() -> list[dict]:
    return json.loads(FLAGS.read_text(encoding="utf-8"))


def parse(args: list[str]) -> tuple[str, str, str | None, dict] | None:
    """(MODEL, DATA, --json PATH, option values) from predict's arguments, or None: let click read them."""
    specs = flag_specs_from_file()
    by_flag = {decl: spec for spec in specs for decl in spec["decls"]}
    by_flag[JSON_FLAG] = {"name": JSON_DEST, "type": "str"}
    values = {spec["name"]: spec["default"] for spec in specs}
    values[JSON_DEST] = None
    positional: list[str] = []
    rest = list(args)
    while rest:
        tok = rest.pop(0)
        if tok == "--":
            positional += rest
            break
        if not tok.startswith("-") or tok == "-":
            positional.append(tok)
            continue
        if tok.startswith("--"):
            flag, eq, value = tok.partition("=")
        else:  # a short flag: -o FILE or -oFILE
            flag, eq, value = tok[:2], tok[2:], tok[2:]
        spec = by_flag.get(flag)
        if spec is None:
            return None  # --help, -h, an unknown or misspelt flag: click says what it is
        if not eq:
            if not rest:
                return None
            value = rest.pop(0)
        if value.startswith("-") and value != "-":
            return None  # click's reading of '--batch --top-k' style lines is click's to give
        value = _convert(spec, value)
        if value is None:
            return None
        values[spec["name"]] = value
    if len(positional) != 2 or values.get("device") is not None:
        return None
    json_path = values.pop(JSON_DEST)
    return positional[0], positional[1], json_path, values


def _convert(spec: dict, text: str):
    """The value as click's type would give it, or None where click would refuse it (or might read it
    differently: a sign, spaces, underscores)."""
    if spec["type"] == "int":
        if not _DIGITS.fullmatch(text):
            return None
        n = int(text)
        if (spec.get("min") is not None and n < spec["min"]) or (spec.get("max") is not None and n > spec["max"]):
            return None
        return n
    if spec["type"] == "choice":
        return text if text in spec["choices"] else None
    return text


class _Options:
    """PredictOptions' values as the flags checked them (no device profile to load)."""

    device = None

    def __init__(self, top_k: int, format: str, batch: int, output: str | None, threads: int | None):
        self.top_k, self.format, self.batch, self.output, self.threads = top_k, format, batch, output, threads

    def thread_cap(self) -> int | None:
        return self.threads


def run(model: str, data: str, json_path: str | None, values: dict) -> None:
    """Classify DATA with MODEL and write what the user asked for (the click command calls this too)."""
    if values.get("device") is not None:  # a device profile to read: the declaration's own parser
        from ..options import PredictOptions
        from .options import parse as parse_declared

        opts = parse_declared(PredictOptions, values)
    else:
        opts = _Options(**{k: v for k, v in values.items() if k != "device"})
    from ..fileio import check_outputs

    check_outputs({"MODEL": model, "DATA": data}, {"-o": opts.output, JSON_FLAG: json_path})
    setup(opts)
    from ..ops.predict import predict as classify
    from .render import ProgressLine

    rows = Rows(opts.format, to_stdout=opts.output is None and not quiet(json_path))
    res = classify(model, data, opts, progress=ProgressLine(not quiet(json_path) and opts.output is not None),
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
            echo("\n".join(lines))
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
    import csv  # only for --format csv
    import io

    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(cols)
    return buf.getvalue()


def render(opts):
    def show(json_path, res) -> None:
        # the predictions may be on stdout in a machine format: the summary then goes to stderr
        err = quiet(json_path) or (opts.output is None and opts.format != "table")
        out = (lambda line: echo(line, err=True)) if err else (lambda line: say(json_path, line))
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
