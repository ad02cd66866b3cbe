"""`edgetrain fleet serve MODEL` / `edgetrain fleet join ADDRESS`: fine-tune across devices on Flower."""
from __future__ import annotations

import click

from ..fileio import check_outputs
from ..ops import fleet as ops_fleet
from ..options import FleetJoinOptions, FleetServeOptions
from .common import finish, json_option, quiet, say, setup
from .options import declared_options, parse
from .render import ProgressLine


@click.group()
def fleet():
    """Fine-tune across many devices without moving their data (Flower): one coordinator, many devices.

    Only the trainable part travels (the output layer, or the last N layers with --train-layers last:N;
    compressed: int8, 2-bit with error feedback, or sparse ternary with an int8-delta downlink); each
    device trains it with edgetrain's fine-tuning
    engine on its own data. Needs the fleet extra: pip install "edgetrain[fleet]".
    """


@fleet.command()
@click.argument("model")
@declared_options(FleetServeOptions)
@json_option
def serve(model, json_path, **values):
    """Coordinate a federated fine-tune of MODEL's trainable part; writes RUNDIR/fleet.json and
    RUNDIR/fleet-report.html (held-out top-1, devices, bytes, time, memory and energy per round).

    Listens on loopback unless --listen says otherwise. Exit 3 when fewer rounds completed than asked,
    or the global model ended non-finite or at chance on --val.
    """
    opts = parse(FleetServeOptions, values)
    check_outputs({"MODEL": model, "--val": opts.val, "--params": opts.params, "--tls-cert": opts.tls_cert,
                   "--tls-key": opts.tls_key, "--tls-ca": opts.tls_ca}, {"--json": json_path})
    setup(opts)
    res = ops_fleet.serve(model, opts, progress=ProgressLine(not quiet(json_path)))
    finish(json_path, res, _serve_summary)


@fleet.command()
@click.argument("address")
@declared_options(FleetJoinOptions)
@json_option
def join(address, json_path, **values):
    """Join the coordinator at ADDRESS (HOST:PORT) as one device, training on DATA, until the run ends.

    The data stays here; only the update of the trainable part goes up. Exit 2 when this device's model
    does not fit the fleet's (another model or class list, or no --model for a model that is not built in);
    exit 1 when none of the rounds it was asked for reached the global model (the coordinator's reason).
    """
    opts = parse(FleetJoinOptions, values)
    check_outputs({"--data": opts.data, "--model": opts.model, "--params": opts.params, "--tls-ca": opts.tls_ca},
                  {"--json": json_path})
    setup(opts)
    res = ops_fleet.join(address, opts, progress=ProgressLine(not quiet(json_path)))
    finish(json_path, res, _join_summary)


def _serve_summary(json_path, res) -> None:
    for note in res.notes:
        say(json_path, f"note      {note}")
    say(json_path, f"rounds    {res.rounds_completed} of {res.rounds_requested} (codec {res.codec}"
                   + (f", resumed after round {res.resumed_after}" if res.resumed_after else "") + ")")
    if res.rounds_without_update:
        say(json_path, f"stale     round(s) {', '.join(map(str, res.rounds_without_update))}: no update accepted, "
                       "global weights unchanged")
    if res.final_accuracy is not None:
        say(json_path, f"accuracy  held-out top-1 {res.initial_accuracy:.4f} -> {res.final_accuracy:.4f}")
    red = f" ({res.uplink_reduction:.2f}x fewer than float32)" if res.uplink_reduction else ""
    say(json_path, f"bytes     {res.bytes_up} up{red}, {res.bytes_down} down")
    say(json_path, f"report    {res.report}")


def _join_summary(json_path, res) -> None:
    say(json_path, f"device    {res.name}: trained {res.rounds_trained} round(s), last round {res.last_round}")
    if res.final_accuracy is not None:
        say(json_path, f"accuracy  the coordinator's held-out top-1 {res.final_accuracy:.4f}")
