"""energy: joules per inference, per fine-tune and per day. The model (a device profile's cited power
figures x time, RAPL on an x86 host, the meter that wraps a run) and the board's sensors (Pi 5 PMIC,
Jetson INA3221, hwmon) and an external meter's log (``meterlog``).

``carbon``: grams of CO2e from a grid intensity (the bundled Ember table, or the user's figure).

The face: what other code may use. Its names load on first use, as edgetrain's own do.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _lazy

_FACE = {  # name -> the module of this wing that defines it
    "EnergyMeter": "model", "energy_report": "model", "measured_per_inference": "model", "parse_rate": "model",
    "rapl_delta_j": "model", "rapl_per_inference": "model", "read_rapl": "model", "reliability": "model",
    "DEFAULT_IDLE_S": "sensors", "MIN_WINDOW_PERIODS": "sensors", "POWER_LOG_MIN_WINDOW_S": "sensors",
    "PowerMeter": "sensors", "check_power_log": "meterlog", "detect": "calibration", "log_record": "meterlog",
    "parse_power_log": "meterlog", "read_power_log": "meterlog", "read_meter_export": "meterlog", "figure_text": "model",
    "grid_intensity": "carbon", "country_row": "carbon", "carbon_of_report": "carbon", "carbon_of_run": "carbon",
    "carbon_text": "carbon", "calibrate": "calibration", "budget_verdict": "model", "board_watts": "model",
    "check_g_per_kwh": "carbon",
    "measured_run": "model", "run_record": "model", "per_unit_of_run": "model",
    "EnergyRecord": "record", "interval_text": "record", "energy_digits": "record",
}
__all__ = sorted(_FACE)

if TYPE_CHECKING:
    from .calibration import calibrate, detect
    from .carbon import carbon_of_report, carbon_of_run, carbon_text, check_g_per_kwh, country_row, grid_intensity
    from .model import (EnergyMeter, board_watts, budget_verdict, energy_report, figure_text, measured_per_inference,
                        measured_run, parse_rate, per_unit_of_run, rapl_delta_j, rapl_per_inference, read_rapl,
                        reliability, run_record)
    from .record import EnergyRecord, energy_digits, interval_text
    from .meterlog import check_power_log, log_record, parse_power_log, read_meter_export, read_power_log
    from .sensors import DEFAULT_IDLE_S, MIN_WINDOW_PERIODS, POWER_LOG_MIN_WINDOW_S, PowerMeter


__getattr__, __dir__ = _lazy.face(__name__, _FACE, globals())
