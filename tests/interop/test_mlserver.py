"""tritonclient -> tensorgate -> MLServer 1.7.

MLServer has no binary tensors (a binary request is a 422) and ignores `binary_data` and the
list of requested outputs (test_mlserver_direct.py pins that down). Through tensorgate the
client must see neither limitation."""

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from interop_util import (assert_output_encoding, expect_error, make_input, output_names,
                          run_simple, simple_operands)

# ---------------------------------------------------------------- (a) (b) (c) encodings


def test_binary_inputs_binary_outputs(gw_ml):
    run_simple(gw_ml, in_bin=(True, True), out_bin=(True, True), seed=1)


def test_binary_inputs_default_outputs(gw_ml):
    """No outputs listed: tritonclient sets binary_data_output, so all come back binary."""
    a, b = simple_operands(2)
    result = gw_ml.infer("simple", [make_input("INPUT0", a, "INT32", True),
                                    make_input("INPUT1", b, "INT32", True)])
    assert sorted(output_names(result)) == ["OUTPUT0", "OUTPUT1"]
    assert_output_encoding(result, "OUTPUT0", True, a.nbytes)
    assert_output_encoding(result, "OUTPUT1", True, a.nbytes)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_json_inputs_json_outputs(gw_ml):
    run_simple(gw_ml, in_bin=(False, False), out_bin=(False, False), seed=3)


@pytest.mark.parametrize("in_bin,out_bin", [((True, False), (True, False)),
                                            ((False, True), (False, True)),
                                            ((True, False), (False, True))],
                         ids=["in-bin-json_out-bin-json", "in-json-bin_out-json-bin",
                              "in-bin-json_out-json-bin"])
def test_mixed_encodings(gw_ml, in_bin, out_bin):
    run_simple(gw_ml, in_bin=in_bin, out_bin=out_bin, seed=4)


def test_batch_of_one_and_larger_batch(gw_ml):
    run_simple(gw_ml, seed=5, batch=1)
    run_simple(gw_ml, seed=6, batch=64)


# ---------------------------------------------------------------- (d) requested outputs


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("wanted", ["OUTPUT0", "OUTPUT1"])
def test_only_the_requested_output(gw_ml, wanted, binary):
    a, b = simple_operands(7)
    result = gw_ml.infer(
        "simple", [make_input("INPUT0", a, "INT32", True), make_input("INPUT1", b, "INT32", False)],
        outputs=[httpclient.InferRequestedOutput(wanted, binary_data=binary)])
    assert output_names(result) == [wanted]
    assert_output_encoding(result, wanted, binary, a.nbytes)
    np.testing.assert_array_equal(result.as_numpy(wanted), a + b if wanted == "OUTPUT0" else a - b)


# ---------------------------------------------------------------- (e) identity_fp32


def fp32_samples(seed: int, shape=(5, 9)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-20, 20, size=shape)).astype(np.float32)
    f = np.finfo(np.float32)
    specials = [np.float32(1e-45), f.tiny, f.max, -f.max, f.eps, -0.0, 0.0, 0.1, 1 / 3, 16777217.0]
    x.flat[: len(specials)] = np.array(specials, dtype=np.float32)
    return x


@pytest.mark.parametrize("in_binary", [True, False], ids=["in-binary", "in-json"])
@pytest.mark.parametrize("out_binary", [True, False], ids=["out-binary", "out-json"])
def test_identity_fp32_round_trips_exactly(gw_ml, in_binary, out_binary):
    x = fp32_samples(11)
    result = gw_ml.infer("identity_fp32", [make_input("INPUT0", x, "FP32", in_binary)],
                         outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=out_binary)])
    assert output_names(result) == ["OUTPUT0"]
    assert_output_encoding(result, "OUTPUT0", out_binary, x.nbytes)
    got = result.as_numpy("OUTPUT0")
    assert got.dtype == np.float32 and got.shape == x.shape
    # Bit-exact, so -0.0 and subnormals count too.
    assert got.tobytes() == x.tobytes(), np.argwhere(got.view(np.uint32) != x.view(np.uint32))


# ---------------------------------------------------------------- (f) errors


def _simple_request(a, b, binary=True, datatype="INT32"):
    return [make_input("INPUT0", a, datatype, binary), make_input("INPUT1", b, "INT32", binary)]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_error_wrong_datatype(gw_ml, binary):
    a, b = simple_operands(12, batch=1)
    # FP32 has the same byte size as INT32: only a datatype check catches it.
    inputs = _simple_request(a.astype(np.float32), b, binary, datatype="FP32")
    expect_error(lambda: gw_ml.infer("simple", inputs), 400, "INPUT0", "FP32")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_error_wrong_shape(gw_ml, binary):
    a, b = simple_operands(13, batch=1)
    inputs = _simple_request(a[:, :15].copy(), b[:, :15].copy(), binary)
    expect_error(lambda: gw_ml.infer("simple", inputs), 400, "INPUT0")


def test_error_unknown_model(gw_ml):
    a, b = simple_operands(14, batch=1)
    expect_error(lambda: gw_ml.infer("no_such_model", _simple_request(a, b)), 404, "no_such_model")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_error_unknown_output(gw_ml, binary):
    a, b = simple_operands(15, batch=1)
    expect_error(lambda: gw_ml.infer("simple", _simple_request(a, b, binary),
                                     outputs=[httpclient.InferRequestedOutput("OUTPUT9", binary_data=binary)]),
                 400, "OUTPUT9")


def test_error_missing_input(gateway_mlserver):
    r = requests.post(f"{gateway_mlserver.base}/v2/models/simple/infer", json={"inputs": []}, timeout=10)
    assert r.status_code == 400, r.text
    assert "INPUT0" in r.json()["error"]


def test_error_messages_exact_wording(gw_ml):
    """The gateway's own wording (kept stable for clients that match on it)."""
    a, b = simple_operands(16, batch=1)
    e = expect_error(lambda: gw_ml.infer("simple", _simple_request(a.astype(np.float32), b, datatype="FP32")), 400)
    assert "input 'INPUT0': datatype FP32 does not match the model's INT32" in e.message()
    e = expect_error(lambda: gw_ml.infer("simple", _simple_request(a[:, :15].copy(), b[:, :15].copy())), 400)
    assert "input 'INPUT0': shape [1,15] does not match the model's [-1,16] at dimension 1" in e.message()
    e = expect_error(lambda: gw_ml.infer("nope", _simple_request(a, b)), 404)
    assert "unknown model 'nope'" in e.message()
    e = expect_error(lambda: gw_ml.infer("simple", _simple_request(a, b),
                                         outputs=[httpclient.InferRequestedOutput("OUTPUT9")]), 400)
    assert "unknown output 'OUTPUT9' requested from model 'simple'" in e.message()


def test_versions_from_mlservers_index(mlserver, gateway_mlserver):
    """MLServer lists a model's version in its repository index but not in its metadata; it
    serves /versions/1 itself, and so does the gateway (tolerance metadata_versions_from_index)."""
    direct = requests.get(f"{mlserver.base}/v2/models/simple", timeout=10).json()
    assert direct.get("versions") in (None, [])
    index = requests.post(f"{mlserver.base}/v2/repository/index", json={}, timeout=10).json()
    assert {"name": "simple", "version": "1"}.items() <= next(e for e in index if e["name"] == "simple").items()

    base = gateway_mlserver.base
    meta = requests.get(f"{base}/v2/models/simple", timeout=10).json()
    assert meta["versions"] == ["1"]
    a, b = simple_operands(21, batch=1)
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a.ravel().tolist()},
                       {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": b.ravel().tolist()}]}
    r = requests.post(f"{base}/v2/models/simple/versions/1/infer", json=body, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["model_version"] == "1"
    assert requests.get(f"{base}/v2/models/simple/versions/1/ready", timeout=10).status_code == 200
    r = requests.post(f"{base}/v2/models/simple/versions/2/infer", json=body, timeout=10)
    assert (r.status_code, r.json()) == (404, {"error": "model 'simple' has no version '2' (its versions are 1)"})
    index = requests.post(f"{base}/v2/repository/index", json={}, timeout=10).json()
    assert {"name": "simple", "version": "1", "state": "READY"}.items() <= next(
        e for e in index if e["name"] == "simple").items()


# ---------------------------------------------------------------- (g) metadata and health


def test_server_metadata_and_health(gw_ml):
    assert gw_ml.is_server_live()
    assert gw_ml.is_server_ready()
    meta = gw_ml.get_server_metadata()
    assert meta["name"] == "tensorgate"
    assert isinstance(meta["version"], str) and meta["version"]
    assert "binary_tensor_data" in meta["extensions"]


def test_model_metadata_through_gateway(gw_ml):
    simple = gw_ml.get_model_metadata("simple")
    assert simple["name"] == "simple"
    assert [(t["name"], t["datatype"], t["shape"]) for t in simple["inputs"]] == [
        ("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])]
    assert [(t["name"], t["datatype"], t["shape"]) for t in simple["outputs"]] == [
        ("OUTPUT0", "INT32", [-1, 16]), ("OUTPUT1", "INT32", [-1, 16])]
    ident = gw_ml.get_model_metadata("identity_fp32")
    assert [(t["name"], t["datatype"], t["shape"]) for t in ident["inputs"]] == [("INPUT0", "FP32", [-1, -1])]
    assert [(t["name"], t["datatype"], t["shape"]) for t in ident["outputs"]] == [("OUTPUT0", "FP32", [-1, -1])]
    with pytest.raises(InferenceServerException) as info:
        gw_ml.get_model_metadata("no_such_model")
    assert info.value.status() == "404"


def test_model_ready(gw_ml):
    assert gw_ml.is_model_ready("simple")
    assert gw_ml.is_model_ready("identity_fp32")
    assert not gw_ml.is_model_ready("no_such_model")


def test_repository_index(gw_ml):
    index = gw_ml.get_model_repository_index()
    names = {m["name"] for m in index}
    assert {"simple", "identity_fp32"} <= names, index


def test_response_id(gw_ml):
    """`id` is echoed when the request has one and absent otherwise (Triton's rule), even
    though MLServer makes up a UUID for requests without one."""
    a, b = simple_operands(17, batch=1)
    with_id = gw_ml.infer("simple", _simple_request(a, b), request_id="req-42")
    assert with_id.get_response().get("id") == "req-42"
    without = gw_ml.infer("simple", _simple_request(a, b))
    assert "id" not in without.get_response(), without.get_response()


# ---------------------------------------------------------------- classification


@pytest.mark.parametrize("in_binary,out_binary", [(True, True), (False, False), (True, False)])
def test_class_count_for_a_backend_without_the_extension(gw_ml, in_binary, out_binary):
    """MLServer ignores `classification` (test_mlserver_direct.py); the gateway applies it,
    so tritonclient's class_count works against it as against Triton."""
    rng = np.random.default_rng(17)
    x = rng.standard_normal((3, 12)).astype(np.float32)
    x[0, 7] = x[0, 2]  # a tie: the lower index comes first
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=in_binary)
    wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=out_binary, class_count=4)
    result = gw_ml.infer("identity_fp32", [inp], outputs=[wanted])
    out = result.get_output("OUTPUT0")
    assert out["datatype"] == "BYTES"
    assert out["shape"] == [3, 4]
    got = [[v if isinstance(v, bytes) else v.encode() for v in row]
           for row in result.as_numpy("OUTPUT0").tolist()]
    want = []
    for row in x:
        order = sorted(range(len(row)), key=lambda i: (-float(row[i]), i))[:4]
        want.append([f"{float(row[i]):.6f}:{i}".encode() for i in order])
    assert got == want
