"""The mxnet child of a NumPy-trained run: ``python -m edgetrain.training.prep SPEC.json``.

It loads the Gluon model, writes its template (symbol + every weight), exports the frozen part through
edgetrain's validated Gluon->ONNX path with Gluon's outputs on real samples (the parent checks ONNX
Runtime against them) and checks that numpy_tail computes what MXNet computes for the trained part
(outputs, gradients, BatchNorm statistics). The run itself then imports no mxnet. A user error is
written to error.json for the parent to raise as its own.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from .. import _lazy, envvars, procmem, runtime
from ..data import load_data
from ..errors import EdgetrainError
from ..fileio import atomic_path, atomic_write_bytes, atomic_write_text, write_npz
from ..models import load_gluon
from ..options import parse_train_layers
from . import store
from .memplan import graph_costs
from .netsplit import cut_for, graph_of, output_name, split


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    out = Path(spec["dir"])
    try:
        prepare(spec, out)
    except EdgetrainError as exc:
        if envvars.get("EDGETRAIN_DEBUG") == "1":
            raise
        (out / "error.json").write_text(json.dumps({"type": type(exc).__name__, "what": exc.what,
                                                    "where": exc.where, "fix": exc.fix}))
        return exc.exit_code
    return 0


def prepare(spec: dict, out: Path) -> None:
    """Load the base model, write its template, export the frozen part and Gluon's reference outputs for it.

    Ordered for the lowest peak (mxnet's import alone is ~140 MB): the references are computed one sample
    at a time, the loaded model's own weights are let go once the split holds its copies, freed heap is
    returned to the system before the export, and the ONNX Runtime side of the check runs in the parent
    (which has ONNX Runtime loaded anyway), so this process never holds a session."""
    runtime.apply_threads(spec["threads"])
    mx = _lazy.mxnet()
    model = load_gluon(spec["model"], params=spec["params"],
                       input_shape=tuple(spec["input_shape"]) if spec["input_shape"] else None)
    pre = model.preprocess
    g = graph_of(model.block, pre.input_name)
    source_digest = store.params_digest({**g.arg_params, **g.aux_params})
    template = store.write_template(out, g)
    doc = json.loads(json.dumps(g.doc))
    cut = cut_for(g, parse_train_layers(spec["train_layers"]))
    prep = {"format": store.PREP_FORMAT, "key": spec["key"], "preprocess": pre.to_dict(), "data_name": g.data_name,
            "head": g.head, "source_digest": source_digest, "notes": list(model.notes),
            "random_weights": bool(model.random_weights), "tail": False, "checked": cut is None, **template}
    if cut is None:
        prep["tail_refused"] = "nothing is frozen (the whole network trains)"
    else:
        ds = load_data(spec["data"], pre, max_bytes=spec.get("max_bytes"))  # the budget holds in the child too
        x, _ = ds.arrays(store.VALIDATE_SAMPLES)
        del ds
        s = split(g, cut, pre.input_shape)  # the base model's own weights: nothing to initialise
        model.block, g.arg_params, g.aux_params = None, {}, {}  # the split parts hold their own copies
        store.release_freed_memory()
        want = np.concatenate([s.frozen(mx.nd.array(x[i:i + 1])).asnumpy() for i in range(len(x))])
        refused = numpy_tail_refusal(s, doc, g.data_name, want)
        prep["tail"], prep["tail_refused"] = refused is None, refused
        s.trained = None  # only the frozen part is exported
        internals = g.symbol().get_internals()
        frozen_sym = internals[output_name(internals, s.cut_name)]
        prep.update({"feature_shape": list(s.feature_shape), "cut_name": s.cut_name, "validated_on": len(x),
                     "frozen_per_sample_mb": graph_costs(frozen_sym, g.data_name, pre.input_shape)})
        del internals, frozen_sym
        store.release_freed_memory()
        blob = store.export_frozen_bytes(s, pre)
        atomic_write_bytes(out / store.FROZEN_ONNX, blob, "frozen part")
        del blob
        with atomic_path(out / store.REFERENCE_FILE, "reference outputs") as tmp:
            with open(tmp, "wb") as fh:
                write_npz(fh, {"x": x, "want": want})
        prep["frozen_sha256"] = store.file_sha(out / store.FROZEN_ONNX)
    prep["peak_rss_mb"] = procmem.peak_rss_mb() or 0.0
    atomic_write_text(out / "prep.json", json.dumps(prep), "template")


def numpy_tail_refusal(s, doc: dict, data_name: str, feats: np.ndarray) -> str | None:
    """None when numpy_tail computes what MXNet computes for the trained part ``s.trained`` on ``feats``
    (the frozen part's outputs on real samples): its outputs, and, in training mode, its gradients and
    BatchNorm statistics; else why not, in a few words."""
    from .numpy_tail import Tail, Unsupported

    mx = _lazy.mxnet()
    autograd = _lazy.from_import("mxnet", "autograd")
    try:
        tail = Tail(doc, s.cut_name, data_name, tuple(s.feature_shape))
    except Unsupported as exc:
        return str(exc)
    params = {p.name: p for p in s.trained.collect_params().values()}
    if set(params) != set(tail.param_shapes) | set(tail.aux_shapes):
        return "its weights are not the graph's"
    weights = {k: params[k].data().asnumpy() for k in tail.param_shapes}
    stats = {k: params[k].data().asnumpy() for k in tail.aux_shapes}
    got, _ = tail.forward(weights, {k: v.copy() for k, v in stats.items()}, feats, train=False)
    err = store.mismatch(got, s.trained(mx.nd.array(feats)).asnumpy())
    if err or tail.has_dropout:  # dropout's masks differ between the two: the inference check stands alone
        return f"NumPy's outputs differ from MXNet's ({err})" if err else None
    dout = np.random.RandomState(0).standard_normal(got.shape).astype(np.float32)
    with autograd.record(train_mode=True):
        want = s.trained(mx.nd.array(feats))
    want.backward(mx.nd.array(dout))
    got, tape = tail.forward(weights, stats, feats, train=True)
    grads = tail.backward(weights, tape, dout)
    checks = [("outputs in training mode", got, want.asnumpy())]
    checks += [(f"the gradient of {k}", grads[k], params[k].grad().asnumpy()) for k in tail.param_shapes]
    checks += [(f"the statistics {k}", stats[k], params[k].data().asnumpy()) for k in tail.aux_shapes]
    for what, mine, theirs in checks:
        err = store.mismatch(mine, theirs)
        if err:
            return f"NumPy's {what} differ from MXNet's ({err})"
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
