"""Regenerate edgetrain/energy/grid_intensity.csv from the two files of thegreenwebfoundation/co2.js it was made
from (the header of the CSV names their commits and the licences):

    python tools/carbon_table.py average-intensities.json countries.csv > edgetrain/energy/grid_intensity.csv

average-intensities.json: co2.js data/output/average-intensities.json (Ember's yearly emissions intensity, the
latest year per country); countries.csv: co2.js data/fixtures/countries.csv (ISO 3166 alpha-2 and alpha-3).
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

# co2.js's countries.csv gives the Cayman Islands CY, Cyprus's code; ISO 3166-1 assigns them KY (a test of the
# table found the duplicate).
FIXES = {"CYM": "KY"}
HEADER = Path(__file__).resolve().parents[1] / "edgetrain" / "energy" / "grid_intensity.csv"


def main(intensities: str, countries: str) -> None:
    data = json.loads(Path(intensities).read_text(encoding="utf-8"))
    with open(countries, newline="", encoding="utf-8") as f:
        iso2 = {r["country_code_iso_3"]: r["country_code_iso_2"] for r in csv.DictReader(f) if r["country_code_iso_3"]}
    iso2.update(FIXES)
    rows = sorted((v["country_code"], iso2.get(v["country_code"], ""), v["country_or_region"], v["year"],
                   v["emissions_intensity_gco2_per_kwh"]) for v in data.values() if v["country_code"])
    # the comment header (source, year, licence) is kept from the committed file
    sys.stdout.write("".join(ln for ln in HEADER.read_text(encoding="utf-8").splitlines(True) if ln.startswith("#")))
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(["iso3", "iso2", "country", "year", "g_co2e_per_kwh"])
    w.writerows(rows)


if __name__ == "__main__":
    main(*sys.argv[1:3])
