"""The peer edgetrain finetune is measured against: a hand-written ONNX Runtime head fine-tune.

Backbone in an InferenceSession (batch 1, CPU arena off), every image decoded once with Pillow and its
features cached in one array, a linear head trained with NumPy (softmax cross-entropy, Adam, weight
decay, the same stratified 20% held-out split and effective batch as edgetrain's defaults).
Prints one JSON line: held-out accuracy, samples trained, peak RSS.

    python tools/finetune_ort_reference.py BACKBONE.onnx IMAGE_FOLDER OUT.npz [--epochs 3] [--threads 2]
"""
import argparse
import json
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image

ap = argparse.ArgumentParser()
ap.add_argument("backbone"), ap.add_argument("folder"), ap.add_argument("out")
ap.add_argument("--epochs", type=int, default=3), ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--threads", type=int, default=2), ap.add_argument("--lr", type=float, default=0.02)
a = ap.parse_args()

opts = ort.SessionOptions()
opts.intra_op_num_threads, opts.inter_op_num_threads = a.threads, 1
opts.enable_cpu_mem_arena = False
sess = ort.InferenceSession(a.backbone, opts, providers=["CPUExecutionProvider"])
inp = sess.get_inputs()[0]
size = tuple(inp.shape[2:])
classes = sorted(p.name for p in Path(a.folder).iterdir() if p.is_dir())
files = [(f, c) for c, name in enumerate(classes) for f in sorted((Path(a.folder) / name).iterdir())]
mean = np.array([0.485, 0.456, 0.406], np.float32)
std = np.array([0.229, 0.224, 0.225], np.float32)
feats, labels = None, np.array([c for _, c in files])
for i, (f, _) in enumerate(files):
    with Image.open(f) as im:
        x = np.asarray(im.convert("RGB").resize(size[::-1], Image.BILINEAR), np.float32) / 255.0
    x = ((x - mean) / std).transpose(2, 0, 1)[None]
    y = sess.run(None, {inp.name: x})[0].reshape(-1)
    if feats is None:
        feats = np.empty((len(files), y.size), np.float32)
    feats[i] = y
del sess

rng = np.random.RandomState(0)
held = np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:max(1, round(0.2 * np.sum(labels == c)))]
                       for c in range(len(classes))])
train = np.setdiff1d(np.arange(len(labels)), held)
k, d = len(classes), feats.shape[1]
W = (rng.randn(k, d) * np.sqrt(2.0 / (k + d))).astype(np.float32)
b = np.zeros(k, np.float32)
state = [np.zeros_like(W), np.zeros_like(W), np.zeros_like(b), np.zeros_like(b)]
t = 0
for _epoch in range(a.epochs):
    order = rng.permutation(train)
    for s in range(0, len(order), a.batch):
        idx = order[s:s + a.batch]
        z = feats[idx] @ W.T + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(idx)), labels[idx]] -= 1
        p /= len(idx)
        t += 1
        lr = a.lr * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        for w, g, m, v in ((W, p.T @ feats[idx], state[0], state[1]), (b, p.sum(0), state[2], state[3])):
            g = g + 1e-4 * w
            m *= 0.9
            m += 0.1 * g
            v *= 0.999
            v += 0.001 * g * g
            w -= lr * m / (np.sqrt(v) + 1e-8)
acc = float(np.mean(np.argmax(feats[held] @ W.T + b, 1) == labels[held]))
np.savez(a.out, weight=W, bias=b, classes=np.array(classes))
hwm = next(int(ln.split()[1]) for ln in open(f"/proc/{os.getpid()}/status") if ln.startswith("VmHWM"))
print(json.dumps({"accuracy": acc, "train_samples": int(len(train)) * a.epochs, "peak_rss_mb": hwm / 1024}))
