"""Run from a clone's top folder, `python -m edgetrain` imports the source tree, not the installed
package: the bundled profiles, recipes and data must be found there too."""
from __future__ import annotations

from pathlib import Path

from clitools import run_edgetrain

REPO = Path(__file__).resolve().parents[2]


def test_bundled_files_found_from_the_source_tree():
    res = run_edgetrain("devices", "show", "rpi4b-4gb", "--json", "-", cwd=REPO)
    assert res.code == 0, res.err
    assert res.json()["name"] == "rpi4b-4gb"
    res = run_edgetrain("recipes", "validate", "quickstart", cwd=REPO)
    assert res.code == 0, res.err
