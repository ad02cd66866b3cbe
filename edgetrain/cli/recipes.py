"""`edgetrain recipes list | show NAME | validate FILE`."""
from __future__ import annotations

import click

from ..recipes import bundled_names, check_recipe, read_recipe
from .common import json_option, say, write_json


@click.group()
def recipes():
    """Bundled recipes (recipes/*.yaml) and checking your own."""


@recipes.command("list")
@json_option
def list_(json_path):
    """The bundled recipes."""
    rows = []
    for name in bundled_names():
        r = read_recipe(name).recipe
        rows.append({"name": name, "device": r.device, "steps": [s.name for s in r.steps],
                     "description": r.description})
    write_json(json_path, {"recipes": rows})
    if json_path != "-":
        for row in rows:
            say(json_path, f"{row['name']:<16} {row['device']:<16} {' -> '.join(row['steps'])}")
            if row["description"]:
                say(json_path, f"{'':<16} {row['description']}")


@recipes.command()
@click.argument("name")
def show(name):
    """Print a recipe (bundled NAME or a path) as written."""
    click.echo(read_recipe(name).text, nl=False)


@recipes.command()
@click.argument("file")
@click.option("--device", metavar="NAME", help="Check it for this device instead of the recipe's.")
@json_option
def validate(file, device, json_path):
    """Check a recipe completely (schema, device, model, data paths) without running it."""
    loaded = read_recipe(file)
    profile = check_recipe(loaded, device)
    write_json(json_path, {"valid": True, "recipe": loaded.recipe.to_dict(), "device": profile.name})
    if json_path != "-":
        say(json_path, f"{loaded.source}: valid ({len(loaded.recipe.steps)} steps for {profile.name})")
