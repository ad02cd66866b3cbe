"""`edgetrain fleet serve` and `edgetrain fleet join`: orchestration of Flower's processes.

serve: check MODEL and the held-out data (the engine loads them once here, so a mistake is one line
before any process starts), write the starting global weights and a Flower App into RUNDIR, start a
Flower SuperLink (loopback unless --listen says otherwise; TLS with --tls-cert/--tls-key/--tls-ca), submit
the App with ``flwr run`` and follow the rounds until the ServerApp finishes; then stop every process.

join: write the device's settings (join.json) into its state folder and run a Flower SuperNode whose
ClientApp trains with edgetrain; return when the coordinator says the run is over, or fail with one line
when the device's model does not fit the fleet's.
"""
from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np

from .. import runtime
from ..data import BUILTIN_PREFIX
from ..errors import RunFailed, UsageError
from ..fileio import atomic_write_text
from ..fleet import client as fclient
from ..fleet import coordinator as coord
from ..fleet import store
from . import fleet_models as deploy
from ..fleet import procs
from ..fleet.local import Evaluator, LocalSpec
from ..fleet.report import HTML, RESULT, FleetResult, JoinResult, html_section
from ..options import FleetJoinOptions, FleetServeOptions
from ..results import ProgressFn, report
from ..run_report import page

APP_DIR = "flower-app"
DONE_GRACE = 3.0
REFUSE_GRACE = 6.0

_PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "edgetrain-fleet"
version = "1.0.0"
description = "edgetrain fleet: federated fine-tuning of the trainable part (written by edgetrain fleet serve)"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "edgetrain"

[tool.flwr.app.components]
serverapp = "edgetrain.fleet.apps:server_app"
clientapp = "edgetrain.fleet.apps:client_app"

[tool.flwr.app.config]
edgetrain = ""
"""


def _need_flower() -> None:
    import importlib.util

    if importlib.util.find_spec("flwr") is None:
        raise UsageError("Flower (flwr) is not installed", "edgetrain fleet",
                         'install the fleet extra: pip install "edgetrain[fleet]" (needs numpy >= 1.26)')
    procs.flower_bin("flower-superlink")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _check_file(path: str | None, flag: str) -> str | None:
    if path is None:
        return None
    p = Path(path)
    if not p.is_file():
        raise UsageError("file not found", f"{flag} {path}", "give a PEM file")
    return str(p.resolve())


def _tls(opts: FleetServeOptions) -> tuple[str, str, str] | None:
    given = [opts.tls_cert, opts.tls_key, opts.tls_ca]
    if not any(given):
        return None
    if not all(given):
        raise UsageError("TLS needs --tls-cert, --tls-key and --tls-ca together", "--tls-cert",
                         "give all three PEM files (or none, for loopback without TLS)")
    return (_check_file(opts.tls_cert, "--tls-cert"), _check_file(opts.tls_key, "--tls-key"),
            _check_file(opts.tls_ca, "--tls-ca"))


def _prepare_rundir(rundir: Path, resume: bool) -> dict | None:
    if rundir.exists() and not rundir.is_dir():
        raise UsageError("RUNDIR is a file", str(rundir), "give a folder (it is created if missing)")
    state = store.read_state(rundir) if rundir.exists() else None
    if state is not None and not resume:
        raise UsageError(f"RUNDIR holds a fleet run ({state['completed']} round(s) completed)", str(rundir),
                         "pass --resume to continue it, or choose another RUNDIR")
    if resume and state is None:
        raise UsageError("--resume: RUNDIR holds no fleet run", str(rundir), "start without --resume")
    return state


def _check_inputs_outside_export(rundir: Path, inputs: dict) -> None:
    """The run's end replaces RUNDIR/model/ (the exported global model) in one rename: an input inside that
    folder (MODEL at RUNDIR/model/model.onnx, its PREFIX or --params there) would be replaced by the fleet's
    own model. Refused before any round, as every other output that would land on an input."""
    export_dir = rundir / deploy.FOLDER
    for opt, ref in inputs.items():
        if ref is None:
            continue
        text = str(ref)
        if not any(Path(p).exists() for p in (text, text + "-symbol.json", text + ".onnx")):
            continue  # zoo:NAME, pkg.module:function, builtin:digits -- not a file
        where = Path(os.path.realpath(text))
        if where == export_dir or export_dir in where.parents:
            raise UsageError(f"{opt} is inside {export_dir}, the folder the run's end replaces with the global model",
                             text, f"move {opt} out of RUNDIR/{deploy.FOLDER}, or give another -o RUNDIR")


def serve(model: str, opts: FleetServeOptions, progress: ProgressFn | None = None) -> FleetResult:
    _need_flower()
    from ..fileio import check_folder_outside_data

    check_folder_outside_data(opts.out, "-o", {"--val": opts.val})
    rundir = Path(opts.out).resolve()
    _check_inputs_outside_export(rundir, {"MODEL": model, "--params": opts.params, "--val": opts.val})
    tls = _tls(opts)
    notes: list[str] = []
    if not tls and not _is_loopback(opts.listen):
        notes.append(f"listening on {opts.listen} WITHOUT TLS: updates travel unencrypted; give --tls-cert/--tls-key/"
                     "--tls-ca")
    if opts.aggregate == "scaffold" and opts.optimizer != "sgd":
        raise UsageError("--aggregate scaffold corrects SGD steps", "--optimizer",
                         "use --optimizer sgd, or --aggregate fedavg with adam")
    state = _prepare_rundir(rundir, opts.resume)
    threads = runtime.apply_threads(opts.thread_cap(), strict=False)
    spec = store.ServeSpec(
        rundir=str(rundir), model=model, val=opts.val, params=opts.params, rounds=opts.rounds,
        min_clients=opts.min_clients, min_updates=opts.min_updates, fraction=opts.fraction, aggregate=opts.aggregate,
        round_timeout=opts.round_timeout, join_timeout=opts.join_timeout, codec=opts.codec, epochs=opts.epochs,
        batch_size=opts.batch_size, lr=opts.lr, optimizer=opts.optimizer, seed=opts.seed,
        train_layers=opts.train_layers, threads=threads, max_update_norm=opts.max_update_norm,
        ternary_density=opts.ternary_density, ternary_control_step=opts.ternary_control_step,
        ternary_min_keep=opts.ternary_min_keep, uplink_ratio=opts.uplink_ratio,
        downlink_ratio=opts.downlink_ratio,
        server_momentum=opts.server_momentum if opts.server_momentum is not None else coord.SERVER_MOMENTUM)
    if state is None:
        report(progress, "prepare", message="loading the model and the held-out data")
        created = not rundir.exists()
        rundir.mkdir(parents=True, exist_ok=True)
        try:
            ev = Evaluator(LocalSpec(model=model, data=opts.val, workdir=str(rundir / "work"), threads=threads,
                                     seed=opts.seed, params=opts.params, train_layers=opts.train_layers), opts.val)
        except BaseException:
            if created:  # a model or --val refused: nothing half-made left behind
                shutil.rmtree(rundir, ignore_errors=True)
            raise
        store.save_global(rundir, 0, ev.initial)
        spec.write()  # before the state: a RUNDIR with a state has its spec
        state = {"format": store.STATE_FORMAT, "completed": 0, "classes": ev.classes,
                 "initial_accuracy": ev.top1(ev.initial), "rounds": [], "model": model, "codec": opts.codec}
        store.write_state(rundir, state)
        resumed_after = 0
    else:
        # what the run was asked for (a field an older spec lacks has the default those runs had); no spec: a run
        # stopped between its first state and its spec, whose state names its model and codec
        given = rundir / store.SPEC
        old = (store.ServeSpec.read(given).to_dict() if given.exists()
               else {"model": state.get("model"), "codec": state.get("codec")})
        changed = [k for k in ("model", "val", "codec", "params", "aggregate", "train_layers")
                   if k in old and old[k] != getattr(spec, k)]
        if changed:
            raise UsageError(f"--resume with a different {', '.join(changed)} than the run in RUNDIR", str(rundir),
                             "resume with the same MODEL, --val, --codec, --aggregate, --params and --train-layers")
        spec.write()
        state.pop("finished", None)
        store.write_state(rundir, state)
        resumed_after = int(state["completed"])
    address = f"{opts.listen}:{opts.port}"
    if state["completed"] < opts.rounds:
        _run_flower(rundir, opts, tls, progress)
    final = store.read_state(rundir)
    models, failed = {}, []
    if opts.export != "none" and not any(r.get("updated") for r in final["rounds"]):
        notes.append("no deployable model written: no round accepted an update (RUNDIR/global-0000.npz is the start)")
    elif opts.export != "none":
        report(progress, "export", final=True, message=f"writing the global model to {rundir / deploy.FOLDER}")
        models, more, failed = deploy.write_models(rundir, spec, store.load_global(rundir, final["completed"]),
                                                   final["completed"], opts.export)
        notes += more
    return _result(final, rundir, address, bool(tls), opts, resumed_after, notes, models, failed)


def _result(state: dict, rundir: Path, address: str, tls: bool, opts, resumed_after: int, notes, models=None,
            failed=()) -> FleetResult:
    rounds = state["rounds"]
    updated = [r for r in rounds if r.get("updated")]
    devices = [{"client": d["name"], "device_id": key, "asked": d.get("asked", 0), "updates": d.get("updates", 0),
                "last_accepted_round": d.get("accepted", 0), **({"reason": d["reason"]} if d.get("reason") else {})}
               for key, d in sorted(state.get("devices", {}).items(), key=lambda kv: (kv[1]["name"], kv[0]))]
    res = FleetResult(rundir=str(rundir), model=state["model"], address=address, tls=tls, codec=opts.codec,
                      aggregate=opts.aggregate, train_layers=opts.train_layers,
                      rounds_requested=opts.rounds, rounds_completed=len(updated), rounds_run=int(state["completed"]),
                      rounds_without_update=[r["round"] for r in rounds if not r.get("updated")], devices=devices,
                      initial_accuracy=state.get("initial_accuracy"),
                      final_accuracy=rounds[-1]["accuracy"] if rounds else state.get("initial_accuracy"),
                      bytes_up=sum(r["bytes_up"] for r in rounds), bytes_up_fp32=sum(r["bytes_up_fp32"] for r in rounds),
                      bytes_down=sum(r["bytes_down"] for r in rounds), rounds=rounds, resumed_after=resumed_after,
                      report=str(rundir / HTML), notes=notes, models=dict(models or {}),
                      model_checks=list(failed),
                      chance={**state["chance"], "allowed": bool(opts.allow_chance)} if state.get("chance") else None,
                      finite=_finite(rundir, int(state["completed"])))
    atomic_write_text(rundir / HTML, page(f"edgetrain fleet: {res.model}", html_section(res)), "fleet report")
    atomic_write_text(rundir / RESULT, json.dumps(res.to_dict(), indent=2, default=str) + "\n", "fleet report")
    return res


def _finite(rundir: Path, round_no: int) -> bool:
    """Whether the global arrays saved after ``round_no`` are all finite (none saved: nothing to say)."""
    if not store.global_path(rundir, round_no).exists():
        return True
    return all(bool(np.all(np.isfinite(v))) for v in store.load_global(rundir, round_no).values())


def _flwr_home(folder: Path, address: str, tls_ca: str | None) -> Path:
    home = folder / ".flwr"
    home.mkdir(parents=True, exist_ok=True)
    conn = f'address = "{address}"\n' + (f'root-certificates = "{tls_ca}"\n' if tls_ca else "insecure = true\n")
    (home / "config.toml").write_text(f'[superlink]\ndefault = "fleet"\n\n[superlink.fleet]\n{conn}')
    return home


def _run_flower(rundir: Path, opts: FleetServeOptions, tls, progress) -> None:
    app = rundir / APP_DIR
    app.mkdir(exist_ok=True)
    (app / "pyproject.toml").write_text(_PYPROJECT)
    (app / "README.md").write_text("Written by `edgetrain fleet serve`: the Flower App its ServerApp and ClientApp "
                                   "come from (edgetrain.fleet.apps).\n")
    connect_host = "127.0.0.1" if opts.listen in ("0.0.0.0", "::") else opts.listen
    if tls:
        connect_host = "localhost" if _is_loopback(connect_host) else connect_host
    home = _flwr_home(rundir, f"{connect_host}:{opts.port}", tls[2] if tls else None)
    tag = procs.new_tag("serve")
    env = procs.flower_env(tag, home)
    argv = [procs.flower_bin("flower-superlink"), "--host", opts.listen, "--port", str(opts.port),
            "--disable-runtime-dependency-installation", "--database", str(rundir / "superlink.db")]
    argv += (["--ssl-certfile", tls[0], "--ssl-keyfile", tls[1], "--ssl-ca-certfile", tls[2]] if tls else ["--insecure"])
    if procs.port_open(connect_host, opts.port):
        raise UsageError(f"port {opts.port} on {opts.listen} is already in use", "--port", "choose another --port")
    logs = rundir / "logs"
    started: list[subprocess.Popen] = []
    stop = {"sig": None}

    def on_signal(signum, frame):
        stop["sig"] = signum
        raise KeyboardInterrupt

    old = procs.stop_signals(on_signal)
    watchdog = procs.Watchdog(tag)
    try:
        link = procs.spawn(argv, env, logs / "superlink.log")
        started.append(link)
        procs.wait_port(connect_host, opts.port, link, 60, logs / "superlink.log", "the Flower SuperLink")
        report(progress, "serve", final=True, message=f"coordinator listening on {opts.listen}:{opts.port}"
               + (" (TLS)" if tls else " (no TLS" + (", loopback only)" if _is_loopback(opts.listen) else ")")))
        run = procs.spawn([procs.flower_bin("flwr"), "run", str(app), "--stream", "--run-config",
                           f'edgetrain="{rundir / store.SPEC}"'], env, logs / "flwr-run.log")
        started.append(run)
        seen = -1
        while True:
            state = store.read_state(rundir) or {}
            if state.get("completed", 0) != seen:
                seen = state.get("completed", 0)
                if state.get("rounds"):
                    r = state["rounds"][-1]
                    left = {k: len(r.get(k, [])) for k in ("timed_out", "failed", "refused") if r.get(k)}
                    report(progress, "round", seen, opts.rounds, final=True,
                           message=f"round {r['round']}: " + (f"{r['updates']} update(s)" if r.get("updated") else
                                                              "no update accepted (global weights unchanged)")
                           + "".join(f", {n} {k.replace('_', ' ')}" for k, n in left.items())
                           + f", held-out top-1 {r['accuracy']:.4f}, {r['bytes_up']} bytes up")
            if state.get("finished"):  # the devices are being told; let that finish (flwr run exits)
                try:
                    run.wait(timeout=max(coord.GOODBYE_SECONDS, opts.round_timeout) + 10)
                except subprocess.TimeoutExpired:
                    pass
                break
            if link.poll() is not None:
                raise RunFailed(f"the Flower SuperLink exited (code {link.returncode}): "
                                f"{procs.last_line(logs / 'superlink.log')}", str(logs / "superlink.log"), "see the log")
            if run.poll() is not None:
                time.sleep(1.0)  # the state file is written before flwr run returns
                state = store.read_state(rundir) or {}
                if state.get("finished"):
                    break
                raise RunFailed(f"the federated run stopped after round {state.get('completed', 0)}: "
                                f"{_run_error(rundir, logs)}", str(logs / "flwr-run.log"),
                                "see the logs; continue with --resume")
            time.sleep(0.5)
    except KeyboardInterrupt:
        sig = stop["sig"] or signal.SIGINT
        exc = RunFailed(f"stopped by {signal.Signals(sig).name} after round "
                        f"{(store.read_state(rundir) or {}).get('completed', 0)}", str(rundir),
                        "continue with --resume")
        exc.exit_code = 128 + int(sig)
        raise exc from None
    finally:
        procs.kill_tagged(tag, started)
        watchdog.close()
        for s, h in old.items():
            signal.signal(s, h)


def _run_error(rundir: Path, logs: Path) -> str:
    text = (logs / "flwr-run.log").read_text(errors="replace") if (logs / "flwr-run.log").exists() else ""
    for line in reversed(text.splitlines()):
        if "Error" in line or "error" in line:
            import re

            return re.sub(r"\x1b\[[0-9;]*m", "", line).strip()[:300]
    return procs.last_line(logs / "flwr-run.log")


# --- join ---------------------------------------------------------------------------------------------

def join(address: str, opts: FleetJoinOptions, progress: ProgressFn | None = None) -> JoinResult:
    _need_flower()
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UsageError(f"cannot read ADDRESS '{address[:80]}'", "ADDRESS", "give HOST:PORT, e.g. 192.168.1.10:9092")
    if not opts.data.startswith(BUILTIN_PREFIX) and not Path(opts.data).exists():
        raise UsageError("data not found", opts.data, "give an image folder, an .npz file or builtin:digits")
    device = opts.profile()  # a bad name is one line now, not in every round
    ca = _check_file(opts.tls_ca, "--tls-ca")
    from ..fileio import check_folder_outside_data

    check_folder_outside_data(opts.state, "-o", {"--data": opts.data})
    state = Path(opts.state).resolve()
    if state.exists() and not state.is_dir():
        raise UsageError("the state folder is a file", str(state), "give a folder")
    state.mkdir(parents=True, exist_ok=True)
    fclient.device_id(state)  # this device's key, kept across rejoins (the coordinator counts its rounds by it)
    for f in (fclient.REFUSED, fclient.DONE, fclient.CURRENT):
        (state / f).unlink(missing_ok=True)
    name = opts.name or socket.gethostname()
    data = opts.data if opts.data.startswith(BUILTIN_PREFIX) else str(Path(opts.data).resolve())
    model = opts.model
    if model and (Path(model).is_file() or Path(f"{model}-symbol.json").is_file()):
        model = str(Path(model).resolve())  # the ClientApp runs in Flower's working folder, not this one
    settings = {"name": name, "data": data, "state": str(state), "device": None if device is None else
                (str(Path(opts.device).resolve()) if Path(str(opts.device)).is_file() else str(opts.device)),
                # capped here, once: every round's ClientApp process would cap it again, and warn again
                "threads": None if opts.thread_cap() is None else runtime.cap_to_cores(opts.thread_cap()),
                "memory_budget": opts.budget_mb(), "model": model,
                "params": str(Path(opts.params).resolve()) if opts.params else None}
    atomic_write_text(state / "join.json", json.dumps(settings, indent=2) + "\n", "fleet join")
    home = _flwr_home(state, address, ca)
    tag = procs.new_tag("join")
    env = procs.flower_env(tag, home)
    local = opts.local_port or procs.free_port()
    argv = [procs.flower_bin("flower-supernode"), "--superlink", address, "--port", str(local),
            "--node-config", f'edgetrain="{state / "join.json"}"']
    argv += ["--root-certificates", ca] if ca else ["--insecure"]
    if opts.max_wait:
        argv += ["--max-wait-time", str(opts.max_wait)]
    log = state / "logs" / "supernode.log"
    stop = {"sig": None}

    def on_signal(signum, frame):
        stop["sig"] = signum
        raise KeyboardInterrupt

    old = procs.stop_signals(on_signal)
    node = None
    watchdog = procs.Watchdog(tag)
    try:
        node = procs.spawn(argv, env, log)
        report(progress, "join", final=True, message=f"{name}: joined {address}" + (" (TLS)" if ca else " (no TLS)"))
        while True:
            if (state / fclient.REFUSED).exists():
                time.sleep(REFUSE_GRACE)  # the SuperNode is still sending the refusal to the coordinator
                doc = json.loads((state / fclient.REFUSED).read_text())
                raise UsageError(f"round {doc['round']}: {doc.get('what') or doc['error']}",
                                 doc.get("where") or str(state),
                                 doc.get("fix") or "join with the model and class list the coordinator trains")
            if (state / fclient.DONE).exists():
                time.sleep(DONE_GRACE)  # the SuperNode is still sending the answer to that last message
                break
            if node.poll() is not None:
                raise RunFailed(f"the Flower SuperNode exited (code {node.returncode}): {procs.last_line(log)}",
                                str(log), "is the coordinator running at ADDRESS?")
            time.sleep(0.5)
    except KeyboardInterrupt:
        sig = stop["sig"] or signal.SIGINT
        exc = RunFailed(f"stopped by {signal.Signals(sig).name}", str(state), "join again to continue")
        exc.exit_code = 128 + int(sig)
        raise exc from None
    finally:
        procs.kill_tagged(tag, [node] if node else [])
        watchdog.close()
        for s, h in old.items():
            signal.signal(s, h)
    done = json.loads((state / fclient.DONE).read_text())
    meta = fclient.committed(state)[0]
    asked, updates = int(done.get("asked", 0)), int(done.get("updates", 0))
    if asked and not updates:
        raise RunFailed(f"none of this device's {asked} round(s) reached the global model: "
                        f"{done.get('reason') or 'no reason given'}", f"coordinator {address}",
                        "fix the cause above on this device, then join the next run")
    return JoinResult(name=name, state=str(state), address=address, rounds_trained=int(meta.get("trained", 0)),
                      last_round=int(meta.get("round", 0)), final_accuracy=done.get("accuracy"),
                      rounds_asked=asked, updates_accepted=updates)
