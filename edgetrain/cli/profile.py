"""`edgetrain profile MODEL`: latency, peak memory and energy, every figure labelled with its provenance."""
from __future__ import annotations


import click

from .common import device_option, json_option, progress_lines, say, setup, write_json
from .options import input_shape_option, params_option


@click.command()
@click.argument("model")
@device_option
@click.option("--runtime", "runtime_name", type=click.Choice(["onnxruntime", "mxnet"]),
              help="Runtime to profile in (default: onnxruntime for .onnx, mxnet for a Gluon MODEL; "
                   "onnxruntime on a Gluon MODEL exports it first, as `edgetrain export` would).")
@click.option("--threads", "threads", metavar="N[,N...]",
              help="Thread counts to sweep, e.g. 1,2,4; one fresh process each (default: the device's).")
@click.option("--batch", type=int, default=1, show_default=True, help="Batch size of each inference.")
@click.option("--warmup", type=int, default=10, show_default=True, help="Untimed runs after the first inference.")
@click.option("--runs", type=int, default=100, show_default=True, help="Timed runs per configuration.")
@click.option("--battery-wh", type=float, metavar="WH", help="Battery capacity for the battery-life figure.")
@click.option("--rate", metavar="N/h", help="Inferences per hour for the daily energy budget, e.g. 120/h.")
@click.option("--budget-mj", type=float, metavar="MJ",
              help="Energy budget per inference in millijoules; over budget exits 3 (report kept).")
@click.option("--report", "report_path", metavar="PATH", help="Write a self-contained report (.html or .md).")
@click.option("--timeout", type=float, default=None, metavar="S",
              help="Stop a configuration that runs longer than this many seconds (default 900).")
@input_shape_option
@params_option
@json_option
def profile(model, device, runtime_name, threads, batch, warmup, runs, battery_wh, rate, budget_mj, report_path,
            timeout, input_shape, params, json_path):
    """Measure MODEL's latency (load, first inference, p50/p90/p99), peak memory and per-op time, each
    configuration in a fresh process; with --device, say whether it fits and what it costs in energy.

    Figures measured elsewhere than on the device are labelled estimated (with how they were derived);
    energy is modelled from the profile's cited power figures, or measured by RAPL on this host.
    Exit 3 (report and JSON kept) when the peak memory does not fit the device or the energy per
    inference is over --budget-mj.
    """
    from pathlib import Path

    from ..errors import BudgetExceeded
    from ..fileio import check_output_path

    prof, _ = setup(device, None)
    if report_path:
        from ..report import check_report_path

        check_report_path(Path(report_path))
    if json_path and json_path != "-":
        check_output_path(Path(json_path), "--json")
    from ..profile import DEFAULT_TIMEOUT_S, profile as run

    progress = progress_lines(json_path)
    res = run(model, runtime_name=runtime_name, threads=threads, batch=batch, warmup=warmup, runs=runs,
              device=prof, battery_wh=battery_wh, rate=rate, budget_mj=budget_mj,
              input_shape=input_shape, params=params, timeout=timeout or DEFAULT_TIMEOUT_S, progress=progress)
    data = res.to_dict()
    if report_path:
        from ..report import write_report

        write_report(Path(report_path), data)
    write_json(json_path, data)
    if json_path != "-":
        _render(json_path, data, report_path)
    failed = res.failed_checks
    if failed:
        raise BudgetExceeded("; ".join(failed), res.device["name"] if res.device else "profile",
                             "the report and JSON were written; see them for the details")


def _render(json_path, d: dict, report_path) -> None:
    from ..report import text_summary

    for line in text_summary(d):
        say(json_path, line)
    if report_path:
        say(json_path, f"report     {report_path}")
