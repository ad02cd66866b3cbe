"""Power measured on the board itself: sensor sources, a sampling thread and trapezoid integration (an
external meter's log is ``meterlog``).

Sources, the first one found wins (``detect``):

- ``pi5-pmic``: the Raspberry Pi 5's PMIC through ``vcgencmd pmic_read_adc``. It prints one line per
  ADC channel, currents then voltages, e.g. ``VDD_CORE_A current(7)=0.75012000A`` and
  ``VDD_CORE_V volt(15)=0.72670500V``. The number in brackets is the ADC channel, not the rail, so a
  rail's current and voltage are paired by name (``VDD_CORE``). The total is the sum of V x A over the
  paired rails: what the PMIC delivers to the SoC, memory and I/O. ``EXT5V_V`` (the 5 V input) and
  ``BATT_V`` have no current line, so the input power, the PMIC's conversion losses and USB
  peripherals are not in the figure; an inline USB meter (``--power-log``) measures those.
- ``jetson-ina3221``: the Jetson Nano's INA3221 monitors. Older L4T kernels: ``ina3221x`` with
  ``iio:device*/rail_name_N`` and ``in_powerN_input`` (mW) or ``in_voltageN_input`` (mV) x
  ``in_currentN_input`` (mA); newer kernels: ``ina3221`` with ``hwmon/hwmon*/inN_label``, ``inN_input``
  (mV) and ``currN_input`` (mA), channels 1-3 only (``in7`` is the sum of the shunt voltages, ``curr4``
  the sum of the currents). The same discovery as Zeus (ml-energy/zeus, zeus/device/soc/jetson.py) and
  jetson_stats (jtop/core/power.py). The total is the board input rail (``POM_5V_IN`` / ``VDD_IN``); the
  CPU, GPU and SoC rails are parts of it, reported beside it and not added. A board without one (AGX
  Orin) sums its rails.
- ``hwmon``: any Linux hwmon chip with ``energyN_input`` (µJ counters: amd_energy, ina238's INA237/INA780/
  SQ52206, some PSU and ACPI drivers), ``powerN_input`` (µW), or ``inN_input`` (mV) and ``currN_input``
  (mA) that share a label (the hwmon ABI does not tie their indices; the ina3221 driver's channels 1-3
  are the one documented exception). A chip with an input channel (labelled ``power total``, ``pin``,
  ``*_IN``) counts that one and shows the rest as its parts; otherwise its channels are summed. Chips of
  one name are told apart by their hwmon folder. A chip with energy counters is read through them, not its
  power files (the same channels): the counter holds everything between two reads, where a power file is
  one instant of it, so a spike between samples is not lost. Each sample is the counter's increase over the
  time since the previous read (µJ / s); a counter that steps back has wrapped at 2^32 µJ (a 32-bit
  register, or a 32-bit kernel's ``long``, which also prints values past 2^31 as negative) when that gives a
  believable power, and was reset otherwise (that read counts as a read error and the counter starts anew).

Detection reads each channel up to ``DETECT_TRIES`` times: a failed read (a busy i2c bus) is retried,
never a reason to fall through to another reader; a channel that never reads is dropped and named,
except an input rail, which stays (its reads fail and are counted) so that its parts never pass for it.

Every root is injectable: ``sysfs_root`` (default ``$EDGETRAIN_SYSFS_ROOT`` or ``/sys``) and the
``vcgencmd`` program (``$EDGETRAIN_VCGENCMD``, else ``vcgencmd`` on PATH), so tests run on generated
sensor trees and a fake ``vcgencmd``; ``EDGETRAIN_POWER=off`` turns every source off. RAPL (the x86
CPU package counter) stays in ``model``: it is an energy counter, read at the ends of a window, not
sampled.

A measurement (``PowerMeter``) samples the idle board first (the process sleeping), then the work, in
one sampling thread at the source's stated rate; energy is the trapezoid over the samples' timestamps,
clipped to the window by linear interpolation, and "above idle" subtracts the idle average over the
same duration. Timestamps are wall-clock (``time.time()``) so an external meter's log can be aligned to
the same window afterwards.
"""
from __future__ import annotations

import functools
import math
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .. import envvars
from . import uncertainty

ENV_SYSFS = "EDGETRAIN_SYSFS_ROOT"
ENV_VCGENCMD = "EDGETRAIN_VCGENCMD"
DEFAULT_RATE_HZ = 20.0  # sysfs reads cost microseconds
PMIC_RATE_HZ = 10.0  # each read forks vcgencmd (a few ms on a Pi 5): keep its own cost small
DEFAULT_IDLE_S = 1.0
SAMPLER_GOAL_PCT = 1.0  # the sampling thread should cost under 1% of one core at its default rate
# The energy window must hold this many sample periods, so the trapezoid is not mostly interpolation.
MIN_WINDOW_PERIODS = 10
# USB meters log at 1-10 Hz: with --power-log the window is at least this long.
POWER_LOG_MIN_WINDOW_S = 10.0

_PMIC_LINE = re.compile(r"^\s*(\S+)_([AV])\s+(current|volt)\(\d+\)\s*=\s*([-+0-9.eE]+|nan)\s*([AV])\s*$",
                        re.IGNORECASE)


@dataclass
class Reading:
    """One instant: the total watts the source covers and each rail's watts."""

    total_w: float
    rails: dict[str, float]


class Source:
    name = "source"
    rate_hz = DEFAULT_RATE_HZ
    covers = ""

    def read(self) -> Reading:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.name}: {self.covers}"

    def label(self) -> str:
        return self.name

    def close(self) -> None:
        """Let go of what reading holds open (a sysfs source's descriptors); a later read opens them again."""

    def resolution(self) -> tuple[float | None, str]:
        """(the step of the total's reading in watts, or None where not known; where it comes from)."""
        return None, "not published for this source"


# --- Raspberry Pi 5 PMIC ------------------------------------------------------------------------------

def parse_pmic(text: str) -> dict[str, float]:
    """``vcgencmd pmic_read_adc`` output -> {rail: watts} for the rails with both a current and a voltage."""
    amps: dict[str, float] = {}
    volts: dict[str, float] = {}
    for line in text.splitlines():
        m = _PMIC_LINE.match(line)
        if not m:
            continue
        rail, suffix, kind, value, unit = m.groups()
        try:
            v = float(value)
        except ValueError:
            continue
        if not math.isfinite(v):
            continue
        if kind.lower() == "current" and unit.upper() == "A":
            amps[rail] = v
        elif kind.lower() == "volt" and unit.upper() == "V":
            volts[rail] = v
    return {rail: amps[rail] * volts[rail] for rail in sorted(amps) if rail in volts}


class Pi5Pmic(Source):
    name = "pi5-pmic"
    rate_hz = PMIC_RATE_HZ
    covers = ("Raspberry Pi 5 PMIC rails (vcgencmd pmic_read_adc), sum of V x A over the rails paired by name; "
              "the 5 V input, PMIC conversion losses and USB peripherals are not included")

    def __init__(self, program: str):
        self.program = program

    def _output(self) -> str:
        proc = subprocess.run([self.program, "pmic_read_adc"], capture_output=True, text=True, timeout=5)
        if proc.returncode != 0:
            raise OSError(f"vcgencmd pmic_read_adc failed with exit code {proc.returncode}")
        return proc.stdout

    def resolution(self) -> tuple[float | None, str]:
        return None, ("the PMIC's ADC resolution is not published; vcgencmd prints 8 decimals, finer than the "
                      "converter")

    def read(self) -> Reading:
        rails = parse_pmic(self._output())
        if not rails:
            raise OSError("vcgencmd pmic_read_adc printed no rail with both a current and a voltage")
        return Reading(sum(rails.values()), rails)

    @classmethod
    def find(cls, program: str | None = None) -> "Pi5Pmic | None":
        program = program or envvars.get(ENV_VCGENCMD) or shutil.which("vcgencmd")
        if not program:
            return None
        src = cls(program)
        for attempt in range(DETECT_TRIES):  # one failed read (the firmware busy) is not "no PMIC"
            try:
                src.read()
                return src
            except (OSError, subprocess.SubprocessError):
                if attempt + 1 < DETECT_TRIES:
                    time.sleep(DETECT_RETRY_S)
        return None  # not a Pi 5 (older firmware: "Command not registered"), or no access


# --- sysfs readers ------------------------------------------------------------------------------------

# A sensor read can fail once (a busy i2c bus): detection tries each channel this many times before it
# drops the channel (a channel the driver has disabled fails every time), never switching readers for it.
DETECT_TRIES = 3
DETECT_RETRY_S = 0.05
# Labels that name a chip's (or a board's) input: the figure the other channels are parts of. PSU drivers
# ("power total", corsair-psu), PMBus ("pin"), Jetson's board input (VDD_IN, POM_5V_IN).
# amd_energy (Documentation/hwmon/amd_energy.rst): EsocketX counts a socket, EcoreXXX each core inside it.
_SOCKET_LABEL = re.compile(r"^Esocket\d+$")
_INPUT_LABEL = re.compile(r"^(pin\d*|.*\btotal\b.*|input|.*_in)$", re.IGNORECASE)
# Drivers whose inN and currN of the same index are one channel, and which indices (the mainline ina3221
# driver: in1-3 bus mV with curr1-3 mA; in4-6 are shunt µV, in7 their sum and curr4 the sum of currents).
_VI_CHANNELS = {"ina3221": (1, 2, 3)}


def _num(path: Path) -> float:
    return float(path.read_text().strip())


# The ADC steps of the current monitors that sit on boards (TI datasheets): shunt voltage LSB and bus voltage
# LSB, in volts. INA3221 (SBOS576): 40 µV and 8 mV; INA219 (SBOS448): 10 µV and 4 mV; INA226 (SBOS547):
# 2.5 µV and 1.25 mV. A current step is the shunt step over the shunt resistor, which the mainline drivers
# expose in µΩ (ina3221: shuntN_resistor; ina2xx: shunt_resistor; Documentation/hwmon/ina3221.rst, ina2xx.rst).
INA_ADC = {"ina3221": (40e-6, 8e-3, "TI INA3221 datasheet: shunt 40 µV, bus 8 mV"),
           "ina219": (10e-6, 4e-3, "TI INA219 datasheet: shunt 10 µV, bus 4 mV"),
           "ina226": (2.5e-6, 1.25e-3, "TI INA226 datasheet: shunt 2.5 µV, bus 1.25 mV")}


# An energy counter's wrap: 2^32 µJ (about 4295 J). A step back that, unwrapped, would mean more than this
# many watts since the previous read is a reset (driver reloaded, register cleared), not a wrap.
COUNTER_WRAP_UJ = 2 ** 32
COUNTER_MAX_W = 10_000.0
_ENERGY_PRIME_S = 0.02  # the first read of a counter: two reads this far apart give its first power


class _Channel:
    """One rail: power read directly (``scale`` W per unit), as voltage x current (mV x mA), or as the
    increase of an energy counter (µJ) over the time between two reads."""

    def __init__(self, name: str, power: Path | None = None, volt: Path | None = None, curr: Path | None = None,
                 power_scale: float = 1e-3, vi_scale: float = 1e-6, group: str = "", role: str = "part",
                 chip: str = "", shunt: Path | None = None, energy: Path | None = None):
        self.name, self.power, self.volt, self.curr, self.energy = name, power, volt, curr, energy
        self._last: tuple[float, int] | None = None  # (monotonic s, counter µJ) of the previous read
        self._interval = 1.0 / DEFAULT_RATE_HZ
        self.power_scale, self.vi_scale = power_scale, vi_scale
        self.group, self.role = group, role  # role 'input': the group's figure; 'part': a share of it
        self.chip, self.shunt = chip, shunt  # for the resolution: the chip's ADC steps and its shunt resistor file

    def resolution(self) -> tuple[float, str]:
        """The step of this channel's watts: the file's unit, or the chip's ADC step where coarser."""
        if self.energy is not None:
            step = 1e-6 / self._interval
            return step, f"{self.energy.name}: 1 µJ over {self._interval * 1000:.3g} ms between reads = {step:.3g} W"
        if self.power is not None:
            return self.power_scale, f"{self.power.name} in steps of {_unit(self.power_scale)}"
        v, i = _num(self.volt) * 1e-3, _num(self.curr) * 1e-3  # mV, mA (hwmon ABI; the iio layout's units too)
        dv, di, how = 1e-3, 1e-3, "1 mV x 1 mA file units"
        adc = INA_ADC.get(self.chip)
        if adc is not None:
            ohm = _shunt_ohm(self.shunt)
            if ohm:
                dv, di = max(dv, adc[1]), max(di, adc[0] / ohm)
                how = f"{adc[2]}, shunt {ohm * 1000:g} mΩ ({self.shunt.name}): {dv * 1000:g} mV, {di * 1000:.3g} mA"
        return abs(v) * di + abs(i) * dv, f"V x I at {v:.3g} V, {i:.3g} A in steps of {how}"

    def watts(self) -> float:
        if self.energy is not None:
            return self._counter_watts()
        if self.power is not None:
            return self._read(self.power) * self.power_scale
        return self._read(self.volt) * self._read(self.curr) * self.vi_scale  # mV x mA = µW

    def _counter(self) -> tuple[float, int]:
        value = int(self._read(self.energy))
        return time.monotonic(), value + COUNTER_WRAP_UJ if value < 0 else value  # a 32-bit long printed signed

    def _counter_watts(self) -> float:
        """The average power since the previous read: the counter's increase over the time between."""
        if self._last is None:
            self._last = self._counter()
            time.sleep(_ENERGY_PRIME_S)
        (t0, e0), (t1, e1) = self._last, self._counter()
        self._last = (t1, e1)
        dt = t1 - t0
        if dt <= 0:
            raise ValueError("no time between two reads of an energy counter")
        delta = e1 - e0
        if delta < 0:
            delta += COUNTER_WRAP_UJ
            if e0 >= COUNTER_WRAP_UJ or delta * 1e-6 / dt > COUNTER_MAX_W:
                raise ValueError(f"{self.energy.name} went back from {e0} to {e1} µJ: reset, not wrapped")
        self._interval = dt
        return delta * 1e-6 / dt

    def _read(self, path: Path) -> float:
        """The file's number, read with pread on a descriptor kept open: a sysfs attribute read at offset 0 is
        generated afresh, and open+read+close at every sample was most of the sampler's CPU time."""
        fds = self.__dict__.setdefault("_fds", {})
        fd = fds.get(path)
        if fd is None:
            fd = fds[path] = os.open(path, os.O_RDONLY)
        try:
            data = os.pread(fd, 64, 0)
        except OSError:
            os.close(fds.pop(path))  # the driver went away or was reloaded: open it again next time
            raise
        return float(data.strip())

    def close(self) -> None:
        for fd in self.__dict__.pop("_fds", {}).values():
            os.close(fd)

    def files(self) -> str:
        if self.energy is not None:
            return f"{self.energy.name} counter"
        return self.power.name if self.power is not None else f"{self.volt.name} x {self.curr.name}"


def _unit(scale: float) -> str:
    return {1e-6: "1 µW", 1e-3: "1 mW"}.get(scale, f"{scale:g} W")


def _shunt_ohm(path: Path | None) -> float | None:
    t = _text(path) if path is not None else None
    try:
        return float(t) * 1e-6 if t and float(t) > 0 else None  # µΩ
    except ValueError:
        return None


def _readable(channels: list[_Channel], tries: int = DETECT_TRIES) -> tuple[list[_Channel], list[str]]:
    """The channels that read at least once in ``tries`` attempts (and the input rails, read or not), and a
    note for each channel that never read."""
    pending, ok = list(channels), []
    errors: dict[str, str] = {}
    for attempt in range(tries):
        still = []
        for c in pending:
            try:
                c.watts()
                ok.append(c)
            except (OSError, ValueError) as exc:
                errors[c.name] = type(exc).__name__ if not isinstance(exc, OSError) else (exc.strerror or str(exc))
                still.append(c)
        pending = still
        if not pending:
            break
        if attempt + 1 < tries:
            time.sleep(DETECT_RETRY_S)
    # An input rail that never read stays: without it the sum of its parts would pass for the board's
    # figure. Its reads keep failing, and the measurement says so (read errors, no samples).
    kept = [c for c in channels if c in ok or c.role == "input"]
    return kept, [f"{c.name} ({c.files()}: {errors[c.name]} on {tries} tries)" for c in pending]


class _SysfsSource(Source):
    """Channels in groups (a chip, or a board's monitors): a group with an input channel counts the input
    and shows the others as its parts; a group without one counts the sum of its channels."""

    def __init__(self, channels: list[_Channel], where: str, skipped: list[str] | None = None):
        self.channels = channels
        self.where = where
        self.skipped = skipped or []

    @functools.cached_property
    def inputs(self) -> list[str]:
        """The rails whose sum is the total (the others are parts of them); worked out once, not per sample."""
        groups: dict[str, list[_Channel]] = {}
        for c in self.channels:
            groups.setdefault(c.group, []).append(c)
        out = []
        for chans in groups.values():
            ins = [c for c in chans if c.role == "input"]
            out += [c.name for c in (ins or chans)]
        return out

    def read(self) -> Reading:
        rails = {c.name: c.watts() for c in self.channels}
        return Reading(sum(rails[n] for n in self.inputs), rails)

    def close(self) -> None:
        for c in self.channels:
            c.close()

    def label(self) -> str:
        """The source and its chips, for a one-line figure ('hwmon ina3221')."""
        chips = list(dict.fromkeys(c.group.split("@")[0] for c in self.channels if c.name in self.inputs and c.group
                                   and c.group != "board"))
        return " ".join([self.name] + chips)

    def resolution(self) -> tuple[float | None, str]:
        """The counted rails' steps, added (each reading rounds on its own)."""
        total, hows = 0.0, []
        for c in self.channels:
            if c.name in self.inputs:
                try:
                    q, how = c.resolution()
                except (OSError, ValueError):
                    return None, f"{c.name} did not read"
                total += q
                hows.append(f"{c.name}: {how}")
        return total, "; ".join(hows)

    def _rails_text(self) -> str:
        inputs = set(self.inputs)
        counted = [f"{c.name} ({c.files()})" for c in self.channels if c.name in inputs]
        parts = [f"{c.name} ({c.files()})" for c in self.channels if c.name not in inputs]
        text = "total = " + " + ".join(counted)
        if parts:
            text += "; parts of it, shown beside it and not added: " + ", ".join(parts)
        if self.skipped:
            text += "; not read: " + ", ".join(self.skipped)
        return text


def sysfs_root(root=None) -> Path:
    return Path(root or envvars.get(ENV_SYSFS) or "/sys")


class JetsonIna3221(_SysfsSource):
    name = "jetson-ina3221"
    rate_hz = DEFAULT_RATE_HZ

    @property
    def covers(self) -> str:
        return f"Jetson INA3221 power monitors under {self.where}: " + self._rails_text()

    @property
    def total(self) -> str | None:
        """The board input rail, where the board has one."""
        ins = [c.name for c in self.channels if c.role == "input"]
        return ins[0] if ins else None

    @classmethod
    def find(cls, root=None) -> "JetsonIna3221 | None":
        base = sysfs_root(root) / "bus" / "i2c" / "drivers"
        channels: list[_Channel] = []
        where = None
        for driver in ("ina3221x", "ina3221"):
            for dev in sorted((base / driver).glob("*")):
                # iio layout (L4T 32): iio:device*/rail_name_N, in_powerN_input mW
                for d in sorted(dev.glob("iio:device*")) + [dev]:
                    for label in sorted(d.glob("rail_name_*")):
                        idx = label.name.rsplit("_", 1)[-1]
                        ch = _rail(label.read_text().strip(), d / f"in_power{idx}_input",
                                   d / f"in_voltage{idx}_input", d / f"in_current{idx}_input")
                        if ch:
                            channels.append(ch)
                            where = where or str(d)
                # hwmon layout (newer kernels): hwmon/hwmon*/inN_label, inN_input mV, currN_input mA; in7 is the
                # sum of the shunt voltages (no curr7), curr4 the sum of the currents: neither is a rail.
                for d in sorted(dev.glob("hwmon/hwmon*")) + sorted(dev.glob("hwmon*")):
                    for label in sorted(d.glob("in*_label")):
                        idx = label.name[2:].split("_", 1)[0]
                        if idx not in ("1", "2", "3"):
                            continue
                        ch = _rail(label.read_text().strip(), d / f"power{idx}_input", d / f"in{idx}_input",
                                   d / f"curr{idx}_input", power_scale=1e-6, chip="ina3221",
                                   shunt=d / f"shunt{idx}_resistor")
                        if ch:
                            channels.append(ch)
                            where = where or str(d)
        if not channels:
            return None
        # One board: its input rail is the board's figure; the CPU, GPU and SoC rails are parts of it
        # (NVIDIA: "POM_5V_IN measures the overall 5V input to the board", jetson_stats issue #51).
        for c in channels:
            c.group = "board"
            c.role = "input" if c.name.upper() in ("VDD_IN", "POM_5V_IN") or c.name.upper().endswith("_IN") else "part"
        kept, skipped = _readable(channels)
        if not kept:
            return None  # every channel failed every try: nothing here measures
        return cls(kept, where, skipped)


def _rail(name: str, power: Path, volt: Path, curr: Path, power_scale: float = 1e-3, chip: str = "",
          shunt: Path | None = None) -> _Channel | None:
    if not name or name.lower() in ("nc", "not connected"):
        return None
    # exists(), not is_file(): a file the driver cannot read right now is still the rail's (it is retried)
    if power.exists():
        return _Channel(name, power=power, power_scale=power_scale)
    if volt.exists() and curr.exists():
        return _Channel(name, volt=volt, curr=curr, chip=chip, shunt=shunt)
    return None


class Hwmon(_SysfsSource):
    name = "hwmon"
    rate_hz = DEFAULT_RATE_HZ

    @property
    def covers(self) -> str:
        return "Linux hwmon sensors: " + self._rails_text()

    @classmethod
    def find(cls, root=None) -> "Hwmon | None":
        dirs = [(d, _text(d / "name") or d.name) for d in sorted((sysfs_root(root) / "class" / "hwmon").glob("hwmon*"))]
        seen: dict[str, int] = {}
        for _, chip in dirs:
            seen[chip] = seen.get(chip, 0) + 1
        channels: list[_Channel] = []
        skipped: list[str] = []
        for d, chip in dirs:
            # Two chips of one name (two INA219s) are two chips: their hwmon folder tells them apart.
            cid = chip if seen[chip] == 1 else f"{chip}@{d.name}"
            chans, notes = _hwmon_channels(d, chip, cid)
            channels += chans
            skipped += notes
        if not channels:
            return None
        kept, failed = _readable(channels)
        if not kept:
            return None
        return cls(kept, str(sysfs_root(root) / "class" / "hwmon"), skipped + failed)


def _hwmon_channels(d: Path, chip: str, cid: str) -> tuple[list[_Channel], list[str]]:
    """One hwmon chip's power channels (hwmon ABI: energyN_input µJ; powerN_input µW; inN_input mV;
    currN_input mA)."""
    out: list[_Channel] = []
    energies = sorted(d.glob("energy*_input"))
    for e in energies:
        idx = e.name[6:].split("_", 1)[0]
        label = _text(d / f"energy{idx}_label")
        out.append(_Channel(f"{cid}/{label or 'energy' + idx}", energy=e, group=cid,
                            role="input" if label and (_INPUT_LABEL.match(label) or _SOCKET_LABEL.match(label))
                            else "part"))
    if energies:
        return out, []  # a chip that counts energy: its power, voltage and current files are the same channels
    powers = sorted(d.glob("power*_input"))
    for p in powers:
        idx = p.name[5:].split("_", 1)[0]
        label = _text(d / f"power{idx}_label")
        out.append(_Channel(f"{cid}/{label or 'power' + idx}", power=p, power_scale=1e-6, group=cid,
                            role="input" if label and _INPUT_LABEL.match(label) else "part"))
    if powers:
        return out, []  # a chip that reports power: its voltages and currents are the same channels
    notes = []
    indices = _VI_CHANNELS.get(chip)
    for c in sorted(d.glob("curr*_input")):
        idx = c.name[4:].split("_", 1)[0]
        label = _text(d / f"curr{idx}_label") or _text(d / f"in{idx}_label")
        if label and label.lower() in ("nc", "not connected"):
            continue
        if indices is not None:
            if not idx.isdigit() or int(idx) not in indices:
                continue  # ina3221 curr4: the sum of the channels, not a rail
            v = d / f"in{idx}_input"
        else:
            # The hwmon ABI does not tie inN to currN: pair them only by a shared label.
            v = next((f for f in sorted(d.glob("in*_input"))
                      if label and _text(d / f.name.replace("_input", "_label")) == label), None)
            if v is None:
                notes.append(f"{cid}/{c.name} (no voltage channel with its label; the hwmon ABI does not pair "
                             f"currN with inN)")
                continue
        if v.exists():
            shunt = d / (f"shunt{idx}_resistor" if chip == "ina3221" else "shunt_resistor")
            out.append(_Channel(f"{cid}/{label or 'in' + idx}", volt=v, curr=c, group=cid,
                                role="input" if label and _INPUT_LABEL.match(label) else "part", chip=chip,
                                shunt=shunt))
    return out, notes


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def detect(root=None, vcgencmd: str | None = None) -> Source | None:
    """The board's power source as its driver reads it (``calibration.detect`` applies a user's calibration),
    or None where nothing on this machine measures power."""
    if envvars.get("EDGETRAIN_POWER") == "off":
        return None
    return Pi5Pmic.find(vcgencmd) or JetsonIna3221.find(root) or Hwmon.find(root)


# --- sampling and integration -------------------------------------------------------------------------

class Sampler:
    """Reads ``source`` in a background thread every 1/rate s; samples are (wall time, total W, rails W)."""

    def __init__(self, source: Source, rate_hz: float | None = None):
        self.source = source
        self.rate_hz = float(rate_hz or source.rate_hz)
        self.samples: list[tuple[float, float, dict]] = []
        self.errors = 0
        self.cpu_s = 0.0  # the sampling thread's own CPU time (time.thread_time), and the wall time it ran
        self.wall_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        t0 = time.time()
        try:
            r = self.source.read()
        except (OSError, ValueError, subprocess.SubprocessError):
            self.errors += 1
            return
        # A read takes time (vcgencmd forks): stamp it at the middle of the read.
        self.samples.append(((t0 + time.time()) / 2, r.total_w, r.rails))

    def _loop(self) -> None:
        c0, w0 = time.thread_time(), time.monotonic()
        period = 1.0 / self.rate_hz
        nxt = time.monotonic() + period
        try:
            while not self._stop.wait(max(0.0, nxt - time.monotonic())):
                self._sample()
                nxt += period
                if nxt < time.monotonic():  # fell behind (a slow read): do not burst to catch up
                    nxt = time.monotonic() + period
        finally:
            # thread_time counts this thread only; a source that forks (vcgencmd) spends more in the child,
            # which is not counted here and is said so in the record
            self.cpu_s, self.wall_s = time.thread_time() - c0, time.monotonic() - w0

    def cost(self) -> dict:
        """The sampling thread's CPU time over its wall time: its share of one core."""
        share = self.cpu_s / self.wall_s if self.wall_s > 0 else None
        forks = isinstance(self.source, Pi5Pmic)
        return {"cpu_s": self.cpu_s, "wall_s": self.wall_s, "rate_hz": self.rate_hz,
                "core_percent": None if share is None else 100.0 * share, "goal_core_percent": SAMPLER_GOAL_PCT,
                "within_goal": None if share is None else 100.0 * share <= SAMPLER_GOAL_PCT,
                "source": ("the sampling thread's time.thread_time() over its wall time"
                           + ("; the vcgencmd child each read forks is not counted" if forks else ""))}

    def start(self) -> "Sampler":
        self._sample()  # a sample at the start, so a window opened now is covered
        self._thread = threading.Thread(target=self._loop, name="edgetrain-power", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, float, dict]]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._sample()  # and one at the end, so a window closed before now is covered
        return self.samples


# Readings a numpy step works on at once: the temporaries of a long log's sums stay a few MB, not the log's size.
CHUNK = 1 << 16


class PowerSeries(Sequence):
    """Power readings as two float64 arrays, ``t`` (Unix s) and ``w`` (W): 16 bytes a reading (an hour-long 4 kHz
    meter export is 230 MB, where (t, w) tuples in a list took 5x that), with each rail's watts (``rails``) when
    the source has rails. It is also the sequence of its (t, w) pairs, for code that wants them."""

    __slots__ = ("t", "w", "rails")

    def __init__(self, t, w, rails: dict | None = None):
        import numpy as np

        self.t = np.asarray(t, dtype=np.float64)
        self.w = np.asarray(w, dtype=np.float64)
        self.rails = rails or {}

    @classmethod
    def of(cls, samples) -> "PowerSeries":
        """A sampler's samples [(t, total W, {rail: W})] (a series is returned as it is)."""
        if isinstance(samples, PowerSeries):
            return samples
        names = samples[0][2] if samples else {}
        return cls([s[0] for s in samples], [s[1] for s in samples],
                   {n: PowerSeries([], [s[2].get(n, 0.0) for s in samples]).w for n in names})

    def __len__(self) -> int:
        return len(self.t)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return PowerSeries(self.t[i], self.w[i], {k: v[i] for k, v in self.rails.items()})
        return float(self.t[i]), float(self.w[i])

    def __iter__(self):
        for a in range(0, len(self.t), CHUNK):
            yield from zip(self.t[a:a + CHUNK].tolist(), self.w[a:a + CHUNK].tolist())

    def __eq__(self, other):
        import numpy as np

        if isinstance(other, PowerSeries):
            return bool(np.array_equal(self.t, other.t) and np.array_equal(self.w, other.w))
        try:
            return len(other) == len(self) and all(a == tuple(b) for a, b in zip(self, other))
        except TypeError:
            return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"PowerSeries({len(self)} readings)"


def integrate(times, watts, t0: float, t1: float) -> dict | None:
    """Joules between t0 and t1: trapezoid over the samples, the ends linearly interpolated.

    None when the samples do not cover [t0, t1] (no sample at or before t0, or at or after t1).
    """
    import numpy as np

    t, w = np.asarray(times, dtype=np.float64), np.asarray(watts, dtype=np.float64)
    if t1 < t0 or len(t) < 2 or t[0] > t0 or t[-1] < t1:
        return None
    lo, hi = int(np.searchsorted(t, t0, "right")), int(np.searchsorted(t, t1, "left"))
    w0, w1 = _interp(t, w, t0), _interp(t, w, t1)
    if hi > lo:
        joules = ((float(t[lo]) - t0) * (w0 + float(w[lo])) / 2 + _trapezoid(t[lo:hi], w[lo:hi])
                  + (t1 - float(t[hi - 1])) * (float(w[hi - 1]) + w1) / 2)
    else:
        joules = (t1 - t0) * (w0 + w1) / 2
    seconds = t1 - t0
    return {"joules": joules, "seconds": seconds, "average_w": joules / seconds if seconds > 0 else w0,
            "samples": int(np.searchsorted(t, t1, "right") - np.searchsorted(t, t0, "left"))}  # inside, ends included


def _trapezoid(t, w) -> float:
    """The trapezoid sum over consecutive readings, a chunk at a time."""
    import numpy as np

    total = 0.0
    for a in range(0, len(t) - 1, CHUNK):
        b = min(a + CHUNK, len(t) - 1)
        total += float(np.sum((t[a + 1:b + 1] - t[a:b]) * (w[a:b] + w[a + 1:b + 1]) / 2))
    return total


def _interp(t, w, x: float) -> float:
    import numpy as np

    i = int(np.searchsorted(t, x, "left"))
    if i < len(t) and t[i] == x:
        return float(w[i])
    ta, tb, wa, wb = float(t[i - 1]), float(t[i]), float(w[i - 1]), float(w[i])
    return wa + (wb - wa) * ((x - ta) / (tb - ta))


def window_energy(samples, t0: float, t1: float) -> dict | None:
    """Total and per-rail energy of sampler ``samples`` (or a ``PowerSeries``) over [t0, t1]."""
    s = PowerSeries.of(samples)
    total = integrate(s.t, s.w, t0, t1)
    if total is None:
        return None
    rails = {}
    for name, watts in s.rails.items():
        r = integrate(s.t, watts, t0, t1)
        if r is not None:
            rails[name] = {"joules": r["joules"], "average_w": r["average_w"]}
    return {**total, "rails": rails}


def _inside(s: PowerSeries, t0: float, t1: float):
    """(index of the first reading, of the last, how many) of the readings timed in [t0, t1], in the order
    taken (a sampler's clock may step back), and their watts' standard deviation (None below two)."""
    import numpy as np

    first = last = None
    count, total, lo, hi = 0, 0.0, math.inf, -math.inf
    for a in range(0, len(s.t), CHUNK):
        tt = s.t[a:a + CHUNK]
        idx = np.flatnonzero((tt >= t0) & (tt <= t1))
        if len(idx):
            first = a + int(idx[0]) if first is None else first
            last = a + int(idx[-1])
            ww = s.w[a:a + CHUNK][idx]
            count, total = count + len(ww), total + float(ww.sum())
            lo, hi = min(lo, float(ww.min())), max(hi, float(ww.max()))
    if count < 2:
        return first, last, count, None
    if lo == hi:
        return first, last, count, 0.0  # one value throughout: exactly no spread
    mean, squares = total / count, 0.0
    for a in range(0, len(s.t), CHUNK):
        tt = s.t[a:a + CHUNK]
        ww = s.w[a:a + CHUNK][(tt >= t0) & (tt <= t1)] - mean
        squares += float(np.dot(ww, ww))
    return first, last, count, math.sqrt(squares / (count - 1))


class PowerMeter:
    """One measurement: the idle board first (``idle()``), then the work between ``begin()`` and ``end()``."""

    def __init__(self, source: Source, rate_hz: float | None = None, idle_s: float = DEFAULT_IDLE_S):
        self.source = source
        self.sampler = Sampler(source, rate_hz)
        self.idle_s = idle_s
        self.idle_window = self.window = None

    @property
    def period_s(self) -> float:
        return 1.0 / self.sampler.rate_hz

    def start(self) -> "PowerMeter":
        self.sampler.start()
        return self

    def idle(self) -> None:
        """Sample the board with this process asleep, so 'above idle' is measured too."""
        if self.idle_s <= 0:
            return
        t0 = time.time()
        time.sleep(self.idle_s)
        self.idle_window = (t0, time.time())

    def begin(self) -> float:
        self._t0 = time.time()
        return self._t0

    def samples_since_begin(self) -> int:
        """Samples taken since ``begin()`` (the sampling thread may run late on a busy host)."""
        return sum(1 for s in list(self.sampler.samples) if s[0] >= self._t0)

    def end(self) -> float:
        self.window = (self._t0, time.time())
        return self.window[1]

    def finish(self) -> dict:
        samples = self.sampler.stop()
        self.source.close()  # the descriptors the sampler kept open
        res = self.source.resolution()
        rec = summarise(samples, self.idle_window, self.window, self.source.name, self.source.describe(),
                        self.sampler.rate_hz, self.sampler.errors, resolution=res)
        rec["sampler"] = self.sampler.cost()
        rec["instrument"] = self.source.label()
        if hasattr(self.source, "record"):  # read through a calibration: say so, and add the fit's error
            cal = rec["calibration"] = self.source.record()
            u = rec.get("uncertainty")
            if u is not None:
                extra = u["seconds"] * cal["standard_error_w"]
                u["components"]["calibration_j"] = extra
                u["plus_minus_j"] = math.sqrt(u["plus_minus_j"] ** 2 + extra ** 2)
                u["relative"] = u["plus_minus_j"] / rec["joules"] if rec.get("joules") else None
                u["source"] += f"; calibration: T x residual/sqrt(points) = {extra:.3g} J"
        inputs = getattr(self.source, "inputs", None)
        if inputs is not None and rec.get("rails"):
            # The figure is the sum of these rails; the other rails are parts of them, shown beside it.
            rec["total_of"] = list(inputs)
            rec["parts"] = [n for n in rec["rails"] if n not in inputs]
        return rec


def summarise(samples, idle_window, window, source: str, detail: str, rate_hz: float | None, errors: int = 0,
              resolution: tuple[float | None, str] = (None, "not known")) -> dict:
    """A measured record from samples (a sampler's, or a log's ``PowerSeries``): the window's energy, the idle
    draw and the energy above it, and the energy's uncertainty (``uncertainty.measured``: the resolution, the
    samples, the sampling interval)."""
    samples = PowerSeries.of(samples)
    out = {"available": False, "provenance": "measured", "source": source, "detail": detail, "rate_hz": rate_hz,
           "read_errors": errors, "samples_total": len(samples)}
    work = window_energy(samples, *window) if window else None
    if work is None:
        out["note"] = f"the {source} samples do not cover the measured window; no measured energy"
        return out
    out.update(available=True, window={"t0": window[0], "t1": window[1], "seconds": work["seconds"],
                                       "samples": work["samples"]},
               joules=work["joules"], average_w=work["average_w"], samples=work["samples"], rails=work["rails"])
    if work["samples"] < 2:
        out["note"] = (f"only {work['samples']} sample(s) inside the {work['seconds']:.3g} s window: the figure is "
                       "mostly interpolated between the neighbouring samples")
    sd = _inside(samples, *window)[3]
    out["power_sd_w"] = sd
    out["resolution_w"], out["resolution_source"] = resolution
    out["uncertainty"] = uncertainty.measured(work["joules"], work["seconds"], work["samples"], sd,
                                              1.0 / rate_hz if rate_hz else None, resolution[0], resolution[1],
                                              source)
    idle = _idle_energy(samples, idle_window) if idle_window else None
    if idle is not None:
        out["idle"] = {"t0": idle_window[0], "t1": idle_window[1], "seconds": idle["seconds"],
                       "samples": idle["samples"], "average_w": idle["average_w"]}
        out["idle_w"] = idle["average_w"]
        out["joules_above_idle"] = work["joules"] - idle["average_w"] * work["seconds"]
    return out


def _idle_energy(samples: PowerSeries, idle_window) -> dict | None:
    """The idle average over the samples inside the idle window only: its ends must not be interpolated
    towards the work's first samples (a step from idle to busy would leak into the idle figure)."""
    first, last, count, _ = _inside(samples, *idle_window)
    if count >= 2:
        out = window_energy(samples, float(samples.t[first]), float(samples.t[last]))
        if out is not None:
            out["samples"] = count
        return out
    return window_energy(samples, *idle_window)


@contextmanager
def measuring(source: Source | None, rate_hz: float | None = None, idle_s: float = DEFAULT_IDLE_S):
    """``with measuring(src) as m: work()`` -> ``m.record`` (None without a source)."""

    class _Box:
        record = None

    box = _Box()
    if source is None:
        yield box
        return
    meter = PowerMeter(source, rate_hz, idle_s).start()
    try:
        meter.idle()
        meter.begin()
        yield box
        meter.end()
    finally:
        if meter.window is None:
            meter.end()
        box.record = meter.finish()
