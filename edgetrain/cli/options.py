"""Options shared by the commands that take a MODEL."""
from __future__ import annotations

import click


def _shape(ctx, param, value):
    if value is None:
        return None
    from ..errors import UsageError
    from ..preprocess import parse_shape

    try:
        return parse_shape(value, "--input-shape")
    except UsageError as exc:
        raise click.BadParameter(f"{exc.what}; {exc.fix}") from None


def input_shape_option(f):
    return click.option("--input-shape", callback=_shape, metavar="N,C,H,W",
                        help="Input shape, e.g. 1,3,224,224 (default: recorded with the model, else 3x224x224).")(f)


def params_option(f):
    return click.option("--params", type=click.Path(dir_okay=False), metavar="FILE",
                        help="Weights for a zoo: or factory model (save_parameters file).")(f)
