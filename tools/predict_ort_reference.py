"""The minimal hand-written ONNX Runtime classifier `edgetrain predict` is measured against.

    python tools/predict_ort_reference.py MODEL.onnx IMAGE_FOLDER [THREADS] [BATCH]

What a user writes without edgetrain: onnxruntime + NumPy + Pillow, the preprocessing read from the
model's metadata (as edgetrain records it), images decoded, resized, normalised, run in batches, top-5
printed. Nothing else: no argument checking, no error messages, no accuracy, no timing.
"""
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image


def main(model, folder, threads=1, batch=16):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(threads)
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    pre = json.loads(sess.get_modelmeta().custom_metadata_map["edgetrain.preprocess"])
    c, h, w = pre["input_shape"]
    mean, std = np.float32(pre["mean"]), np.float32(pre["std"])
    names = pre.get("class_names")
    files = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    name = sess.get_inputs()[0].name
    for start in range(0, len(files), int(batch)):
        chunk = files[start:start + int(batch)]
        x = np.stack([((np.asarray(Image.open(f).convert("L" if c == 1 else "RGB").resize((w, h), Image.BILINEAR),
                                   dtype=np.float32).reshape(h, w, c) / 255.0 - mean) / std).transpose(2, 0, 1)
                      for f in chunk]).astype(np.float32)
        z = sess.run(None, {name: x})[0]
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        for f, row in zip(chunk, p):
            top = np.argsort(-row)[:5]
            print(f, "  ".join(f"{names[i] if names else i} {row[i]:.3f}" for i in top))


if __name__ == "__main__":
    main(*sys.argv[1:])
