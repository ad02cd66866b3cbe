"""Carbon (issue 24, item 6): the bundled grid-intensity table and the grams it gives."""
from __future__ import annotations

import re

import pytest

from edgetrain.energy import carbon
from edgetrain.energy.model import energy_report
from edgetrain.devices import load_device
from edgetrain.errors import UsageError


def test_every_row_of_the_table_is_well_formed():
    rows = carbon.read_table(carbon.TABLE)
    assert len(rows) > 150
    iso3 = [r["iso3"] for r in rows]
    iso2 = [r["iso2"] for r in rows if r["iso2"]]
    assert len(set(iso3)) == len(iso3) and len(set(iso2)) == len(iso2)
    for r in rows:
        assert re.fullmatch(r"[A-Z]{3}", r["iso3"]), r
        assert r["iso2"] == "" or re.fullmatch(r"[A-Z]{2}", r["iso2"]), r
        assert r["country"].strip() == r["country"] and r["country"], r
        assert 2015 <= r["year"] <= 2030, r
        assert 0 <= r["g_co2e_per_kwh"] <= 1500, r  # no grid emits more than a lignite plant (~1,100 g/kWh)


def test_the_table_states_its_source_year_and_licence():
    head = "\n".join(ln for ln in carbon.TABLE.read_text(encoding="utf-8").splitlines() if ln.startswith("#"))
    assert "Ember" in head and "CC BY-SA 4.0" in head and "CC-BY-4.0" in head
    assert re.search(r"commit\s+[0-9a-f]{40}", head) and "column year" in head


def test_grams_on_a_known_figure():
    # one kWh at Germany's 2024 figure (Ember: 342.06 g/kWh) is 342.06 g; a 3.6 J inference is a millionth of it
    de = carbon.grid_intensity("DE")
    assert de["country"] == "DEU" and de["year"] == 2024 and de["g_co2e_per_kwh"] == pytest.approx(342.06)
    assert carbon.grid_intensity("deu") == de
    assert carbon.grams(3.6e6, de["g_co2e_per_kwh"]) == pytest.approx(342.06)
    rep = energy_report(10.0, load_device("rpi4b-4gb"), rate_per_h=3600)  # 10 ms at full load 6.4 W = 64 mJ
    c = carbon.carbon_of_report(rep, de)
    assert c["per_inference_g"] == pytest.approx(0.064 / 3.6e6 * 342.06)
    assert c["per_day_g"] == pytest.approx(rep["daily"]["energy_wh_per_day"] / 1000 * 342.06)
    u = rep["per_inference"]["uncertainty"]  # modelled: an interval, carried into grams
    assert c["per_inference_low_g"] == pytest.approx(u["low_mj"] / 1000 / 3.6e6 * 342.06)
    assert c["per_inference_high_g"] == pytest.approx(u["high_mj"] / 1000 / 3.6e6 * 342.06)
    assert "per_inference_plus_minus_g" not in c
    run = carbon.carbon_of_run({"joules": 7200.0, "provenance": "measured", "uncertainty": {"plus_minus_j": 36.0},
                                "epochs": 2, "samples_trained": 100}, carbon.grid_intensity(grid_g_per_kwh=500))
    assert run["grams"] == pytest.approx(1.0) and run["plus_minus_g"] == pytest.approx(0.005)
    assert run["grams_per_epoch"] == pytest.approx(0.5) and run["grams_per_sample"] == pytest.approx(0.01)
    assert carbon.carbon_text(run).startswith("1 g ± 5 mg CO2e (the grid you gave, 500 g/kWh [given])")


def test_an_unknown_country_or_both_figures_are_refused():
    with pytest.raises(UsageError, match="no grid carbon intensity for country 'ATLANTIS'"):
        carbon.grid_intensity("ATLANTIS")
    with pytest.raises(UsageError, match="both given"):
        carbon.grid_intensity("DE", 300.0)
