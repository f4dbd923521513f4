"""`tensorgate worker --model-repository`: the ONNX models of tests/fixtures/onnx/repo (run by
tract), checked with the real tritonclient.http against onnxruntime run here on the same
model files (FP32 with np.allclose(rtol=1e-4, atol=1e-5), integers and bools exactly), both
straight to the worker and through a `tensorgate serve` gateway in front of it (fixtures
onnx_worker and gateway_onnx, which serve a private copy of the repository)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Dict

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from interop_util import assert_output_encoding, expect_error, make_input

RTOL, ATOL = 1e-4, 1e-5
DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32",
             np.dtype(np.int64): "INT64", np.dtype(np.bool_): "BOOL"}
# (model, version): every version the worker serves (Triton's default policy: mlp's latest).
CASES = [("mlp", "2"), ("cnn", "1"), ("intbool", "1"), ("intbool", "2")]


def _client(server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url=server.url, connection_timeout=10.0,
                                            network_timeout=30.0)


@pytest.fixture(params=["worker", "gateway"])
def client(request):
    """tritonclient -> worker, or tritonclient -> tensorgate serve -> worker."""
    server = request.getfixturevalue("onnx_worker" if request.param == "worker" else "gateway_onnx")
    c = _client(server)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def worker_client(onnx_worker):
    c = _client(onnx_worker)
    try:
        yield c
    finally:
        c.close()


def distinct_rows(rng: np.random.Generator, rows: int) -> np.ndarray:
    """Rows of 4 distinct integers, so that ArgMax has no ties to break."""
    return np.stack([rng.choice(np.arange(-50, 51), size=4, replace=False)
                     for _ in range(rows)]).astype(np.int32)


def feeds_for(model: str, seed: int) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if model == "mlp":
        return {"INPUT": rng.standard_normal((3, 16)).astype(np.float32)}
    if model == "cnn":
        return {"IMAGE": rng.random((2, 1, 28, 28), dtype=np.float32)}
    a, b = distinct_rows(rng, 3), distinct_rows(rng, 3)
    b[0] = a[0, [1, 0, 2, 3]]  # two equal pairs: GREATER is false for A == B too
    return {"A": a, "B": b}


def reference(repo: Path, model: str, version: str, feeds) -> Dict[str, np.ndarray]:
    """onnxruntime's outputs for the model file the worker serves."""
    session = ort.InferenceSession(str(repo / model / version / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def infer(client, model, feeds, outputs, version="", binary=True):
    inputs = [make_input(n, a, DATATYPES[a.dtype], binary) for n, a in feeds.items()]
    return client.infer(model, inputs, model_version=version, outputs=outputs)


def assert_matches(result, want: Dict[str, np.ndarray], binary: bool) -> None:
    for name, expected in want.items():
        assert_output_encoding(result, name, binary, expected.nbytes)
        got = result.as_numpy(name)
        assert (got.dtype, got.shape) == (expected.dtype, expected.shape), name
        if expected.dtype == np.float32:
            assert np.allclose(got, expected, rtol=RTOL, atol=ATOL), \
                f"{name}: max |diff| {np.max(np.abs(got - expected))}"
        else:
            np.testing.assert_array_equal(got, expected, err_msg=name)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("model,version", CASES)
def test_infer_matches_onnxruntime(client, onnx_worker, model, version, binary):
    feeds = feeds_for(model, seed=100 + CASES.index((model, version)))
    want = reference(onnx_worker.repo, model, version, feeds)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in want]
    result = infer(client, model, feeds, outputs, version, binary)
    response = result.get_response()
    assert (response["model_name"], response["model_version"]) == (model, version)
    assert sorted(o["name"] for o in response["outputs"]) == sorted(want)
    assert_matches(result, want, binary)


def test_unversioned_infer_runs_latest_version(client, onnx_worker):
    """Without a version, intbool runs its highest version (2: SUM = A + B + 1)."""
    feeds = feeds_for("intbool", seed=7)
    want = reference(onnx_worker.repo, "intbool", "2", feeds)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in want]
    assert_matches(infer(client, "intbool", feeds, outputs), want, True)


@pytest.mark.parametrize("model", ["mlp", "intbool"])
def test_unversioned_infer_reports_the_version_it_ran(client, model):
    feeds = feeds_for(model, seed=8)
    outputs = [httpclient.InferRequestedOutput("PROBS" if model == "mlp" else "SUM")]
    assert infer(client, model, feeds, outputs).get_response()["model_version"] == "2"


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_classification_labels_and_order(client, onnx_worker, binary):
    labels = (onnx_worker.repo / "mlp" / "labels.txt").read_text().splitlines()
    feeds = feeds_for("mlp", seed=11)
    probs = reference(onnx_worker.repo, "mlp", "2", feeds)["PROBS"]
    out = httpclient.InferRequestedOutput("PROBS", binary_data=binary, class_count=3)
    result = infer(client, "mlp", feeds, [out], "2", binary)
    assert result.get_output("PROBS")["datatype"] == "BYTES"
    got = result.as_numpy("PROBS")
    assert got.shape == (3, 3)
    for row, p in zip(got.tolist(), probs):
        top = np.argsort(-p, kind="stable")[:3]
        assert np.all(-np.diff(p[top]) > 1e-3), f"near-tie in {p[top]}: pick another seed"
        parts = [(v.decode() if isinstance(v, bytes) else v).split(":") for v in row]
        assert [len(x) for x in parts] == [3, 3, 3], row
        assert [int(x[1]) for x in parts] == top.tolist(), (row, p)
        assert [x[2] for x in parts] == [labels[i] for i in top]
        np.testing.assert_allclose([float(x[0]) for x in parts], p[top], rtol=RTOL, atol=2e-6)


def test_model_config_states_the_batch_limit(client, worker_client):
    """tritonclient.http's get_model_config, on the worker and through a gateway: the
    config.pbtxt's max_batch_size and the dims without the batch dimension; the worker,
    which holds the model's labels, names a label file."""
    config = client.get_model_config("mlp")
    assert config["max_batch_size"] == 8, config
    assert config["input"] == [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": [16]}]
    assert config["output"][0]["dims"] == [10]
    assert client.get_model_config("intbool")["max_batch_size"] == 0
    assert worker_client.get_model_config("mlp")["output"][0]["label_filename"]


def test_repository_index_and_metadata(worker_client):
    index = worker_client.get_model_repository_index()
    states = {(m["name"], m.get("version")): m for m in index}
    for model, version in CASES:
        assert states[(model, version)]["state"] == "READY", index
    assert ("mlp", "1") not in states, "Triton's default policy serves mlp's latest version only"
    broken = [m for m in index if m["name"] == "broken"]
    assert [m["state"] for m in broken] == ["UNAVAILABLE"], index
    assert "model.onnx" in broken[0].get("reason", ""), broken

    meta = worker_client.get_model_metadata("mlp")
    assert meta["versions"] == ["2"]
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "INPUT", "datatype": "FP32", "shape": [-1, 16]}]
    assert meta["outputs"] == [{"name": "PROBS", "datatype": "FP32", "shape": [-1, 10]}]
    cnn = worker_client.get_model_metadata("cnn")
    assert [i["shape"] for i in cnn["inputs"]] == [[-1, 1, 28, 28]]
    assert [o["shape"] for o in cnn["outputs"]] == [[-1, 10]]
    feeds = feeds_for("mlp", seed=1)
    expect_error(lambda: infer(worker_client, "mlp", feeds,
                               [httpclient.InferRequestedOutput("PROBS")], "1"), 404, "mlp")


def test_load_and_unload(worker_client, onnx_worker):
    name = "cnn_loaded"
    shutil.copytree(onnx_worker.repo / "cnn", onnx_worker.repo / name)
    assert not worker_client.is_model_ready(name)
    feeds = feeds_for("cnn", seed=21)
    want = reference(onnx_worker.repo, name, "1", feeds)
    outputs = [httpclient.InferRequestedOutput("LOGITS", binary_data=True)]

    worker_client.load_model(name)
    assert worker_client.is_model_ready(name)
    assert worker_client.get_model_metadata(name)["versions"] == ["1"]
    assert_matches(infer(worker_client, name, feeds, outputs), want, True)

    worker_client.unload_model(name)
    assert not worker_client.is_model_ready(name)
    with pytest.raises(InferenceServerException) as unloaded:
        infer(worker_client, name, feeds, outputs)
    assert name in unloaded.value.message()
    index = [m for m in worker_client.get_model_repository_index() if m["name"] == name]
    assert [m["state"] for m in index] == ["UNAVAILABLE"], index

    worker_client.load_model(name)  # and back again
    assert_matches(infer(worker_client, name, feeds, outputs), want, True)

    reason = next(m["reason"] for m in worker_client.get_model_repository_index()
                  if m["name"] == "broken")
    with pytest.raises(InferenceServerException) as failed:
        worker_client.load_model("broken")
    assert reason in failed.value.message(), failed.value.message()
    assert not worker_client.is_model_ready("broken")
