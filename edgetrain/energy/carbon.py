"""Carbon: grams of CO2-equivalent for the energy a run used, from the grid's carbon intensity.

The intensity is the user's own figure (``--grid-intensity G_PER_KWH``) or the bundled table's for the
country the device draws its power in (``--country CODE``): ``grid_intensity.csv`` beside this module,
Ember's yearly electricity data (the source, year and licence are stated in the file's header). Nothing is
fetched at run time. A device profile carries no country: where a device runs is the user's to say.

    grams = joules / 3.6e6 (J per kWh) x intensity (g per kWh)

The table is the average intensity of the country's generation over a year; a device's real figure depends
on the hour, the local grid and its own supply (a battery charged from solar), so the grams are labelled
with the intensity they used and where it came from.
"""
from __future__ import annotations

import csv
import functools
from pathlib import Path

from ..errors import UsageError

TABLE = Path(__file__).with_name("grid_intensity.csv")
J_PER_KWH = 3.6e6
FIELDS = ["iso3", "iso2", "country", "year", "g_co2e_per_kwh"]


@functools.lru_cache(maxsize=1)
def table() -> dict[str, dict]:
    """The bundled table, keyed by ISO 3166-1 alpha-3 code."""
    return {row["iso3"]: row for row in read_table(TABLE)}


def read_table(path: Path) -> list[dict]:
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln and not ln.startswith("#")]
    rows = []
    for row in csv.DictReader(lines):
        rows.append({"iso3": row["iso3"], "iso2": row["iso2"], "country": row["country"], "year": int(row["year"]),
                     "g_co2e_per_kwh": float(row["g_co2e_per_kwh"])})
    return rows


def citation() -> str:
    """The table's source line, as stated in its header."""
    head = [ln[1:].strip() for ln in TABLE.read_text(encoding="utf-8").splitlines() if ln.startswith("#")]
    return " ".join(ln for ln in head if ln.startswith(("Source:", "https://")))


def country_row(code: str) -> dict | None:
    """A country's row by its alpha-2 or alpha-3 code (any case), or None."""
    key = str(code).strip().upper()
    rows = table()
    return rows.get(key) or next((r for r in rows.values() if r["iso2"] == key), None)


# No grid emits more per kWh: lignite plants are about 1,100 g (IPCC AR5 life-cycle median 820 g for coal).
# 0 is a real figure: a node on its own solar panel, or a supply bought fully renewable (its grams are 0).
MAX_G_PER_KWH = 2000.0


def check_g_per_kwh(value: float) -> float:
    """A grid intensity the grams may use: finite, 0 to MAX_G_PER_KWH; UsageError("what", fix) otherwise."""
    value = float(value)
    if value != value or value < 0:
        raise UsageError(f"{value:g} g CO2e/kWh is not a grid's intensity (it is 0 or more)", "--grid-intensity",
                         "give grams of CO2e per kWh, e.g. 350, or 0 for a fully renewable supply")
    if value > MAX_G_PER_KWH:
        raise UsageError(f"{value:g} g CO2e/kWh is beyond any grid (lignite, the most intense source, is about "
                         f"1,100, the bound {MAX_G_PER_KWH:g})", "--grid-intensity",
                         "give grams of CO2e per kWh (not per MWh, not kg), e.g. 350")
    return value + 0.0  # -0.0 -> 0.0


def grid_intensity(country: str | None = None, grid_g_per_kwh: float | None = None) -> dict | None:
    """The intensity a run's grams use, with its provenance; None when the user gave neither."""
    if country is not None and grid_g_per_kwh is not None:
        raise UsageError("--country and --grid-intensity both given", "--grid-intensity",
                         "give the country (the bundled table's figure) or your own figure, not both")
    if grid_g_per_kwh is not None:
        g = check_g_per_kwh(grid_g_per_kwh)
        return {"g_co2e_per_kwh": g, "provenance": "given",
                "source": f"--grid-intensity {g:g} g CO2e/kWh, given by the user"}
    if country is None:
        return None
    row = country_row(country)
    if row is None:
        raise UsageError(f"no grid carbon intensity for country '{country}'", "--country",
                         f"give an ISO 3166 code listed in {TABLE.name} (e.g. DE or DEU), or the grid's own figure "
                         "with --grid-intensity G_PER_KWH")
    return {"g_co2e_per_kwh": row["g_co2e_per_kwh"], "provenance": "table", "country": row["iso3"],
            "country_name": row["country"], "year": row["year"],
            "source": (f"{row['country']} ({row['iso3']}) {row['year']} average grid intensity "
                       f"{row['g_co2e_per_kwh']:g} g CO2e/kWh, Ember yearly electricity data "
                       f"(bundled {TABLE.name}, CC BY-SA 4.0)")}


def grams(joules: float, g_per_kwh: float) -> float:
    return joules / J_PER_KWH * g_per_kwh


def of_energy(joules: float, grid: dict, plus_minus_j: float | None = None, per: dict | None = None) -> dict:
    """Grams for ``joules`` (and their ± from the energy's), and per unit for each ``per`` {name: count}."""
    g = grid["g_co2e_per_kwh"]
    out = {"grams": grams(joules, g), "g_co2e_per_kwh": g, "intensity": grid,
           "energy_provenance": None, "source": f"{joules:.4g} J / 3.6e6 J/kWh x {g:g} g/kWh ({grid['source']})"}
    if plus_minus_j is not None:
        out["plus_minus_g"] = grams(plus_minus_j, g)
    for name, count in (per or {}).items():
        if count:
            out[f"grams_per_{name}"] = out["grams"] / count
    return out


def carbon_of_report(report: dict, grid: dict | None) -> dict | None:
    """A profile's (or export's) carbon: per inference, and per day where the report has a daily figure."""
    if grid is None or not report.get("per_inference"):
        return None
    pi = report["per_inference"]
    u = pi.get("uncertainty") or {}
    g = grid["g_co2e_per_kwh"]
    base = of_energy(pi["total_mj"] / 1000.0, grid)
    out = {"per_inference_g": base["grams"], "per_inference_mg": base["grams"] * 1000.0, "g_co2e_per_kwh": g,
           "energy_provenance": pi.get("provenance"), "intensity": grid, "source": base["source"]}
    if u.get("kind") == "interval":  # modelled: the energy's interval, in grams
        out["per_inference_low_g"] = grams(u["low_mj"] / 1000.0, g)
        out["per_inference_high_g"] = grams(u["high_mj"] / 1000.0, g)
    elif u.get("plus_minus_mj") is not None:
        out["per_inference_plus_minus_g"] = grams(u["plus_minus_mj"] / 1000.0, g)
    daily = report.get("daily")
    if daily and daily.get("energy_wh_per_day") is not None:
        out["per_day_g"] = grams(daily["energy_wh_per_day"] * 3600.0, grid["g_co2e_per_kwh"])
    return out


def carbon_of_run(energy: dict | None, grid: dict | None, inferences: int | None = None) -> dict | None:
    """A fine-tune's carbon: the run's grams (± from its energy's), per epoch and per sample trained."""
    if grid is None or not energy or energy.get("joules") is None:
        return None
    u = energy.get("uncertainty") or {}
    interval = u.get("kind") == "interval"
    out = of_energy(energy["joules"], grid, None if interval else u.get("plus_minus_j"),
                    {"epoch": energy.get("epochs"), "sample": energy.get("samples_trained"), "inference": inferences})
    if interval:
        out["low_g"] = grams(u["low_j"], grid["g_co2e_per_kwh"])
        out["high_g"] = grams(u["high_j"], grid["g_co2e_per_kwh"])
    out["energy_provenance"] = energy.get("provenance")
    return out


def carbon_text(c: dict, per_inference: bool = False) -> str:
    """'0.43 g ± 30 mg CO2e (Germany 2024 grid, 342 g/kWh [table])'; a modelled interval '+a/−b'."""
    pre = "per_inference_" if per_inference else ""
    g = c[pre + "g"] if per_inference else c["grams"]
    pm, low, high = c.get(pre + "plus_minus_g"), c.get(pre + "low_g"), c.get(pre + "high_g")
    grid = c["intensity"]
    where = (f"{grid['country_name']} {grid['year']} grid" if grid.get("country") else "the grid you gave")
    from .record import interval_text

    plus, minus = (pm, pm) if pm is not None else (high - g, g - low) if low is not None else (None, None)
    val = interval_text(g, plus, minus, "", _g)
    return f"{val} CO2e ({where}, {grid['g_co2e_per_kwh']:g} g/kWh [{grid['provenance']}])"


def _g(x: float) -> str:
    if x >= 1:
        return f"{x:.3g} g"
    if x >= 1e-3:
        return f"{x * 1e3:.3g} mg"
    return f"{x * 1e6:.3g} µg"
