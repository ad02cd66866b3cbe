"""The PyTorch peer of `edgetrain finetune` (run by tools/bench_torch_peer.py in its own venv, never by edgetrain).

A plain PyTorch 2 CPU fine-tune of the same ONNX file's weights: the graph's nodes (Conv, BatchNormalization, Clip,
Relu, Add, GlobalAveragePool, Flatten, Reshape, Gemm) become torch modules by hand (no converter), every initializer
loaded; then the usual loop: model.train() (BatchNorm on batch statistics, updating its running ones), Adam with
L2 weight decay 1e-4 added to the gradient as edgetrain's optimizer does, batch 32, shuffled every epoch, softmax
cross-entropy; model.eval() for the held-out top-1. ``--mode full`` trains every weight, ``bias`` every bias and
BatchNorm shift plus the output layer (TinyTL's bias-only). The inputs are the arrays edgetrain's own preprocessing
made (the benchmark writes them), so the peer does no decoding of its own. Prints one JSON line.

    python torch_peer_finetune.py MODEL.onnx TRAIN.npz VAL.npz --mode full|bias [--epochs 2] [--lr 3e-4]

The benchmark's base is made the same way: ``--reinit --classes 5 --save-onnx BASE.onnx`` trains every weight from
a fresh initialisation (He normal; BatchNorm at 1/0) on the digits 0-4 and writes the weights, the BatchNorm
statistics and the 5-way output layer back into a copy of MODEL (its edgetrain metadata kept).
"""
from __future__ import annotations

import argparse
import json
import os
import time

T0 = time.monotonic()

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import torch  # noqa: E402
from onnx import numpy_helper  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402


def _attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


class OnnxNet(nn.Module):
    """The ONNX graph as torch modules, run in the graph's order."""

    def __init__(self, model):
        super().__init__()
        graph = model.graph
        inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.input = next(i.name for i in graph.input if i.name not in inits)
        self.output = graph.output[0].name
        producer = {o: n for n in graph.node for o in n.output}
        if producer[self.output].op_type == "Softmax":   # train on the logits
            self.output = producer[self.output].input[0]
        self.steps: list[tuple] = []   # (kind, module name or None, inputs, output, extra)
        self.layers = nn.ModuleDict()
        self.consts = {k: v for k, v in inits.items()}
        for i, node in enumerate(graph.node):
            a, name = _attrs(node), f"n{i}"
            op, ins, out = node.op_type, list(node.input), node.output[0]
            if op == "Conv":
                w = inits[ins[1]]
                pads = a.get("pads", [0, 0, 0, 0])
                assert pads[:2] == pads[2:], "asymmetric pads"
                conv = nn.Conv2d(w.shape[1] * a.get("group", 1), w.shape[0], w.shape[2:], a.get("strides", [1, 1]),
                                 pads[:2], a.get("dilations", [1, 1]), a.get("group", 1), bias=len(ins) > 2)
                conv.weight.data = torch.from_numpy(w.copy())
                if len(ins) > 2:
                    conv.bias.data = torch.from_numpy(inits[ins[2]].copy())
                self.layers[name] = conv
                self.steps.append(("module", name, ins[:1], out))
            elif op == "BatchNormalization":
                scale, b, mean, var = (inits[n] for n in ins[1:5])
                bn = nn.BatchNorm2d(len(scale), eps=a.get("epsilon", 1e-5), momentum=0.1)
                bn.weight.data, bn.bias.data = torch.from_numpy(scale.copy()), torch.from_numpy(b.copy())
                bn.running_mean.data, bn.running_var.data = torch.from_numpy(mean.copy()), torch.from_numpy(var.copy())
                self.layers[name] = bn
                self.steps.append(("module", name, ins[:1], out))
            elif op == "Gemm":
                w = inits[ins[1]]
                w = w if a.get("transB", 0) else w.T
                assert not a.get("transA", 0) and a.get("alpha", 1.0) == 1.0 and a.get("beta", 1.0) == 1.0
                fc = nn.Linear(w.shape[1], w.shape[0], bias=len(ins) > 2)
                fc.weight.data = torch.from_numpy(np.ascontiguousarray(w))
                if len(ins) > 2:
                    fc.bias.data = torch.from_numpy(inits[ins[2]].copy())
                self.layers[name] = fc
                self.steps.append(("module", name, ins[:1], out))
            elif op == "Clip":
                lo = float(inits[ins[1]]) if len(ins) > 1 and ins[1] else None
                hi = float(inits[ins[2]]) if len(ins) > 2 and ins[2] else None
                self.layers[name] = nn.ReLU6() if (lo, hi) == (0.0, 6.0) else nn.Hardtanh(lo, hi)
                self.steps.append(("module", name, ins[:1], out))
            elif op == "Relu":
                self.layers[name] = nn.ReLU()
                self.steps.append(("module", name, ins[:1], out))
            elif op in ("Add", "GlobalAveragePool", "Flatten", "Identity", "Dropout"):
                self.steps.append((op, None, ins[:2] if op == "Add" else ins[:1], out))
            elif op == "Reshape":
                self.steps.append(("Reshape", None, ins[:1], out, tuple(int(d) for d in inits[ins[1]])))
            else:
                raise SystemExit(f"torch peer: no mapping for ONNX op {op}")
            self.steps[-1] = (*self.steps[-1][:4], *(self.steps[-1][4:] or (None,)), node)

    def reinit(self) -> None:
        for m in self.layers.values():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                m.reset_parameters()

    def last_layer(self) -> str:
        return [k for k, m in self.layers.items() if isinstance(m, (nn.Linear, nn.Conv2d))][-1]

    def resize_head(self, classes: int) -> None:
        name = self.last_layer()
        old = self.layers[name]
        if isinstance(old, nn.Linear):
            new = nn.Linear(old.in_features, classes, bias=old.bias is not None)
        else:
            new = nn.Conv2d(old.in_channels, classes, old.kernel_size, bias=old.bias is not None)
        self.layers[name] = new

    def save_onnx(self, model, path: str) -> None:
        """The weights back into a copy of ``model`` (its metadata kept); the output's class axis resized."""
        out = onnx.ModelProto()
        out.CopyFrom(model)
        inits = {t.name: t for t in out.graph.initializer}

        def put(name, value):
            inits[name].CopyFrom(numpy_helper.from_array(value.detach().numpy().astype(np.float32), name))
        for step in self.steps:
            kind, name, node = step[0], step[1], step[-1]
            if kind != "module":
                continue
            m = self.layers[name]
            if isinstance(m, nn.Conv2d):
                put(node.input[1], m.weight)
                if m.bias is not None:
                    put(node.input[2], m.bias)
            elif isinstance(m, nn.Linear):
                transposed = any(a.name == "transB" and a.i for a in node.attribute)
                put(node.input[1], m.weight if transposed else m.weight.t())
                if m.bias is not None:
                    put(node.input[2], m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                for i, v in zip(node.input[1:5], (m.weight, m.bias, m.running_mean, m.running_var)):
                    put(i, v)
        classes = self.layers[self.last_layer()].weight.shape[0]
        for value in out.graph.output:
            dims = value.type.tensor_type.shape.dim
            if len(dims) >= 2:
                dims[1].dim_value = classes
        del out.graph.value_info[:]
        onnx.save(out, path)

    def forward(self, x):
        env = {self.input: x}
        for step in self.steps:
            kind, name, ins, out = step[:4]
            xs = [env[i] for i in ins]
            if kind == "module":
                y = self.layers[name](xs[0])
            elif kind == "Add":
                y = xs[0] + xs[1]
            elif kind == "GlobalAveragePool":
                y = xs[0].mean(dim=(2, 3), keepdim=True)
            elif kind == "Flatten":
                y = torch.flatten(xs[0], 1)
            elif kind == "Reshape":
                y = xs[0].reshape([xs[0].shape[i] if d == 0 else d for i, d in enumerate(step[4])])
            else:
                y = xs[0]
            env[out] = y
            if out == self.output:
                return y
        return env[self.output]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model"), ap.add_argument("train"), ap.add_argument("val")
    ap.add_argument("--mode", choices=("full", "bias"), default="full")
    ap.add_argument("--epochs", type=int, default=2), ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-4), ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reinit", action="store_true", help="train from a fresh initialisation (the base)")
    ap.add_argument("--classes", type=int, help="a new output layer of this many classes")
    ap.add_argument("--save-onnx", help="write the trained weights into a copy of MODEL here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    torch.set_flush_denormal(True)
    model = onnx.load(a.model)
    net = OnnxNet(model)
    if a.reinit:
        net.reinit()
    if a.classes:
        net.resize_head(a.classes)
    train, val = np.load(a.train), np.load(a.val)
    x, y = torch.from_numpy(train["data"]), torch.from_numpy(train["label"].astype(np.int64))
    xv, yv = torch.from_numpy(val["data"]), val["label"].astype(np.int64)
    if a.mode == "bias":   # every bias and BatchNorm shift, and the output layer
        last = [m for m in net.layers.values() if isinstance(m, (nn.Linear, nn.Conv2d))][-1]
        for m in net.layers.values():
            for pname, p in m.named_parameters():
                p.requires_grad = pname == "bias" or m is last
    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=a.lr, weight_decay=1e-4)
    rng = np.random.RandomState(a.seed)
    epochs = []
    for _ in range(a.epochs):
        t0 = time.monotonic()
        net.train()
        order = torch.from_numpy(rng.permutation(len(y)))
        for s in range(0, len(order), a.batch):
            idx = order[s:s + a.batch]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
        epochs.append(time.monotonic() - t0)
    net.eval()
    with torch.no_grad():
        pred = np.concatenate([net(xv[s:s + 64]).argmax(1).numpy() for s in range(0, len(yv), 64)])
    if a.save_onnx:
        net.save_onnx(model, a.save_onnx)
    hwm = next(int(ln.split()[1]) for ln in open(f"/proc/{os.getpid()}/status") if ln.startswith("VmHWM"))
    print(json.dumps({"final_accuracy": float(np.mean(pred == yv)), "peak_rss_mb": hwm / 1024,
                      "train_seconds": epochs, "trained_parameters": sum(p.numel() for p in params),
                      "seconds": time.monotonic() - T0}))


if __name__ == "__main__":
    main()
