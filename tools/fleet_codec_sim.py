"""In-process simulation of the fleet benchmark's codec runs (no Flower, no sockets): the same local
training (``train_round``), SCAFFOLD control variates, codec and weighted average as ``edgetrain fleet``,
so a codec variant can be measured in seconds rather than minutes. It reproduces the bench's per-round
accuracies for fp32 and ternary exactly (same data, same seeds).

    PYTHONPATH=. python tools/fleet_codec_sim.py DATA_DIR --train-layers last:2 --seeds 0,1,2,3,4

DATA_DIR: a bench work folder's ``data`` (val.npz, device-*.npz; ``tools/bench_fleet.py --only last2codec
--keep DIR`` leaves one in DIR/data). Each seed (the devices' training seed; the bench's is 0) runs the
fp32 fleet (no compression; server momentum --ref-momentum, the coordinator's default) and the codec variant on the same
data, and prints both, the gap in points, and at the end the mean and worst gap (``--codec int8`` or
``2bit``: that codec's fleet instead of ternary's). Variants: ``--mode``
scaffold (control deltas compressed like the weights; int8 and 2bit, as the fleet), fedavg (no control variates),
derived (ternary's default, as the fleet: the control delta is derived on both sides from the *decoded*
weight delta, no bytes for it, and applied ``--control-step`` of the way: codec.derived_control), sent (a device's control
variate moves by what the coordinator decodes), consistent (SCAFFOLD's correction uses c_i as the coordinator
holds it: c_i minus its unsent residual), derived-exact (no control deltas travel: the coordinator derives
them from the decoded weight delta, the device keeps its exact c_i); ``--server-lr`` and ``--server-momentum`` (FedAvgM, default
the coordinator's with ternary) on the averaged update; ``--fold-residual`` (a device trains from the global
weights plus its unsent residual); ``--residual-decay`` (the weights' residual scaled before it is added);
``--early ROUNDS:MOMENTUM:LR`` (another server momentum and lr up to round ROUNDS); ``--lowrank R`` (the
4-d weights as a rank-R product of two int8 factors, with error feedback; ``--lowrank-control``: their control
deltas too); ``--exact-values`` (the kept entries decode to their exact values, 2 bytes more each);
``--reset-rounds R,..`` (the weights' residual dropped after those rounds); ``--predict F`` (each weight
tensor's update less F times its projection on the last global step, a bfloat16 coefficient a tensor);
``--dense-rounds R,..:CODEC`` (the weights and their residual as CODEC in those rounds); ``--randk F`` and
``--randk-control F`` (a seeded random fraction of the entries, one sign bit each: no position bits);
``--control-rows CODEC`` (one control variate per output row of a 2-d or 4-d tensor, on the device too).
Diagnosis: ``--exact PARTS`` sends parts as float32 (weights, control,
downlink, stats, or tensors by part of their name), ``--reset-residual`` drops the residual after each round;
each seed's line is followed by its round-2 top-1 and the fp32 fleet's per-round top-1 (cached in --work).
Bytes: every encoded payload byte (plus 4 per
message in derived mode: the device's displacement scale, a float32 the coordinator needs); "x fewer" is
against the fp32 fleet's messages (weights and control deltas, as the bench counts them).

``--fraction F``: the devices asked each round, sampled as the coordinator samples them (seeded by the seed and
the round; SCAFFOLD's global control moves by the askeds' share). The ternary downlink is the fleet's, per device
(strategy.DeltaDownlink): each device asked gets the round's arrays as a delta against what *it* rebuilt the last
time it was asked (at first the model's initial arrays), int8 or sized to ``--downlink-ratio``. A Dirichlet data
folder as tools/bench_fleet_dirichlet.py makes one: ``python -c "from edgetrain.fleet.demo import split_digits;
split_digits('DIR', seed=S, dirichlet=(10, 0.1))"``, then ``--seeds S --fraction 0.3 --uplink-ratio 100``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from edgetrain.fleet import codec
from edgetrain.fleet.coordinator import SERVER_MOMENTUM, sample, weights
from edgetrain.fleet.strategy import average
from edgetrain.fleet.local import Evaluator, LocalSpec, train_round

MODEL = "edgetrain.nets:pretrained_digits"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--codec", default="ternary", choices=["ternary", "int8", "2bit"],
                    help="the codec compared with the fp32 fleet (int8, 2bit: as the fleet, no server momentum)")
    ap.add_argument("--density", type=float, default=codec.DENSITY, help="ternary density (>= 1: fp32)")
    ap.add_argument("--mode", default=None, choices=["scaffold", "fedavg", "derived", "sent", "consistent",
                                                      "derived-exact"],
                    help="how control variates move (default: derived for ternary, as the fleet; scaffold else)")
    ap.add_argument("--control-step", type=float, default=codec.CONTROL_STEP,
                    help="--mode derived: the fraction of the derived control delta each side applies a round")
    ap.add_argument("--control-warm", action="store_true",
                    help="experiment: round r's control step is max(--control-step, 1/r) (a running mean at first)")
    ap.add_argument("--ef21", action="store_true", help="experiment: EF21 (Richtarik et al. 2021) for the weights: "
                    "a device sends its update less the estimate both sides hold (no residual); the coordinator "
                    "averages the estimates")
    ap.add_argument("--ctl-density", type=float, default=0.012,
                    help="--mode scaffold with ternary: the control deltas' density (the fleet's default before the "
                         "derived control deltas; >= 1: they travel as fp32)")
    ap.add_argument("--min-keep", type=int, default=codec.MIN_KEEP, help="ternary: at least this many entries a tensor")
    ap.add_argument("--uplink-ratio", type=float, default=codec.UPLINK_RATIO,
                    help="ternary: each message sized to its float32 bytes / this (codec.sized; as the fleet's "
                         "--uplink-ratio); 0: the fixed --density and --min-keep")
    ap.add_argument("--seeds", default="0", help="the devices' training seeds, comma-separated (the bench: 0)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--fraction", type=float, default=1.0, help="of the devices asked each round (as the fleet's "
                    "--fraction: a sample seeded by the seed and the round)")
    ap.add_argument("--downlink-ratio", type=float, default=codec.DOWNLINK_RATIO,
                    help="ternary: each device's downlink message sized to its float32 bytes / this (the fleet's "
                         "--downlink-ratio); 0: int8 deltas")
    ap.add_argument("--server-lr", type=float, default=1.0)
    ap.add_argument("--server-momentum", type=float, default=SERVER_MOMENTUM, help="the variant's server momentum")
    ap.add_argument("--ref-momentum", type=float, default=SERVER_MOMENTUM,
                    help="the fp32 fleet's server momentum (0: plain averaging, the baseline before stop 31)")
    ap.add_argument("--train-layers", default="head")
    ap.add_argument("--work", default="/tmp/fleet-codec-sim")
    ap.add_argument("--exact", default="", help="diagnosis: comma-separated parts sent exactly (fp32, uncounted "
                    "beyond their float32 bytes): weights, control, downlink, stats, or a part of a weight tensor's name")
    ap.add_argument("--fold-residual", action="store_true",
                    help="a device trains from the global weights plus its own unsent weight residual (its update "
                    "then includes it: nothing is added at encoding)")
    ap.add_argument("--residual-decay", type=float, default=1.0,
                    help="the weights' residual is multiplied by this before it is added to the next update")
    ap.add_argument("--early", default="", help="experiment: ROUNDS:MOMENTUM:LR, the server momentum and lr up to "
                    "round ROUNDS")
    ap.add_argument("--lowrank", type=int, default=0, help="experiment: the 4-d weights (and with --lowrank-control "
                    "their control deltas) as a rank-R product, both factors symmetric int8, with error feedback")
    ap.add_argument("--lowrank-control", action="store_true")
    ap.add_argument("--exact-values", action="store_true", help="experiment: the ternary weights' kept entries "
                    "decode to their exact values (counted as 2 more bytes each, bfloat16)")
    ap.add_argument("--reset-rounds", default="", help="experiment: drop the weights' residual after these rounds "
                    "(comma-separated)")
    ap.add_argument("--predict", type=float, default=0.0, help="experiment: each weight tensor's update less its "
                    "projection on the last global step (both sides know it; a bfloat16 coefficient a tensor), "
                    "this fraction of the projection")
    ap.add_argument("--dense-rounds", default="", help="experiment: ROUNDS:CODEC, the weights (with their residual) "
                    "go as CODEC (fp32, int8, 2bit) in these rounds (comma-separated)")
    ap.add_argument("--randk", type=float, default=0.0, help="experiment: the weights' entries sent are a random "
                    "fraction (positions from a seed both sides know: no position bits), each +-one scale (a sign bit)")
    ap.add_argument("--randk-control", type=float, default=0.0, help="experiment: the same for the control deltas")
    ap.add_argument("--randk-levels", type=int, default=1, help="experiment: magnitude levels a kept entry (1: sign "
                    "only; 2: two scales, 2 bits an entry)")
    ap.add_argument("--control-rows", default="", help="experiment: a 2-d or 4-d tensor's control variate is one "
                    "number per output row (its mean), on the device too; its delta goes as CODEC (fp32 or int8s)")
    ap.add_argument("--ternary-decay", type=float, default=None,
                    help="the codec's RESIDUAL_DECAY instead (1: the whole residual, the codec before; 0: none)")
    ap.add_argument("--residual-stale", type=int, default=0,
                    help="a device's weights residual is dropped when it was last asked more than this many rounds "
                    "before (0: never dropped)")
    ap.add_argument("--reset-residual", action="store_true",
                    help="diagnosis: a device's error-feedback residual is dropped after each round, not carried")
    a = ap.parse_args()
    a.exact = {x for x in a.exact.split(",") if x}
    # any other part: the trained tensors whose name contains it (their control deltas stay as they are)
    a.exact_names = a.exact - {"weights", "control", "downlink", "stats"}
    d = Path(a.data)
    val = str(d / "val.npz")
    devs = sorted(str(p) for p in d.glob("device-*"))
    cdc = a.codec if a.codec != "ternary" else "fp32" if a.density >= 1 else "ternary"
    a.mode = a.mode or ("derived" if cdc == "ternary" else "scaffold")
    smom = a.server_momentum
    sizing = f"uplink ratio {a.uplink_ratio:g}" if a.uplink_ratio and cdc == "ternary" else f"density {a.density:g}"
    print(f"{a.train_layers}: {a.mode} {sizing} ctl {a.ctl_density:g} min-keep {a.min_keep} "
          f"slr {a.server_lr:g} smom {smom:g}, {a.rounds} rounds", flush=True)
    gaps, finals, ratios = [], [], []
    for seed in [int(x) for x in a.seeds.split(",")]:
        # the fleet's seed is its initial arrays' too (a head the model lacks is drawn with it), as `fleet serve`
        ev = Evaluator(LocalSpec(model=MODEL, data=val, workdir=f"{a.work}/ev", threads=1, seed=seed,
                                 train_layers=a.train_layers), val)
        ref, _, _, fp32 = fleet_ref(a, ev, devs, seed)
        accs, up, down, _ = fleet(a, ev, devs, seed, cdc, smom, a.mode, a.density)
        gaps.append(100 * (ref[-1] - accs[-1]))
        finals.append(accs[-1])
        ratios.append(fp32 / up)
        print(f"seed {seed}: fp32 {ref[-1]:.4f}, {cdc} {accs[-1]:.4f} ({-gaps[-1]:+.1f} points), up {up} B "
              f"({fp32 / up:.1f}x fewer), down {down:.1f}x fewer; per round {accs}", flush=True)
        print(f"  round 2: fp32 {ref[1]:.4f}, {cdc} {accs[1]:.4f}; fp32 per round {ref}", flush=True)
    print(f"mean {np.mean(finals):.4f}, gap to fp32 mean {np.mean(gaps):.2f} points, worst {max(gaps):.2f}; "
          f"uplink {min(ratios):.1f}x fewer (least)", flush=True)


def fleet_ref(a, ev, devs, seed: int):
    """The fp32 fleet of ``seed`` (cached in --work: it does not depend on the variant's options)."""
    import json

    import hashlib

    where = hashlib.sha256(str(Path(a.data).resolve()).encode()).hexdigest()[:12]
    key = (Path(a.work) / f"ref2-{seed}-{a.rounds}-{a.train_layers.replace(':', '_')}-{where}"
           f"{'-m%g' % a.ref_momentum if a.ref_momentum else ''}{'-f%g' % a.fraction if a.fraction != 1 else ''}.json")
    if key.exists():
        return tuple(json.loads(key.read_text()))
    out = fleet(a, ev, devs, seed, "fp32", a.ref_momentum, "scaffold", 1.0, exact=set(), reset=False)
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text(json.dumps(out))
    return out


def fleet(a, ev, devs, seed: int, cdc: str, smom: float, mode: str, density: float, exact=None, reset=None):
    """One fleet run in-process: (top-1 per round, bytes up, downlink x fewer, the fp32 fleet's bytes up)."""
    exact = a.exact if exact is None else exact
    reset = a.reset_residual if reset is None else reset
    dl = cdc == "ternary" and "downlink" not in exact
    arrays = dict(ev.initial)
    stats = set(ev.statistics)  # BatchNorm's running statistics: averaged, no control variate, no momentum
    control = {k: np.zeros_like(v) for k, v in arrays.items() if k not in stats}
    cm = [{k: np.zeros_like(v) for k, v in control.items()} for _ in devs]
    resid: list[dict] = [{} for _ in devs]
    hest: list[dict] = [{} for _ in devs]  # --ef21: each device's update as both sides estimate it
    mom = {k: np.zeros_like(v) for k, v in control.items()}
    up, down, down32, accs = 0, 0, 0, []
    # the ternary downlink per device (strategy.DeltaDownlink): what each device rebuilt the last time it was
    # asked, at first the model's initial arrays (which it computes itself: the coordinator's round 0)
    held: list[dict] = [dict(ev.initial) for _ in devs]
    prev_start: list[dict | None] = [None for _ in devs]
    last_asked = [0 for _ in devs]
    for r in range(1, a.rounds + 1):
        sent = {**arrays, **({"control/" + k: v for k, v in control.items()} if mode != "fedavg" else {})}
        asked = sample(list(range(len(devs))), max(1, int(round(len(devs) * a.fraction))), seed, r)
        deltas = []
        for i in asked:
            p = devs[i]
            if dl:  # the coordinator's downlink to device i: a delta against what it holds
                enc_down, held[i] = codec.downlink_delta(sent, held[i], exact=stats, ratio=a.downlink_ratio)
                down += codec.update_bytes(enc_down)
                down32 += sum(4 * v.size for v in sent.values())
            # what the device trains from: with ternary, what it rebuilds from its downlink (as the fleet)
            start = {k: held[i][k] for k in arrays} if dl else arrays
            c_down = ({k: held[i]["control/" + k] for k in control} if dl and mode != "fedavg" else control)
            before = prev_start[i]
            step = ({k: (start[k] - before[k]).astype(np.float64) for k in control}
                    if a.predict and before is not None else None)
            prev_start[i] = {k: start[k].copy() for k in control}
            spec = LocalSpec(model=MODEL, data=p, workdir=f"{a.work}/d{i}", epochs=1, batch_size=32, seed=seed,
                             threads=1, train_layers=a.train_layers)
            # consistent: the correction uses c_i as the coordinator holds it (c_i minus its unsent residual)
            seen = ({k: cm[i][k] - resid[i].get("control/" + k, 0) for k in control} if mode == "consistent"
                    else cm[i])
            corr = {k: c_down[k] - seen[k] for k in control} if mode != "fedavg" else None
            fold = a.fold_residual and cdc == "ternary" and "weights" not in exact
            mine = ({k: (v + resid[i][k]).astype(np.float32) if k in resid[i] and k in control else v
                     for k, v in start.items()} if fold else start)
            new, res = train_round(spec, mine, r, corr)
            delta = {k: new[k] - start[k] for k in new}
            scale = np.float32(res.fleet_scale)
            if mode == "derived-exact":  # the device keeps its exact c_i; the coordinator derives its control deltas
                cm[i] = {k: (cm[i][k] - c_down[k] + (mine[k] - new[k]) / scale).astype(np.float32) for k in control}
            if mode in ("scaffold", "sent", "consistent"):  # c_i+ = displacement / scale - the correction used
                cn = {k: seen[k] - c_down[k] + (mine[k] - new[k]) / scale for k in control}
                if a.control_rows:
                    cn = {k: (np.broadcast_to(v.reshape(v.shape[0], -1).mean(axis=1).reshape((-1,) + (1,) * (v.ndim - 1)),
                                              v.shape).astype(np.float32) if v.ndim >= 2 else v) for k, v in cn.items()}
                delta.update({"control/" + k: (cn[k] - cm[i][k]).astype(np.float32) for k in control})
                cm_old, cm[i] = cm[i], cn
            ctl = {k for k in delta if k.startswith("control/")}
            cd = density if a.ctl_density is None or density >= 1 else a.ctl_density
            if reset:
                resid[i] = {}
            if a.residual_stale and last_asked[i] and r - last_asked[i] > a.residual_stale:
                resid[i] = {k: v for k, v in resid[i].items() if k in res.fleet_statistics}
            last_asked[i] = r
            rw_all = dict(resid[i])
            st = set(res.fleet_statistics)
            wts = {k: v for k, v in delta.items() if k not in ctl and k not in st}
            named = {k for k in wts if any(n in k for n in getattr(a, "exact_names", ())) and cdc != "fp32"}
            proj = {}
            for k in (wts if step is not None and cdc == "ternary" else ()):
                nn = float((step[k] * step[k]).sum())
                if nn > 0:
                    v = wts[k] + rw_all.get(k, 0)
                    coef = float((v * step[k]).sum()) / nn * a.predict
                    coef = float(codec._bf16(coef)[1])
                    proj[k] = (coef * step[k]).astype(np.float32)
                    wts[k] = (wts[k] - proj[k]).astype(np.float32)
            up += 2 * len(proj)
            ef21 = a.ef21 and cdc == "ternary" and "weights" not in exact
            if ef21:  # EF21: the device sends the change of its update against the estimate both sides hold
                wts = {k: (v - hest[i][k]).astype(np.float32) if k in hest[i] else v for k, v in wts.items()}
            rw = (None if fold or ef21 else resid[i] if a.residual_decay == 1 else
                  {k: (v * np.float32(a.residual_decay)).astype(np.float32) for k, v in resid[i].items()})
            dr, _, dcodec = a.dense_rounds.partition(":")
            wcodec = ("fp32" if "weights" in exact else dcodec if str(r) in dr.split(",") and cdc == "ternary"
                      else cdc)
            enc3, r3 = codec.encode_update({k: delta[k] for k in st}, "fp32" if "stats" in exact else cdc, resid[i],
                                           exact=st)
            target = None
            if a.uplink_ratio and wcodec == "ternary":  # as the client: the message's fp32 bytes / the ratio,
                # less the control scale (derived mode) and the statistics' bytes
                derived = mode in ("derived", "derived-exact")
                msg32 = 4 * (sum(v.size for v in delta.values()) + (sum(v.size for v in control.values()) if derived else 0))
                target = int(msg32 // a.uplink_ratio) - (4 if derived else 0) \
                    - codec.update_bytes(enc3)
            enc, r1 = codec.encode_update({k: v for k, v in wts.items() if k not in named},
                                          wcodec, rw,
                                          density=density, floor=a.min_keep, target=target,
                                          decay=a.ternary_decay)
            enc4, _ = codec.encode_update({k: wts[k] for k in named}, "fp32")
            enc.update(enc4)
            enc.update(enc3)
            r1.update(r3)
            ctl_codec = cdc if cdc in ("int8", "2bit") else "fp32" if cd >= 1 or "control" in exact else "ternary"
            enc2, r2 = codec.encode_update({k: delta[k] for k in ctl}, ctl_codec, resid[i],
                                           density=cd, floor=a.min_keep)
            enc.update(enc2)
            if ef21:
                r1 = {k: v for k, v in r1.items() if k in st}
            if str(r) in a.reset_rounds.split(","):
                r1 = {k: v for k, v in r1.items() if k in st}
            resid[i] = {**r1, **r2}
            ternary_bytes = {k: e.nbytes for k, e in enc.items()}
            for k in (list(enc) if a.exact_values and cdc == "ternary" else []):
                if enc[k].codec != "ternary" or k.startswith("control/"):
                    continue
                value = delta[k] + rw_all.get(k, 0)
                kept = codec.decode_tensor(enc[k]) != 0
                dec_k = np.where(kept, value, 0).astype(np.float32)
                up += 2 * int(kept.sum())
                enc[k] = codec.Encoded("fp32", enc[k].shape, dec_k.astype("<f4").tobytes())
                resid[i][k] = (value - dec_k).astype(np.float32)
                up -= enc[k].nbytes - ternary_bytes.get(k, 0)
            for k in (list(enc) if a.lowrank and cdc == "ternary" else []):
                if len(enc[k].shape) != 4 or (k.startswith("control/") and not a.lowrank_control):
                    continue
                value = delta[k] + rw_all.get(k, 0)
                m = value.reshape(value.shape[0], -1).astype(np.float64)
                u, sv, vt = np.linalg.svd(m, full_matrices=False)
                fa, da = codec.encode_tensor((u[:, :a.lowrank] * sv[:a.lowrank]).astype(np.float32), codec.DOWN)
                fb, db = codec.encode_tensor(vt[:a.lowrank].astype(np.float32), codec.DOWN)
                dec_k = (da @ db).astype(np.float32).reshape(value.shape)
                enc[k] = codec.Encoded("fp32", enc[k].shape, dec_k.astype("<f4").tobytes())
                up += fa.nbytes + fb.nbytes - enc[k].nbytes
                resid[i][k] = (value - dec_k).astype(np.float32)
            for k in (list(enc) if (a.randk or a.randk_control) and cdc == "ternary" else []):
                ctl_k = k.startswith("control/")
                frac = a.randk_control if ctl_k else a.randk
                if not frac or k in st or enc[k].codec != "ternary":
                    continue
                value = (delta[k] + rw_all.get(k, 0)).astype(np.float64).ravel()
                rng = np.random.default_rng([r, i, sum(map(ord, k))])
                m = max(1, int(round(frac * value.size)))
                pos = rng.choice(value.size, m, replace=False)
                v = value[pos]
                dec_k = np.zeros_like(value)
                if a.randk_levels == 2:
                    big = np.abs(v) >= np.median(np.abs(v))
                    s_hi = float(codec._bf16(float(np.mean(np.abs(v[big]))) if big.any() else 0.0)[1])
                    s_lo = float(codec._bf16(float(np.mean(np.abs(v[~big]))) if (~big).any() else 0.0)[1])
                    dec_k[pos] = np.sign(v) * np.where(big, s_hi, s_lo)
                    nb = (2 * m + 7) // 8 + 4
                else:
                    sc = float(codec._bf16(float(np.mean(np.abs(v))))[1])
                    dec_k[pos] = np.sign(v) * sc
                    nb = (m + 7) // 8 + 2
                dec_k = dec_k.reshape(enc[k].shape).astype(np.float32)
                up += nb + 8 - enc[k].nbytes
                enc[k] = codec.Encoded("fp32", enc[k].shape, dec_k.astype("<f4").tobytes())
                up -= enc[k].nbytes - (nb + 8)  # counted as nb (+8 header) bytes, not as float32
                resid[i][k] = (value.reshape(enc[k].shape) - dec_k).astype(np.float32)
            for k in (list(enc) if a.control_rows and cdc == "ternary" else []):
                if not k.startswith("control/") or len(enc[k].shape) < 2:
                    continue
                value = (delta[k] + rw_all.get(k, 0)).astype(np.float32)
                rows = value.reshape(value.shape[0], -1)[:, 0].copy()  # block-constant: one number a row
                er, dr = codec.encode_tensor(rows, a.control_rows)
                dec_k = np.broadcast_to(dr.reshape((-1,) + (1,) * (value.ndim - 1)), value.shape).astype(np.float32)
                up -= enc[k].nbytes
                up += er.nbytes
                enc[k] = codec.Encoded("fp32", enc[k].shape, dec_k.astype("<f4").tobytes())
                up -= enc[k].nbytes  # counted as the rows' bytes
                resid[i][k] = (value - dec_k).astype(np.float32)
            up += codec.update_bytes(enc)
            dec = {k: codec.decode_tensor(e) for k, e in enc.items()}
            dec.update({k: (dec[k] + proj[k]).astype(np.float32) for k in proj})
            if ef21:
                for k in wts:
                    if k not in named:
                        dec[k] = (dec[k] + hest[i][k]).astype(np.float32) if k in hest[i] else dec[k]
                        hest[i][k] = dec[k]
            if mode == "sent":  # the device's control variate moves by what the coordinator decodes
                cm[i] = {k: (cm[i][k] - cn[k] + cm_old[k] + dec["control/" + k]).astype(np.float32) for k in control}
            if mode in ("derived", "derived-exact"):  # both sides (derived-exact: the coordinator's side only)
                up += 4
                stp = (max(a.control_step, 1.0 / r) if a.control_warm else a.control_step) if mode == "derived" else 1.0
                dc = codec.derived_control(c_down, dec, scale, stp)
                if mode == "derived":
                    cm[i] = {k: cm[i][k] + dc[k] for k in control}
                dec.update({"control/" + k: dc[k] for k in control})
            deltas.append((dec, int(res.epochs[-1]["samples"])))
        # each weighted by its sample count, capped at 10x the round's lower median, as the coordinator does
        deltas = [(dd, w) for (dd, _), w in zip(deltas, weights([n for _, n in deltas])[0])]
        avg = average(deltas)
        for k in arrays:  # as the coordinator: no momentum for BatchNorm's running statistics
            if k in mom:
                er = [float(x) for x in a.early.split(":")] if a.early and cdc == "ternary" else None
                bm, lr = (er[1], er[2]) if er and r <= er[0] else (smom, a.server_lr)
                mom[k] = np.float32(bm) * mom[k] + avg[k]
                arrays[k] = (arrays[k] + np.float32(lr) * mom[k].astype(np.float32)).astype(np.float32)
            else:
                arrays[k] = (arrays[k] + avg[k]).astype(np.float32)
                if "var" in k.rsplit("_", 1)[-1]:
                    arrays[k] = np.maximum(arrays[k], np.float32(0))
        if mode != "fedavg":  # as the coordinator: a device not asked keeps its share (strategy.Scaffold)
            share = len(deltas) / len(devs)
            control = {k: (control[k] + share * np.mean([dd["control/" + k] for dd, _ in deltas], axis=0))
                       .astype(np.float32) for k in control}
        accs.append(round(ev.top1(arrays), 4))
    # the fp32 fleet's messages: every array and (SCAFFOLD) every control delta as float32
    asked_n = max(1, int(round(len(devs) * a.fraction)))
    fp32 = (sum(4 * v.size for v in arrays.values()) + sum(4 * v.size for v in control.values())) * asked_n * a.rounds
    return accs, up, (down32 / down if down else 1.0), fp32


if __name__ == "__main__":
    main()
