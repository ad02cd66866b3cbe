"""`edgetrain predict` without click: its command line, its run, its output.

On a Pi Zero 2 W the start-up is most of a short run, and this command must cost no more than a hand-written
ONNX Runtime loop (within 10% of its CPU time). Importing click and building its command costs ~17 ms of CPU
here, 6-13% of such a run (measured: README.md, "predict's start-up"), so ``edgetrain.cli.main`` hands
`predict`'s arguments to ``parse`` first. ``parse`` reads them with the flags ``options.PredictOptions``
declares (the one declaration, read at run time) and checks the values with it; a command line it does not
read exactly as click would, or that the declaration refuses (``--help``, an unknown flag, a bad value),
returns None and goes to the click command in ``edgetrain.cli.predict``, which gives the usual help and
errors and then calls ``run`` here too.
"""
from __future__ import annotations


from ..errors import UsageError
from ..options import PredictOptions
from .common import JSON_FLAG, echo, finish, quiet, say, setup

CONFUSION_ROWS = 10  # classes shown in the confusion summary (the worst recall first)


def parse(args: list[str]) -> tuple[str, str, str | None, PredictOptions] | None:
    """(MODEL, DATA, --json PATH, the options) from predict's arguments, or None: let click read them."""
    fields = PredictOptions.fields.values()
    by_flag = {decl: f.name for f in fields if f.kind != "bool" for decl in (f.flag, f.short) if decl}
    by_flag[JSON_FLAG] = JSON_FLAG
    values: dict[str, str] = {}
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
        name = by_flag.get(flag)
        if name is None:
            return None  # --help, -h, an unknown or misspelt flag (or a bool): click says what it is
        if not eq:
            if not rest:
                return None
            value = rest.pop(0)
        if value.startswith("-") and value != "-":
            return None  # click's reading of '--batch --top-k' style lines is click's to give
        values[name] = value
    if len(positional) != 2:
        return None
    json_path = values.pop(JSON_FLAG, None)
    try:
        opts = PredictOptions.parse(values)
    except UsageError:
        return None  # click gives the error, as for every other command
    return positional[0], positional[1], json_path, opts


def run(model: str, data: str, json_path: str | None, opts: PredictOptions) -> None:
    """Classify DATA with MODEL and write what the user asked for (the click command calls this too)."""
    from ..fileio import check_outputs

    check_outputs({"MODEL": model, "DATA": data}, {"-o": opts.output, JSON_FLAG: json_path})
    setup(opts)
    from ..ops.predict import Rows, predict as classify
    from .render import ProgressLine

    to_stdout = opts.output is None and not quiet(json_path)
    rows = Rows(opts.format, sink=lambda lines: echo("\n".join(lines))) if to_stdout else None
    res = classify(model, data, opts, progress=ProgressLine(not quiet(json_path) and opts.output is not None),
                   on_rows=rows.add if rows is not None else None, outputs={"-o": opts.output, JSON_FLAG: json_path})
    if rows is not None and rows.end():
        echo("\n".join(rows.end()))
    finish(json_path, res, render(opts))


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
        out(f"speed      {t.images_per_s:.1f} images/s end to end (inference alone "
            f"{t.inference_images_per_s:.1f}/s); batch p50 {t.batch_p50_ms:.2f} ms, p90 "
            f"{t.batch_p90_ms:.2f} ms ({t.per_image_ms:.2f} ms per image)")
        out(f"start-up   model loaded in {t.load_s:.2f} s, first result {t.first_result_s:.2f} s after start")
        a = res.accuracy
        if a:
            topk = f"  top-{a.k} {a.topk:.2f}%" if a.k > 1 else ""  # --top-k 1: the one figure once
            out(f"accuracy   top-1 {a.top1:.2f}%{topk} on {a.samples} labelled input(s)")
            worst = sorted(a.per_class, key=lambda c: (c.recall, -c.samples))[:CONFUSION_ROWS]
            shown = "" if len(worst) == len(a.per_class) else f" (the {len(worst)} with the lowest recall)"
            out(f"confusion  class: recall, most often mistaken for{shown}")
            for c in worst:
                mistaken = (f"{c.most_confused_with} ({c.confused_count} of {c.samples})"
                            if c.most_confused_with is not None else "-")
                out(f"           {c.label}: {c.recall:.1f}% of {c.samples}, {mistaken}")
        for note in res.notes:
            out(f"note       {note}")
    return show
