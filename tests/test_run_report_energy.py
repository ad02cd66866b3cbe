"""The run report's fine-tune-then-infer duty cycle on the device's battery (issue 17)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from edgetrain.run_report import duty_cycle, duty_cycle_rows


@dataclass
class Step:  # the two fields of a run step the duty cycle reads
    name: str
    result: dict


def steps(ft_joules=360.0, ft_seconds=120.0, ft_prov="modelled", daily_wh=60.0, daily_prov="modelled", battery=37.0):
    daily = {"energy_wh_per_day": daily_wh, "provenance": daily_prov, "rate_per_h": 720.0, "battery_days": 0.6}
    if battery:
        daily["battery_wh"] = battery
    return [Step("finetune", {"energy": {"joules": ft_joules, "seconds": ft_seconds, "provenance": ft_prov}}),
            Step("quantize", {}), Step("profile", {"energy": {"daily": daily}}), Step("report", None)]


@pytest.mark.parametrize("ft_j,ft_s,daily_wh", [(360.0, 120.0, 60.0), (36000.0, 3600.0, 10.0), (1.0, 0.5, 100.0)])
def test_a_fine_tune_takes_the_place_of_the_same_stretch_of_the_day(ft_j, ft_s, daily_wh):
    dc = duty_cycle(steps(ft_j, ft_s, daily_wh=daily_wh))
    day = daily_wh * (86400 - ft_s) / 86400 + ft_j / 3600
    assert dc["daily_with_finetune_wh"] == pytest.approx(day)
    assert dc["weekly_finetune_wh_per_day"] == pytest.approx((6 * daily_wh + day) / 7)
    assert dc["battery_days_daily_finetune"] == pytest.approx(37.0 / day)
    assert dc["battery_days_weekly_finetune"] == pytest.approx(37.0 / ((6 * daily_wh + day) / 7))
    labels = [label for label, _ in duty_cycle_rows(dc)]
    assert "battery, fine-tune daily" in labels and "day: fine-tune then infer" in labels


@pytest.mark.parametrize("ft,daily,expected", [("measured", "measured", "measured"), ("measured", "modelled", "modelled"),
                                               ("modelled", "measured", "modelled")])
def test_measured_only_when_both_parts_are(ft, daily, expected):
    dc = duty_cycle(steps(ft_prov=ft, daily_prov=daily))
    assert dc["provenance"] == expected and f"[{expected}]" in duty_cycle_rows(dc)[1][1]


def test_no_battery_no_battery_rows_and_missing_parts_give_nothing():
    dc = duty_cycle(steps(battery=None))
    assert "battery_days_daily_finetune" not in dc and len(duty_cycle_rows(dc)) == 2
    assert duty_cycle([Step("profile", {"energy": {"daily": {"energy_wh_per_day": 5.0}}})]) is None
    assert duty_cycle([Step("finetune", {"energy": {"joules": 5.0, "seconds": 1}})]) is None
    assert duty_cycle([Step("finetune", {"energy": None}), Step("profile", {})]) is None
    assert duty_cycle_rows(None) == []


def test_the_run_report_says_how_much_energy_may_move_and_when_not_to_trust_it():
    from edgetrain.run_report import energy_notes

    pi = {"total_mj": 1.9, "provenance": "modelled",
          "spread": {"p10": {"total_mj": 1.3}, "p90": {"total_mj": 3.1}}}
    rel = {"reasons": ["the host's 1-minute load average was 9.50, above its 2 usable cores"]}
    notes = energy_notes([Step("profile", {"energy": {"per_inference": pi, "reliability": rel}})])
    assert "1.3 to 3.1 mJ" in notes[0] and "unreliable" in notes[1] and "9.50" in notes[1]
    measured = {"total_mj": 2.0, "provenance": "measured", "meter": "pi5-pmic", "samples": 12, "inferences": 400}
    notes = energy_notes([Step("profile", {"energy": {"per_inference": measured, "reliability": {"reasons": []},
                                                      "modelled_per_inference": pi}})])
    assert "1.3 to 3.1" in notes[0] and "pi5-pmic: 12 samples over 400 inferences" in notes[1] and len(notes) == 2
    assert energy_notes([Step("profile", {})]) == []
