"""predict with a model whose weights hold a NaN (issue 26, closing campaign): the ONNX file passes ONNX
Runtime's load, every score was "nan" and predict exited 0 (a silent wrong answer; finetune already refused
such a file). Now one `Error:` line, exit 2, nothing written to -o, through the CLI and the API."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import edgetrain
from clitools import assert_user_error, run_edgetrain
from edgetrain.errors import UsageError

ONNX = Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx"


def _broken(tmp_path: Path, value: float, where: str) -> Path:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(ONNX))
    inits = [t for t in model.graph.initializer if t.data_type == 1 and len(t.dims) >= 1]
    init = inits[-1] if where == "last" else inits[0]
    arr = numpy_helper.to_array(init).copy()
    arr.flat[0] = value
    init.CopyFrom(numpy_helper.from_array(arr, init.name))
    out = tmp_path / f"broken-{where}.onnx"
    onnx.save(model, str(out))
    return out


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["first", "last"])
def test_predict_refuses_non_finite_scores(tmp_path, value, where):
    model = _broken(tmp_path, value, where)
    out = tmp_path / "pred.csv"
    res = run_edgetrain("predict", model, "builtin:digits", "--format", "csv", "-o", out, timeout=120)
    if res.code == 0:  # an inf that the network's arithmetic absorbs is a finite answer: it must read as one
        assert "nan" not in out.read_text().lower()
        return
    assert_user_error(res, 2, "not finite")
    assert not out.exists()


def test_api_predict_refuses_nan_weights(tmp_path):
    with pytest.raises(UsageError, match="not finite"):
        edgetrain.predict(str(_broken(tmp_path, np.nan, "last")), "builtin:digits", progress=None)
