"""zoo:NAME@pretrained: the model zoo's published weights, downloaded once into MXNet's cache and checked
against the published SHA-1; offline, a cached file is used and a missing one is one clear error.
No test touches the network: downloads come from a local HTTP server or fail against a closed port."""
from __future__ import annotations

import hashlib
import http.server
import io
import threading
import zipfile

import numpy as np
import pytest

from clitools import assert_user_error
from edgetrain.errors import UsageError

NAME = "mobilenetv2_0.25"
CLOSED_PORT = "http://127.0.0.1:9/"  # discard port: nothing listens, the connection is refused at once


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private MXNet cache and a model repository that cannot be reached."""
    monkeypatch.setenv("MXNET_HOME", str(tmp_path / "mxhome"))
    monkeypatch.setenv("MXNET_GLUON_REPO", CLOSED_PORT)
    return tmp_path / "mxhome" / "models"


@pytest.fixture
def published(tmp_path, monkeypatch):
    """Weights for NAME made here, registered in mxnet's table under their own SHA-1 (the test's stand-in
    for the published file): (params bytes, sha1, one weight to compare)."""
    from edgetrain import _lazy

    vision = _lazy.from_import("mxnet.gluon.model_zoo", "vision")
    model_store = _lazy.module("mxnet.gluon.model_zoo.model_store")
    mx = _lazy.mxnet()
    net = vision.get_model(NAME, pretrained=False)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 3, 32, 32)))
    net.save_parameters(str(tmp_path / "w.params"))
    blob = (tmp_path / "w.params").read_bytes()
    sha1 = hashlib.sha1(blob).hexdigest()
    monkeypatch.setitem(model_store._model_sha1, NAME, sha1)
    first = next(iter(net.collect_params().values())).data().asnumpy()
    return blob, sha1, first


def _first_weight(model):
    return next(iter(model.block.collect_params().values())).data().asnumpy()


def test_a_cached_file_with_the_published_checksum_is_used_offline(cache, published):
    from edgetrain.models import load_gluon

    blob, sha1, first = published
    cache.mkdir(parents=True)
    (cache / f"{NAME}-{sha1[:8]}.params").write_bytes(blob)
    model = load_gluon(f"zoo:{NAME}@pretrained", input_shape=(3, 32, 32))
    assert not model.random_weights and np.array_equal(_first_weight(model), first)
    assert any(str(cache) in n for n in model.notes)


class _Repo(http.server.BaseHTTPRequestHandler):
    files: dict = {}
    hits: list = []

    def do_GET(self):  # noqa: N802 - http.server's name
        self.hits.append(self.path)
        body = self.files.get(self.path)
        self.send_response(200 if body else 404)
        self.end_headers()
        if body:
            self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def repo(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Repo)
    _Repo.files, _Repo.hits = {}, []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("MXNET_GLUON_REPO", f"http://127.0.0.1:{server.server_address[1]}/")
    yield _Repo
    server.shutdown()


def _zip(member: str, blob: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(member, blob)
    return buf.getvalue()


def test_downloaded_once_into_the_mxnet_cache_then_used_from_it(cache, published, repo):
    from edgetrain.models import load_gluon

    blob, sha1, first = published
    name = f"{NAME}-{sha1[:8]}"
    repo.files[f"/gluon/models/{name}.zip"] = _zip(f"{name}.params", blob)
    for _ in range(2):
        model = load_gluon(f"zoo:{NAME}@pretrained", input_shape=(3, 32, 32))
        assert np.array_equal(_first_weight(model), first)
    assert repo.hits == [f"/gluon/models/{name}.zip"]  # once
    assert sorted(p.name for p in cache.iterdir()) == [f"{name}.params"]  # no temp or zip left behind


def test_a_download_with_another_checksum_is_refused_and_not_kept(cache, published, repo):
    from edgetrain.models import load_gluon

    blob, sha1, _ = published
    name = f"{NAME}-{sha1[:8]}"
    repo.files[f"/gluon/models/{name}.zip"] = _zip(f"{name}.params", blob + b"tampered")
    with pytest.raises(UsageError) as err:
        load_gluon(f"zoo:{NAME}@pretrained", input_shape=(3, 32, 32))
    assert "do not have the published SHA-1" in err.value.line()
    assert list(cache.iterdir()) == []


def test_the_published_table_name_with_a_wrong_file_is_refused(cli, tmp_path):
    """The real table's entry for NAME, a generated file in its place: the checksum refuses it."""
    from edgetrain import _lazy

    sha1 = _lazy.module("mxnet.gluon.model_zoo.model_store")._model_sha1[NAME]
    models = tmp_path / "mxhome" / "models"
    models.mkdir(parents=True)
    (models / f"{NAME}-{sha1[:8]}.params").write_bytes(b"\x00" * 4096)
    res = cli("inspect", f"zoo:{NAME}@pretrained", "--input-shape", "1,3,32,32",
              env={"MXNET_HOME": str(tmp_path / "mxhome"), "MXNET_GLUON_REPO": CLOSED_PORT})
    assert_user_error(res, 2, "SHA-1 is not the published", f"{NAME}-{sha1[:8]}.params")
    assert (models / f"{NAME}-{sha1[:8]}.params").read_bytes() == b"\x00" * 4096  # the user's file is left alone


def test_no_network_and_no_cached_file_is_one_line_naming_the_file_and_where_to_put_it(cli, tmp_path):
    from edgetrain import _lazy

    sha1 = _lazy.module("mxnet.gluon.model_zoo.model_store")._model_sha1[NAME]
    res = cli("export", f"zoo:{NAME}@pretrained", "-o", tmp_path / "m.onnx",
              env={"MXNET_HOME": str(tmp_path / "mxhome"), "MXNET_GLUON_REPO": CLOSED_PORT})
    models = tmp_path / "mxhome" / "models"
    assert_user_error(res, 2, "not cached and cannot be downloaded", f"{NAME}-{sha1[:8]}.params", str(models),
                      sha1)
    assert not (tmp_path / "m.onnx").exists() and list(models.iterdir()) == []


@pytest.mark.parametrize("ref,args,fragment", [
    ("zoo:not_a_net@pretrained", [], "unknown model zoo name 'not_a_net'"),
    (f"zoo:{NAME}@imagenet22k", [], "unknown weights 'imagenet22k'"),
    (f"zoo:{NAME}@pretrained", ["--params", "w.params"], "both pretrained weights and --params"),
])
def test_bad_pretrained_references_are_one_line(cli, tmp_path, ref, args, fragment):
    (tmp_path / "w.params").write_bytes(b"x")
    res = cli("inspect", ref, *args, cwd=tmp_path,
              env={"MXNET_HOME": str(tmp_path / "mxhome"), "MXNET_GLUON_REPO": CLOSED_PORT})
    assert_user_error(res, 2, fragment)
