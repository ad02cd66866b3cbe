"""Energy from time and a device's power figures (modelled), or from RAPL counters (measured).

The profile issue extends this module (energy per inference, daily budget, battery life); the
function below is what finetune and export use for "energy spent over a duration".
"""
from __future__ import annotations


def energy_for_duration(seconds: float, profile) -> dict:
    """Joules spent by ``profile``'s board running flat out for ``seconds``, labelled modelled.

    Total uses the full-load board power; the idle-subtracted figure is what the work itself costs
    on top of the board being on.
    """
    load = profile.power.load_w.value
    idle = profile.power.idle_w.value
    return {
        "joules": seconds * load,
        "joules_above_idle": seconds * (load - idle),
        "seconds": seconds,
        "power_w": load,
        "idle_w": idle,
        "provenance": "modelled",
        "source": f"time x {profile.name} full-load power {load} W ({profile.power.load_w.source})",
    }
