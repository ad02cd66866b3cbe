"""edgetrain fleet end to end: a real coordinator and real devices as separate processes talking Flower
on loopback (SuperLink, SuperNodes, ServerApp/ClientApp processes), tiny data, few rounds, every wait
bounded. Every process a test starts (and every process Flower starts for it) carries a mark in its
environment and is SIGKILLed in the fixture's teardown; the teardown fails if one survives."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from clitools import assert_user_error, run_edgetrain  # noqa: E402
from fleettools import (MODEL, RUN_TIMEOUT, fault_free, fleet_of, free_port, make_shares, marked,  # noqa: E402
                        report, wait_for)


@pytest.fixture(scope="module")
def shares(tmp_path_factory):
    return make_shares(tmp_path_factory)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("fleet-cache")  # the engine's export cache, private to these tests


@pytest.fixture
def fleet(tmp_path, shares, cache):
    yield from fleet_of(tmp_path, shares, cache)

def _only_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.slow
def test_three_devices_train_the_global_model_round_by_round(fleet, tmp_path, shares):
    run = tmp_path / "run"
    fleet.serve(run, "--rounds", 2, "--min-clients", 3, "--codec", "int8", "--epochs", 2, "--json", tmp_path / "r.json")
    for d in range(3):
        fleet.join(f"device{d}", shares["devices"][d], "--device", "rpi4b-4gb", "--json", tmp_path / f"d{d}.json")
    code, _, err = fleet.wait("serve")
    assert code == 0, err
    assert not marked(f"{fleet.mark}:serve:")  # the coordinator stopped every Flower process it started
    assert "listening on 127.0.0.1" in err and "no TLS, loopback only" in err  # it says where it listens
    res = report(run)
    assert res == json.loads((tmp_path / "r.json").read_text())
    assert res["passed"] and res["rounds_completed"] == 2 and not res["tls"]
    n = 10 * 32 + 10
    for r in res["rounds"]:
        assert sorted(p["client"] for p in r["participants"]) == ["device0", "device1", "device2"]
        assert r["updated"] and not r["refused"] and not r["failed"] and not r["timed_out"]
        # per device: the output layer's change and its SCAFFOLD control variate's, each as int8 codes + (lo, scale)
        # per tensor; down: the global weights and control variate as float32
        assert r["bytes_up"] == 3 * 2 * (2 * 8 + n)
        assert r["bytes_up_fp32"] == 3 * 2 * 4 * n and r["bytes_down"] == 3 * 2 * 4 * n
        for p in r["participants"]:  # per-device time, memory and modelled energy on its profile
            assert p["seconds"] > 0 and p["peak_rss_mb"] > 0 and p["joules"] > 0 and p["num_examples"] > 0
            assert p["device"] == "rpi4b-4gb" and "model" in p["energy_provenance"]
    assert res["uplink_reduction"] >= 3.5
    accs = [res["initial_accuracy"]] + [r["accuracy"] for r in res["rounds"]]
    assert accs[-1] > accs[0] + 0.15, accs  # digits 5-9 were unknown to the base: the fleet taught them
    # the global weights on disk are the ones the report's accuracy is of
    from edgetrain.fleet.store import load_global
    from edgetrain.fleet.local import Evaluator, LocalSpec

    ev = Evaluator(LocalSpec(model=MODEL, data=shares["val"], workdir=str(tmp_path / "ev"), threads=1), shares["val"])
    assert abs(ev.top1(load_global(run, 2)) - res["final_accuracy"]) < 1e-9
    html = (run / "fleet-report.html").read_text()
    assert "<section id='fleet'>" in html and "device2" in html
    for d in range(3):
        code, _, err = fleet.wait(f"device{d}", timeout=60)
        assert code == 0, err
        dres = json.loads((tmp_path / f"d{d}.json").read_text())
        assert dres["rounds_trained"] == 2 and dres["last_round"] == 2 and dres["updates_accepted"] == 2
    raw = list((tmp_path / "device0").rglob("*.npz"))  # the device keeps state, never a copy of the data
    assert {p.name for p in raw} == {"state.npz"}, raw  # the last round committed by the goodbye
    assert [d["client"] for d in res["devices"]] == ["device0", "device1", "device2"]
    assert all(d["asked"] == d["updates"] == 2 for d in res["devices"])


@pytest.mark.slow
def test_last2_the_devices_train_the_tail_and_only_the_tail_travels(fleet, tmp_path, shares):
    """--train-layers last:2: each device trains the last conv layer, its BatchNorm and the output layer
    (MXNet, the frozen part in ONNX Runtime); exactly those arrays travel, the running statistics as
    float32, the rest int8 with a control variate each; the report's accuracy is of the global arrays."""
    run = tmp_path / "run"
    fleet.serve(run, "--rounds", 2, "--min-clients", 2, "--codec", "int8", "--epochs", 2, "--train-layers", "last:2")
    for d in range(2):
        fleet.join(f"device{d}", shares["devices"][d], "--device", "rpi4b-4gb")
    code, out, err = fleet.wait("serve")
    assert code == 0, err
    res = report(run)
    assert res["passed"] and res["rounds_completed"] == 2
    from edgetrain.fleet.store import load_global
    from edgetrain.fleet.local import Evaluator, LocalSpec

    tail = {"digits_conv2_weight": (32, 32, 3, 3), "digits_batchnorm2_gamma": (32,), "digits_batchnorm2_beta": (32,),
            "digits_batchnorm2_running_mean": (32,), "digits_batchnorm2_running_var": (32,),
            "digits_dense0_weight": (10, 32), "digits_dense0_bias": (10,)}
    # BatchNorm trains in training mode (last:N): its running statistics follow the data and travel, averaged
    stats = {"digits_batchnorm2_running_mean", "digits_batchnorm2_running_var"}
    for r in (0, 2):  # the starting arrays and the last round's (round 1's were deleted after round 2's state)
        assert {k: v.shape for k, v in load_global(run, r).items()} == tail
    assert sorted(p.name for p in run.glob("*-000[0-9].npz")) == ["control-0002.npz", "global-0000.npz",
                                                                  "global-0002.npz", "momentum-0002.npz"]
    assert set(load_global(run, 2, "control")) == set(tail) - stats
    sizes = {k: int(np.prod(s)) for k, s in tail.items()}
    up = sum(4 * n if k in stats else 8 + n for k, n in sizes.items()) + sum(8 + n for k, n in sizes.items()
                                                                            if k not in stats)
    down = 4 * (sum(sizes.values()) + sum(n for k, n in sizes.items() if k not in stats))
    for r in res["rounds"]:
        assert sorted(p["client"] for p in r["participants"]) == ["device0", "device1"]
        assert r["bytes_up"] == 2 * up and r["bytes_down"] == 2 * down
        assert all(p["joules"] > 0 and p["peak_rss_mb"] > 0 for p in r["participants"])
    accs = [res["initial_accuracy"]] + [r["accuracy"] for r in res["rounds"]]
    assert accs[-1] > accs[0] + 0.15, accs
    ev = Evaluator(LocalSpec(model=MODEL, data=shares["val"], workdir=str(tmp_path / "ev"), threads=1,
                             train_layers="last:2"), shares["val"])
    assert abs(ev.top1(load_global(run, 2)) - res["final_accuracy"]) < 1e-9
    from edgetrain.run_report import STYLE

    page = (run / "fleet-report.html").read_text()  # the run report's page, with the fleet's section
    assert STYLE in page and "<section id='fleet'>" in page and "--train-layers last:2" in page
    assert all(f"<td>{r['accuracy']:.4f}</td>" in page for r in res["rounds"])
    for d in range(2):
        assert fleet.wait(f"device{d}", timeout=60)[0] == 0


@pytest.mark.slow
def test_2bit_devices_keep_their_residual_between_rounds(tmp_path_factory, shares, cache):
    """Read from the fault-free 2-bit run (two devices, two rounds) the kill tests of tests/test_fleet_faults.py
    compare with: made once a session."""
    _, res, folder = fault_free(tmp_path_factory, shares, cache, "reference")
    assert res["uplink_reduction"] >= 12
    from edgetrain.fleet.client import committed

    residual = committed(folder / "dev0")[2]
    assert residual and all(np.abs(v).max() > 0 for v in residual.values())  # what 2-bit dropped, kept


def _certs(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for localhost/127.0.0.1 signed by it (PEM files)."""
    x509 = pytest.importorskip("cryptography.x509")
    import datetime
    import ipaddress

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("edgetrain test CA")).issuer_name(name("edgetrain test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(name("localhost")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


@pytest.mark.slow
def test_tls_on_loopback_with_generated_certificates(fleet, tmp_path, shares):
    ca, cert, key = _certs(tmp_path)
    run = tmp_path / "run"
    fleet.serve(run, "--rounds", 1, "--min-clients", 1, "--tls-cert", cert, "--tls-key", key, "--tls-ca", ca)
    fleet.join("device0", shares["devices"][0], "--tls-ca", ca)
    code, _, err = fleet.wait("serve")
    assert code == 0, err
    assert "(TLS)" in err
    res = report(run)
    assert res["tls"] and res["rounds_completed"] == 1 and len(res["rounds"][0]["participants"]) == 1
    assert fleet.wait("device0", timeout=60)[0] == 0
    # the coordinator really speaks TLS: a plain-HTTP request to its port gets no HTTP answer
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", fleet.port, timeout=5)
    # the TLS server drops or answers with non-HTTP bytes: RemoteDisconnected / BadStatusLine
    # (HTTPException), or a reset / timeout (OSError)
    with pytest.raises((http.client.HTTPException, OSError)):
        conn.request("GET", "/")
        conn.getresponse()


@pytest.mark.slow
def test_a_slow_device_is_left_out_and_a_killed_device_rejoins(fleet, tmp_path, shares):
    """Round 1: device2 takes longer than the round timeout: the round ends without it. Round 2:
    device1 loses power while training (SIGKILL to it and everything Flower started for it); the round
    completes with the others, device1 joins again, resumes from its own state and trains round 3."""
    from edgetrain.fleet.client import committed

    run = tmp_path / "run"
    fleet.serve(run, "--rounds", 3, "--min-clients", 3, "--round-timeout", 25, "--codec", "2bit")
    fleet.join("device0", shares["devices"][0])
    # device1 stays in round 2 long enough to be killed there, whatever the speed of this machine
    fleet.join("device1", shares["devices"][1], env={"EDGETRAIN_FLEET_TEST_DELAY": "2:120"})
    fleet.join("device2", shares["devices"][2], env={"EDGETRAIN_FLEET_TEST_DELAY": "1:60"})
    state1 = tmp_path / "device1"
    wait_for(lambda: (state1 / "delayed-training-2").exists(), RUN_TIMEOUT, "device1 in round 2")
    before = committed(state1)[0]  # round 1 committed: round 2's instruction said the coordinator has it
    fleet.kill("device1")
    assert before["round"] == 1
    fleet.start("device1b", "fleet", "join", f"127.0.0.1:{fleet.port}", "--data", shares["devices"][1], "-o", state1,
                "--name", "device1", "--threads", 1)
    code, _, err = fleet.wait("serve")
    assert code == 0, err
    res = report(run)
    r1, r2, r3 = res["rounds"]
    names = lambda r: sorted(p["client"] for p in r["participants"])  # noqa: E731
    assert "device2" not in names(r1) and [x["client"] for x in r1["timed_out"]] == ["device2"] and r1["updated"]
    assert not r1["failed"] and not r2["failed"]  # each left-out device once, by its name
    # device1 was killed; device2 is still in its slow round 1 (a SuperNode takes one message at a time)
    assert "device1" not in names(r2) and sorted(x["client"] for x in r2["timed_out"]) == ["device1", "device2"]
    assert r2["updated"]
    assert "device1" in names(r3)
    log = (run / "coordinator-rounds.log").read_text()
    assert "round 1: device2 timed out" in log and "round 2: device1 timed out" in log
    after = committed(state1)[0]
    assert after["round"] == 3 and after["trained"] == before["trained"] + 1
    assert fleet.wait("device1b", timeout=60)[0] == 0
    assert not marked(f"{fleet.mark}:device1b:")  # a device that finished stopped its Flower processes


@pytest.mark.slow
def test_a_coordinator_killed_and_restarted_resumes_after_the_last_completed_round(fleet, tmp_path, shares):
    run = tmp_path / "run"
    fleet.serve(run, "--rounds", 3, "--min-clients", 2)
    fleet.join("device0", shares["devices"][0])
    fleet.join("device1", shares["devices"][1])
    state = run / "fleet-state.json"
    wait_for(lambda: state.exists() and json.loads(state.read_text())["completed"] >= 1, RUN_TIMEOUT, "round 1")
    fleet.kill("serve")
    first = json.loads(state.read_text())
    done = first["completed"]
    assert 1 <= done < 3
    assert_user_error(run_edgetrain("fleet", "serve", MODEL, "--val", shares["val"], "-o", run, "--port", fleet.port),
                      2, "RUNDIR holds a fleet run", "--resume")
    assert_user_error(run_edgetrain("fleet", "serve", MODEL, "--val", shares["val"], "-o", run, "--port", fleet.port,
                                    "--resume", "--train-layers", "last:2"), 2, "different train_layers")
    fleet.serve(run, "--rounds", 3, "--min-clients", 2, "--resume", key="serve2")
    code, out, err = fleet.wait("serve2")
    assert code == 0, err
    res = report(run)
    assert res["resumed_after"] == done and res["rounds_completed"] == 3
    assert [r["round"] for r in res["rounds"]] == [1, 2, 3]
    assert res["rounds"][:done] == first["rounds"]  # the completed rounds are kept, not redone
    for d in range(2):
        assert fleet.wait(f"device{d}", timeout=60)[0] == 0


@pytest.mark.slow
def test_a_device_with_a_class_the_fleet_lacks_is_refused_and_one_with_some_of_its_classes_takes_part(
        fleet, tmp_path, shares):
    """The coordinator's class list is the fleet's: a device holding digits 0-4 only (five class names)
    trains with the others; a device with a class the fleet does not have stops with one line (exit 2) and
    is listed once, by name, under `refused`."""
    from edgetrain.fleet.demo import _digits

    x, y = _digits()
    keep = np.flatnonzero(y < 5)[:80]
    for name, names in (("five", [str(d) for d in range(5)]), ("odd", ["0", "1", "2", "3", "x"])):
        np.savez(tmp_path / f"{name}.npz", data=(x[keep] * 255).round().astype(np.uint8), label=y[keep],
                 class_names=np.array(names))
    run = tmp_path / "run"
    fleet.serve(run, "--rounds", 1, "--min-clients", 3, "--round-timeout", 90)
    fleet.join("good", shares["devices"][0])
    fleet.join("five", tmp_path / "five.npz")
    fleet.join("odd", tmp_path / "odd.npz")
    code, _, err = fleet.wait("odd")
    line = _only_error_line(err)
    assert code == 2 and "model mismatch" in line and "class 'x' is not among the fleet's 10 classes" in line, err
    code, _, err = fleet.wait("serve")
    assert code == 0, err
    r = report(run)["rounds"][0]
    assert [p["client"] for p in r["participants"]] == ["five", "good"]
    assert [x["client"] for x in r["refused"]] == ["odd"] and "class 'x'" in r["refused"][0]["reason"]
    assert not r["failed"] and not r["timed_out"]
    assert "odd refused" in (run / "coordinator-rounds.log").read_text()
    assert fleet.wait("five", timeout=60)[0] == 0


@pytest.mark.slow
def test_the_one_machine_demo_runs_a_whole_fleet(fleet, tmp_path):
    fleet.start("demo", tmp_path / "demo", "--rounds", 1, module="edgetrain.fleet.demo")
    code, out, err = fleet.wait("demo")
    assert code == 0, err
    res = report(tmp_path / "demo" / "run")
    assert res["rounds_completed"] == 1 and len(res["rounds"][0]["participants"]) == 3
    assert "fleet-report.html" in out
    assert not marked(f"{fleet.mark}:demo:")  # the demo stops every process it started


# --- one-line errors before any Flower process starts ------------------------------------------------

def test_serve_refuses_bad_input_in_one_line(tmp_path, shares, cache):
    env = {"EDGETRAIN_CACHE_DIR": str(cache)}
    base = ["fleet", "serve", MODEL, "--val", shares["val"], "-o", tmp_path / "run"]
    assert_user_error(run_edgetrain("fleet", "serve", MODEL, "--val", tmp_path / "nope.npz", "-o", tmp_path / "r",
                                    env=env), 2, "nope.npz")
    assert_user_error(run_edgetrain(*base, "--tls-cert", shares["val"], env=env), 2, "--tls-cert", "--tls-key")
    assert_user_error(run_edgetrain(*base, "--codec", "4bit", env=env), 2, "--codec")
    assert_user_error(run_edgetrain(*base, "--fraction", "0", env=env), 2, "--fraction")
    assert_user_error(run_edgetrain(*base, "--resume", env=env), 2, "--resume", "no fleet run")
    assert_user_error(run_edgetrain(*base, "--train-layers", "bogus", env=env), 2, "--train-layers", "bogus")
    assert_user_error(run_edgetrain(*base, "--train-layers", "last:9", env=env), 2, "--train-layers last:9",
                      "layer(s) that can train from the end")
    (tmp_path / "file").write_text("x")
    assert_user_error(run_edgetrain("fleet", "serve", MODEL, "--val", shares["val"], "-o", tmp_path / "file", env=env),
                      2, "RUNDIR is a file")
    assert not (tmp_path / "run").exists()  # nothing half-made


def test_join_refuses_bad_input_in_one_line(tmp_path, shares):
    base = ["fleet", "join"]
    assert_user_error(run_edgetrain(*base, "nowhere", "--data", shares["devices"][0], "-o", tmp_path / "s"), 2, "ADDRESS")
    assert_user_error(run_edgetrain(*base, "127.0.0.1:1", "--data", tmp_path / "none.npz", "-o", tmp_path / "s"),
                      2, "data not found")
    assert_user_error(run_edgetrain(*base, "127.0.0.1:1", "--data", shares["devices"][0], "-o", tmp_path / "s",
                                    "--device", "toaster"), 2, "toaster")
    assert_user_error(run_edgetrain(*base, "127.0.0.1:1", "--data", shares["devices"][0], "-o", tmp_path / "s",
                                    "--tls-ca", tmp_path / "none.pem"), 2, "--tls-ca")


def test_join_gives_up_after_max_wait_without_a_coordinator(tmp_path, shares):
    res = run_edgetrain("fleet", "join", f"127.0.0.1:{free_port()}", "--data", shares["devices"][0], "-o",
                        tmp_path / "s", "--max-wait", "3", timeout=120)
    assert res.code == 1 and "SuperNode exited" in _only_error_line(res.err)


@pytest.mark.parametrize("name", ["serve", "join"])
def test_every_option_has_its_flag(name):
    import click

    from edgetrain.cli.fleet import fleet as group
    from edgetrain.options import FleetJoinOptions, FleetServeOptions, flag_of

    model = {"serve": FleetServeOptions, "join": FleetJoinOptions}[name]
    command = group.get_command(click.Context(group), name)
    params = {p.name: p for p in command.params if isinstance(p, click.Option)}
    assert set(params) - {"json_path"} == set(model.fields)
    for field, info in model.fields.items():
        assert flag_of(model, field) in params[field].opts
        assert params[field].required == info.required
