"""Split a Gluon model into a frozen part (run once, outside autograd) and a trained part.

Every MODEL kind (zoo network, HybridSequential, factory block, PREFIX SymbolBlock) is handled the same
way: as its symbol graph. The graph is cut at an internal output so that nothing after the cut depends on
anything before it except through that one output; ``last:N`` counts such cuts that sit right before a
weighted layer (Convolution / FullyConnected), from the end. A cut inside a residual block is not a cut
(the skip connection crosses it), so there a "layer" is the whole block.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field

from .. import _lazy
from ..errors import UsageError
from ..options import TrainLayers

WEIGHTED_OPS = ("Convolution", "FullyConnected")
FEATURES = "edgetrain_features"


@dataclass
class Graph:
    """A model's symbol graph as JSON, its weights by name, and the cut points found in it."""

    nodes: list[dict]
    doc: dict
    data_name: str
    arg_params: dict  # name -> NDArray
    aux_params: dict
    cuts: list[int] = field(default_factory=list)  # node ids, in order; cuts[0] may be the data node
    head: int = -1  # node id of the output layer (last weighted op)

    def symbol(self):
        mx = _lazy.mxnet()

        return mx.sym.load_json(json.dumps(self.doc))

    def fingerprint(self) -> str:
        """Identifies the architecture (graph and weight shapes), not the weight values."""
        shapes = sorted((k, tuple(v.shape)) for k, v in {**self.arg_params, **self.aux_params}.items())
        text = json.dumps([self.doc["nodes"], self.doc["heads"], shapes], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def graph_of(block, data_name: str) -> Graph:
    """The symbol graph of a (hybridizable) block and its current weights."""
    mx = _lazy.mxnet()

    try:
        sym = block(mx.sym.var(data_name))
    except Exception as exc:  # a hybrid_forward that only works on NDArrays
        raise UsageError(f"cannot trace the model's graph: {str(exc).splitlines()[0][:200]}", "MODEL",
                         "use a HybridBlock whose hybrid_forward works with symbols (F.*), or export it as PREFIX") from None
    if isinstance(sym, (list, tuple)):
        sym = sym[0]
    doc = json.loads(sym.tojson())
    params = {p.name: p.data() for p in block.collect_params().values()}
    aux_names = set(sym.list_auxiliary_states())
    arg = {k: v for k, v in params.items() if k not in aux_names}
    aux = {k: v for k, v in params.items() if k in aux_names}
    g = Graph(doc["nodes"], doc, data_name, arg, aux)
    find_cuts(g)
    return g


def _is_data(node: dict, data_name: str) -> bool:
    return node["op"] == "null" and node["name"] == data_name


def find_cuts(g: Graph) -> None:
    nodes = g.nodes
    compute = {i for i, n in enumerate(nodes) if n["op"] != "null" or _is_data(n, g.data_name)}
    edges = [(k[0], j) for j in compute for k in nodes[j]["inputs"] if k[0] in compute]
    heads = [h[0] for h in g.doc["heads"]]
    weighted = [i for i, n in enumerate(nodes) if n["op"] in WEIGHTED_OPS]
    if not weighted:
        raise UsageError("model has no Convolution or FullyConnected layer to train", "MODEL",
                         "use an image-classification network")
    g.head = weighted[-1]

    def valid(c: int) -> bool:
        if c >= max(heads):
            return False
        return not any(k < c < j for k, j in edges) and all(
            k[1] == 0 for j in compute for k in nodes[j]["inputs"] if k[0] == c)

    cuts = []
    for w in weighted:
        data_in = nodes[w]["inputs"][0][0]
        if data_in in compute and valid(data_in) and data_in not in cuts:
            cuts.append(data_in)
    g.cuts = cuts


def head_units(g: Graph) -> int:
    node = g.nodes[g.head]
    key = "num_hidden" if node["op"] == "FullyConnected" else "num_filter"
    return int(node["attrs"][key])


def replace_head(g: Graph, classes: int) -> list[str]:
    """Give the output layer ``classes`` outputs; its weights are dropped (initialised afresh later)."""
    node = g.nodes[g.head]
    key = "num_hidden" if node["op"] == "FullyConnected" else "num_filter"
    node["attrs"][key] = str(classes)
    dropped = []
    for inp in node["inputs"][1:]:
        var = g.nodes[inp[0]]
        var.get("attrs", {}).pop("__shape__", None)  # the old class count is baked into it
        name = var["name"]
        if g.arg_params.pop(name, None) is not None:
            dropped.append(name)
    return dropped


def cut_for(g: Graph, layers: TrainLayers) -> int | None:
    """The node whose output feeds the trained part; None when everything trains."""
    if layers.kind == "all":
        return None
    depth = len(g.cuts)
    if layers.n > depth:
        raise UsageError(f"--train-layers {layers.text} is beyond the model's depth: it has {depth} trainable "
                         f"layer{'s' if depth != 1 else ''} that can be split off", "--train-layers",
                         f"use last:1 to last:{depth}, or all")
    cut = g.cuts[-layers.n]
    return None if _is_data(g.nodes[cut], g.data_name) else cut


def output_name(sym_internals, node_name: str) -> str:
    outs = sym_internals.list_outputs()
    for cand in (f"{node_name}_output", f"{node_name}_output0"):
        if cand in outs:
            return cand
    for o in outs:
        if o.startswith(node_name + "_"):
            return o
    raise RuntimeError(f"no output named after node {node_name}")


def _symbol_block(sym, input_name: str, params: dict, ctx):
    mx = _lazy.mxnet()
    gluon = _lazy.from_import("mxnet", "gluon")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Cannot decide type for the following arguments": float32 it is
        block = gluon.SymbolBlock(sym, mx.sym.var(input_name))
    missing = []
    for p in block.collect_params().values():
        if p.name in params:
            p._load_init(params[p.name], ctx)
        else:
            missing.append(p)
    return block, missing


@dataclass
class Split:
    frozen: object | None  # SymbolBlock data -> features, or None when everything trains
    trained: object        # SymbolBlock features|data -> logits
    trained_input: str
    feature_shape: tuple  # one sample's input to the trained part
    cut_name: str | None
    new_params: list[str]
    graph: Graph

    def trainable(self) -> list:
        return [p for p in self.trained.collect_params().values() if p.grad_req != "null"]

    def all_params(self) -> dict:
        out = {}
        for part in (self.frozen, self.trained):
            if part is not None:
                out.update({p.name: p.data() for p in part.collect_params().values()})
        return out


def split(g: Graph, cut: int | None, input_shape: tuple, ctx=None, init_seed: int = 0) -> Split:
    """Build the frozen and trained SymbolBlocks; weights not in ``g`` (a new head) get Xavier init."""
    mx = _lazy.mxnet()

    ctx = ctx or mx.cpu()
    full = g.symbol()
    params = {**g.arg_params, **g.aux_params}
    frozen = None
    cut_name = None
    trained_input = g.data_name
    tail = full
    feature_shape = tuple(input_shape)
    if cut is not None:
        cut_name = g.nodes[cut]["name"]
        internals = full.get_internals()
        frozen, missing = _symbol_block(internals[output_name(internals, cut_name)], g.data_name, params, ctx)
        if missing:
            raise RuntimeError(f"frozen part has uninitialised weights: {[p.name for p in missing]}")
        for p in frozen.collect_params().values():
            p.grad_req = "null"
        doc = json.loads(json.dumps(g.doc))
        doc["nodes"][cut] = {"op": "null", "name": FEATURES, "inputs": []}
        doc["arg_nodes"] = sorted(set(doc["arg_nodes"]) | {cut})
        tail = mx.sym.load_json(json.dumps(doc))
        trained_input = FEATURES
        _, out_shapes, _ = internals[output_name(internals, cut_name)].infer_shape(
            **{g.data_name: (1, *input_shape)})
        feature_shape = tuple(out_shapes[0][1:])
    trained, missing = _symbol_block(tail, trained_input, params, ctx)
    if missing:
        mx.random.seed(init_seed)
        for p in missing:
            bias = p.name.endswith(("_bias", "_beta"))
            p.initialize(mx.init.Zero() if bias else mx.init.Xavier(magnitude=2.0), ctx=ctx)
        trained(mx.nd.zeros((1, *feature_shape), ctx=ctx))  # deferred init happens here, under the seed
    aux = set(tail.list_auxiliary_states())
    for p in trained.collect_params().values():
        if p.name in aux:
            p.grad_req = "null"
    return Split(frozen, trained, trained_input, feature_shape, cut_name, [p.name for p in missing], g)

