"""What the coordinator does with a round, as objects in Flower's Strategy shape: how the updates are folded
into the global arrays (one class per averaging algorithm: ``FedAvg``, with FedAvgM's server momentum, and
``Scaffold``) and what goes down to the devices (one class per downlink: ``WholeDownlink`` sends the float32
arrays, ``DeltaDownlink`` a compact delta against what each device holds). Each keeps its own state between rounds
and saves it beside the global arrays (RUNDIR/NAME-NNNN.npz), so a resumed coordinator rebuilds it from RUNDIR.
``coordinator.run`` holds one of each, built from the serve spec by ``strategy_for`` and ``downlink_for``.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .codec import (CONTROL_STEP, DENSITY, DOWNLINK_WHERE, MIN_KEEP, arrays_digest, derived_control,
                    downlink_delta)
from .local import same_start, start_digests
from .store import (CONTROL, CONTROL_PREFIX, HELD_PREFIX, MOMENTUM_PREFIX, ServeSpec, global_path, load_global,
                    save_global)


def average(deltas: list[tuple[dict, int]]) -> dict:
    """The updates' mean weighted by their sample counts (SCAFFOLD's control deltas left out)."""
    total = float(sum(n for _, n in deltas))
    keys = [k for k in deltas[0][0] if not k.startswith(CONTROL)]
    return {k: sum(d[k] * (n / total) for d, n in deltas).astype(np.float32) for k in keys}


class FedAvg:
    """The updates' weighted mean added to the global arrays. With ``beta`` > 0 (FedAvgM) the global step is
    that mean plus ``beta`` times the last step, on the arrays a gradient trains; BatchNorm's running
    statistics take the mean as it is (a variance must stay positive)."""

    name = "fedavg"

    def __init__(self, rundir: Path, completed: int, arrays: dict, statistics, beta: float):
        self.statistics = set(statistics)
        self.beta = beta
        trained = [k for k in arrays if k not in self.statistics]
        saved = beta and completed and global_path(rundir, completed, MOMENTUM_PREFIX).exists()
        self.step = (load_global(rundir, completed, MOMENTUM_PREFIX) if saved
                     else {k: np.zeros_like(arrays[k]) for k in trained} if beta else {})

    def target(self, arrays: dict) -> dict:
        """What the devices are sent to start the round from."""
        return dict(arrays)

    def expected(self, arrays: dict) -> dict:
        """The arrays a device's update must match, name for name and shape for shape."""
        return arrays

    def complete(self, delta: dict, metrics: dict, sent: dict) -> str | None:
        """Fill in what the device did not send (nothing here); why its update is refused, or None."""
        return None

    def fold(self, arrays: dict, updates: list[tuple[dict, int]], available: int, round_no: int) -> dict:
        """The new global arrays from ``updates`` (delta, weight) in their fixed order."""
        avg = average(updates)
        if self.beta:
            self.step = {k: (np.float32(self.beta) * self.step[k] + avg[k]).astype(np.float32) for k in self.step}
            avg = {**avg, **self.step}
        arrays = {k: (arrays[k] + avg[k]).astype(np.float32) for k in arrays}
        # a running variance stays >= 0 (BatchNorm adds its epsilon): with ternary the statistics travel as
        # int8 deltas, whose rounding could take a variance near zero a hair below it
        arrays.update({k: np.maximum(arrays[k], np.float32(0)) for k in self.statistics
                       if "var" in k.rsplit("_", 1)[-1]})
        if not all(np.all(np.isfinite(v)) for v in arrays.values()):  # cannot happen with bounded updates
            raise RuntimeError(f"round {round_no}: the averaged global arrays are not finite")
        return arrays

    def save(self, rundir: Path, round_no: int) -> None:
        if self.beta:
            save_global(rundir, round_no, self.step, MOMENTUM_PREFIX)


class Scaffold(FedAvg):
    """FedAvg with SCAFFOLD's drift correction: a control variate per array a gradient trains travels beside the
    weights (under CONTROL), each device returns its control delta, and the global control moves by the
    reporting devices' share of their mean. With ``derived`` (the ternary codec) no control delta travels up:
    this side derives each device's from its decoded weight delta and control scale, as the device did."""

    name = "scaffold"

    def __init__(self, rundir: Path, completed: int, arrays: dict, statistics, beta: float,
                 derived: bool = False, control_step: float = CONTROL_STEP):
        super().__init__(rundir, completed, arrays, statistics, beta)
        self.derived, self.control_step = derived, control_step
        self.control = (load_global(rundir, completed, CONTROL_PREFIX) if completed
                        else {k: np.zeros_like(v) for k, v in arrays.items() if k not in self.statistics})

    def target(self, arrays: dict) -> dict:
        return {**arrays, **{CONTROL + k: v for k, v in self.control.items()}}

    def expected(self, arrays: dict) -> dict:
        return arrays if self.derived else {**arrays, **{CONTROL + k: arrays[k] for k in self.control}}

    def complete(self, delta: dict, metrics: dict, sent: dict) -> str | None:
        if not self.derived:
            return None
        scale, why = control_scale(metrics.get("control-scale"))
        if scale is not None:
            c_sent = {k: sent[CONTROL + k] for k in self.control}
            delta.update({CONTROL + k: v for k, v in derived_control(c_sent, delta, scale, self.control_step).items()})
        return why

    def fold(self, arrays: dict, updates: list[tuple[dict, int]], available: int, round_no: int) -> dict:
        arrays = super().fold(arrays, updates, available, round_no)
        # c += (|S| / N) * mean(delta c_i): a device that did not report keeps its share
        share = len(updates) / max(available, len(updates))
        self.control = {k: (self.control[k] + share * np.mean([d[CONTROL + k] for d, _ in updates], axis=0))
                        .astype(np.float32) for k in self.control}
        return arrays

    def save(self, rundir: Path, round_no: int) -> None:
        super().save(rundir, round_no)
        save_global(rundir, round_no, self.control, CONTROL_PREFIX)


def control_scale(value) -> tuple[float | None, str | None]:
    """A device's control scale (ternary: the displacement per unit gradient its control delta is derived with),
    or why it is refused."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None, f"its control scale {value!r} is not a number"
    if not (np.isfinite(v) and 0 < v <= float(np.finfo(np.float32).max) and np.float32(v) > 0):  # no overflow in the cast
        return None, f"its control scale {value!r} is not a positive finite float32"
    return v, None


def strategy_for(spec: ServeSpec, completed: int, arrays: dict, statistics) -> FedAvg:
    rundir, beta = Path(spec.rundir), float(spec.server_momentum or 0.0)
    if spec.aggregate == "scaffold":
        return Scaffold(rundir, completed, arrays, statistics, beta, derived=spec.codec == "ternary",
                        control_step=float(spec.ternary_control_step or CONTROL_STEP))
    return FedAvg(rundir, completed, arrays, statistics, beta)


class WholeDownlink:
    """Every device gets the round's arrays whole, in float32 (the fp32, int8 and 2bit codecs: those compress
    the uplink only)."""

    def __init__(self, spec: ServeSpec):
        self.codec = spec.codec

    def config(self) -> dict:
        """The codec's part of the round's configuration."""
        return {}

    def prepare(self, target: dict, statistics, wire) -> None:
        """The round's downlink of ``target``."""
        self.target, self.whole = target, wire.weights_record(target)
        self.digest = arrays_digest(target)

    def message(self, key: str, devices: dict, start: dict | None) -> tuple[object, dict]:
        """The record and the config entries for device ``key``, whose hello said its initial arrays come from
        ``start`` (local.start_digests)."""
        return self.whole, {}

    def received(self, key: str) -> tuple[dict, str]:
        """What device ``key`` was sent to train from (as it reconstructs it) and its digest."""
        return self.target, self.digest

    def account(self, record, chosen: list, wire) -> None:
        """The round's downlink bytes, in its record (a coordinator.RoundRecord)."""
        record.bytes_down = record.bytes_down_fp32 = wire.record_bytes(self.whole) * len(chosen)

    def after(self, entry: dict, answered: bool, round_no: int, why: str | None) -> None:
        """What a device asked in round ``round_no`` holds now (nothing to remember here); ``why``: why it has no
        update this round, or None."""

    def save(self, rundir: Path, round_no: int, state: dict) -> None:
        """Nothing kept between rounds."""

    def prune(self, state: dict) -> Iterator[Path]:
        """Delete what no device's next message nor a resume from ``state`` (written) can need, yielding each file
        deleted (nothing here)."""
        return iter(())


class DeltaDownlink(WholeDownlink):
    """The ternary codec's downlink, per device: the round's arrays as a delta against what that device reconstructed last,
    as int8 deltas or sized to ``--downlink-ratio`` times fewer bytes than float32 (codec.downlink_delta), with
    error feedback per device (what a message drops is in that device's next delta). A device's base is the round
    named by ``held`` in its entry of the state (0, or no entry: the model's initial arrays, which the device
    computes itself, when its hello says they come from the coordinator's model and --params: else whole; -1:
    unknown); what each device asked reconstructs is saved by device key (RUNDIR/held-NNNN.npz)
    as its next base; a round's file is deleted once no device holds it and a newer one is saved (``prune``). A
    device whose base is unknown (it could not rebuild the arrays it was last sent, or a run begun before the
    per-device downlink) gets the arrays whole (float32). One that did not answer otherwise holds its base still,
    as the last arrays it rebuilt or as the base of those (client.received keeps both)."""

    def __init__(self, spec: ServeSpec, state: dict):
        super().__init__(spec)
        self.rundir, self.ratio = Path(spec.rundir), float(spec.downlink_ratio or 0.0)
        self.settings = {"density": float(spec.ternary_density or DENSITY),
                         "control-step": float(spec.ternary_control_step or CONTROL_STEP),
                         "min-keep": int(spec.ternary_min_keep or MIN_KEEP),
                         # a run begun before the codec sized itself keeps its fixed density on --resume
                         "uplink-ratio": float(spec.uplink_ratio or 0.0)}
        self.start = start_digests(spec.model, spec.params)

    def config(self) -> dict:
        return dict(self.settings)

    def prepare(self, target: dict, statistics, wire) -> None:
        self.wire, self.target, self.statistics = wire, target, set(statistics)
        self.fp32 = wire.weights_record(target)
        self.given: dict[str, tuple[object, dict]] = {}
        self.sent: dict[str, tuple[dict, str]] = {}

    def base(self, key: str, version: int) -> dict | None:
        """What device ``key`` reconstructed in round ``version`` (0: the initial arrays), or None: unknown."""
        if version == 0:
            return load_global(self.rundir, 0)
        path = global_path(self.rundir, version, HELD_PREFIX)
        if version < 0 or not path.exists():
            return None
        # (only this device's arrays are read: the file holds every device's)
        mine = {k.partition("|")[2]: v for k, v in load_global(self.rundir, version, HELD_PREFIX,
                                                                keep=lambda k: k.partition("|")[0] == key).items()}
        return mine or None

    def message(self, key: str, devices: dict, start: dict | None) -> tuple[object, dict]:
        version = int(devices.get(key, {}).get("held", 0))
        # a device never asked starts from the initial arrays only if they are built from what the coordinator's are
        held = self.base(key, version) if version or same_start(start, self.start) else None
        got: tuple[object, dict]
        if held is None:  # its base is unknown: the arrays whole
            sent, got = self.target, (self.fp32, {"down": "whole"})
        else:
            enc, sent = downlink_delta(self.target, held, self.statistics, self.ratio)
            got = self.wire.to_record(enc), {"down": "delta", "base": version, "base-digest": arrays_digest(held)}
        self.sent[key] = sent, arrays_digest(sent)
        got[1]["target-digest"] = self.sent[key][1]
        self.given[key] = got
        return got

    def received(self, key: str) -> tuple[dict, str]:
        return self.sent[key]

    def account(self, record, chosen: list, wire) -> None:
        record.bytes_down = sum(wire.record_bytes(self.given[d.key][0]) for d in chosen)
        record.bytes_down_fp32 = wire.record_bytes(self.fp32) * len(chosen)
        record.downlink_whole = [d.name for d in chosen if self.given[d.key][1]["down"] == "whole"]

    def after(self, entry: dict, answered: bool, round_no: int, why: str | None) -> None:
        if answered:
            entry["held"] = round_no
        elif DOWNLINK_WHERE in (why or ""):  # it could not rebuild the arrays: whole next time
            entry["held"] = -1
        # else (no answer, another failure) it holds its base still: as the last arrays it rebuilt, or as theirs

    def save(self, rundir: Path, round_no: int, state: dict) -> None:
        save_global(rundir, round_no, {f"{key}|{k}": v for key, (sent, _) in self.sent.items()
                                       for k, v in sent.items()}, HELD_PREFIX)

    def prune(self, state: dict) -> Iterator[Path]:
        """Delete the held files of the rounds no device holds and that are not the newest: called once ``state`` is
        written, which names no other base, so a kill between two deletions (or before them) leaves files the state
        does not need, deleted after a later round; RUNDIR keeps at most one held file per device, plus the newest."""
        keep = {int(e.get("held", 0)) for e in state.get("devices", {}).values()} | {int(state["completed"])}
        for path in sorted(self.rundir.glob(f"{HELD_PREFIX}-*.npz")):
            number = path.name[len(HELD_PREFIX) + 1:-len(".npz")]
            if number.isdigit() and int(number) not in keep:
                path.unlink(missing_ok=True)
                yield path


def downlink_for(spec: ServeSpec, state: dict) -> WholeDownlink:
    return DeltaDownlink(spec, state) if spec.codec == "ternary" else WholeDownlink(spec)
