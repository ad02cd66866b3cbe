"""Recipes are validated whole before any step runs: one clear error per problem, exit 2."""
from __future__ import annotations

import pytest
import yaml

from clitools import assert_user_error

GOOD = {"name": "mine", "device": "rpi4b-4gb", "model": "edgetrain.nets:digits_cnn", "data": "builtin:digits",
        "val_split": 0.2, "steps": [{"export": {"atol": 0.001}}, {"profile": {"runs": 5}}]}


def write(tmp_path, recipe, name="r.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_bundled_recipes_all_validate(cli, tmp_path):
    res = cli("recipes", "list", "--json", "-", cwd=tmp_path)
    assert res.code == 0, res.err
    names = [r["name"] for r in res.json()["recipes"]]
    assert {"quickstart", "pi-zero2w", "pi5", "jetson-nano-cpu"} <= set(names)
    for name in names:
        out = cli("recipes", "validate", name, "--json", "-", cwd=tmp_path)
        assert out.code == 0, out.err
        assert out.json()["valid"] is True


def test_show_prints_the_recipe(cli, tmp_path):
    res = cli("recipes", "show", "quickstart", cwd=tmp_path)
    assert res.code == 0 and yaml.safe_load(res.out)["name"] == "quickstart"


def test_user_recipe_with_relative_data_path(cli, tmp_path, digits_folder):
    import shutil

    shutil.copytree(digits_folder, tmp_path / "photos")
    path = write(tmp_path, {**GOOD, "data": "photos"})
    res = cli("recipes", "validate", path, cwd="/")
    assert res.code == 0, res.err


@pytest.mark.parametrize("change, fragments", [
    ({"steps": [{"export": {"atols": 0.1}}]}, ["unknown key 'steps[0].export.atols'"]),
    ({"steps": [{"train": {}}]}, ["unknown key 'steps[0].train'"]),
    ({"steps": [{"profile": {"runs": "many"}}]}, ["'steps[0].profile.runs'", "valid integer"]),
    ({"steps": [{"profile": {"rate": "60 per hour"}}]}, ["'steps[0].profile.rate'"]),
    ({"steps": [{"export": {}, "profile": {}}]}, ["'steps[0]'", "exactly one of"]),
    ({"steps": []}, ["'steps'"]),
    ({"device": "rpi9"}, ["unknown device 'rpi9'", "field 'device'"]),
    ({"data": "missing/photos"}, ["data path does not exist", "field 'data'"]),
    ({"val": "missing.npz", "val_split": None}, ["data path does not exist", "field 'val'"]),
    ({"val": "builtin:digits"}, ["either 'val' or 'val_split'"]),
    ({"model": "missing/model"}, ["model not found", "field 'model'"]),
    ({"extra": 1}, ["unknown key 'extra'"]),
])
def test_bad_recipes(cli, tmp_path, change, fragments):
    recipe = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    path = write(tmp_path, recipe)
    res = cli("recipes", "validate", path, cwd=tmp_path)
    assert_user_error(res, 2, str(path), *fragments)


def test_missing_field_named(cli, tmp_path):
    recipe = dict(GOOD)
    del recipe["device"]
    path = write(tmp_path, recipe)
    assert_user_error(cli("recipes", "validate", path, cwd=tmp_path), 2, "missing field 'device'", str(path))


def test_not_yaml(cli, tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("steps: [export\n")
    assert_user_error(cli("recipes", "validate", path, cwd=tmp_path), 2, "not valid YAML")


def test_run_refuses_bad_recipe_before_any_step(cli, tmp_path):
    path = write(tmp_path, {**GOOD, "device": "rpi9"})
    res = cli("run", path, "-o", tmp_path / "run", cwd=tmp_path)
    assert_user_error(res, 2, "unknown device")
    assert not (tmp_path / "run").exists()


def test_run_refuses_a_used_run_folder(cli, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "precious.txt").write_text("keep me")
    res = cli("run", write(tmp_path, GOOD), "-o", tmp_path / "run", cwd=tmp_path)
    assert_user_error(res, 2, "already exists and is not empty")
    assert (tmp_path / "run" / "precious.txt").read_text() == "keep me"


def test_resume_needs_a_run_folder_of_the_same_recipe(cli, tmp_path):
    (tmp_path / "run").mkdir()
    assert_user_error(cli("run", write(tmp_path, GOOD), "--resume", tmp_path / "run", cwd=tmp_path), 2,
                      "nothing to resume")
    (tmp_path / "run" / "recipe.yaml").write_text("name: other\n")
    assert_user_error(cli("run", write(tmp_path, GOOD), "--resume", tmp_path / "run", cwd=tmp_path), 2,
                      "different recipe")


def test_unknown_recipe_name(cli, tmp_path):
    assert_user_error(cli("run", "nosuchrecipe", cwd=tmp_path), 2, "recipe not found", "quickstart")
