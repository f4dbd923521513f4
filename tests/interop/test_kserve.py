"""tritonclient -> tensorgate -> a real KServe 0.21 ModelServer (kserve/addsub_server.py).

The gateway runs as `tensorgate serve --backend http://127.0.0.1:PORT` with listen addresses
only: no models list, no config. Everything it knows about the models it learns from KServe.

What KServe 0.21.0 really answers (observed on kserve/addsub_server.py with curl):

  GET  /v2                  200 {"name":"kserve","version":"0.21.0","extensions":["model_repository_extension"]}
  GET  /v2/health/ready     200 {"ready":true}
  GET  /v2/models           200 {"models":["addsub","double"]}
  GET  /v2/models/addsub    200 {"name":"addsub","versions":null,"platform":"",
                                 "inputs":[{"name":"INPUT0","datatype":"FP32","shape":[-1,4]},
                                           {"name":"INPUT1","datatype":"FP32","shape":[-1,4]}],
                                 "outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[-1,4]},
                                            {"name":"OUTPUT1","datatype":"FP32","shape":[-1,4]}]}
  GET  /v2/models/addsub/ready       200 {"name":"addsub","ready":true}
  GET  /v2/models/nope      404 {"error":"Model with name nope does not exist."}
  POST /v2/repository/index 404 {"detail":"Not Found"}   (no such route, despite the extension)
  GET  /v2/models/addsub/versions/2[/ready], POST .../versions/2/infer
                            501 {"error":"Model versioning not supported yet."}

  Infer (POST /v2/models/addsub/infer, Content-Type: application/json):
  - every body is answered with a string `id` (the request's, else a new UUID), and
    "model_version":null, "parameters":null, and "parameters":null on every output;
  - a NaN output is written as JSON null (orjson), and so is an infinity:
      {"model_name":"addsub","model_version":null,"id":"527c...","parameters":null,"outputs":[
       {"name":"OUTPUT0","shape":[1,4],"datatype":"FP32","parameters":null,"data":[null,2.0,3.0,4.0]},
       {"name":"OUTPUT1","shape":[1,4],"datatype":"FP32","parameters":null,"data":[null,0.0,1.0,2.0]}]}
  - no validation at all: shape [1,3] or datatype INT32 for a [-1,4] FP32 input is a 200; a
    missing input is 500 {"error":"KeyError : 'INPUT1'"}; a short data list is
    500 {"error":"ValueError : cannot reshape array of size 4 into shape (2,4)"};
  - a body without Content-Type: application/json is taken for a binary one:
    400 {"error":"received byte inputs, but the'inference-header-content-length' header is missing."}
  - a raw binary request (Inference-Header-Content-Length: 0) is
    400 {"error":"Unrecognized request format: Input is a zero-length, empty document: line 1 column 1 (char 0)"}
  - `classification` is ignored; binary responses carry Inference-Header-Content-Length but
    no Content-Type.
  - addsub (written like KServe's documented custom model) ignores the requested outputs and
    binary_data: all outputs, always JSON. double (written like KServe's own predictors)
    honours both.

The test_direct_* tests pin these facts down against KServe itself, so that a change in
KServe shows up as such and not as a gateway failure.
"""

import gzip
import json
import time

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from interop_util import assert_output_encoding, expect_error, make_input, output_names

IHCL = "Inference-Header-Content-Length"

# The gateway's 404 for a version in the path of a model that lists none (README, "Versions
# in the path"): metadata, ready and infer refuse it alike.
NO_VERSION_ERROR = "model 'addsub' lists no versions; address it without '/versions/2'"

# Bounds of the outage test's loops.
OUTAGE_POLLS = 8
OUTAGE_POLL_S = 0.25
RECOVERY_TIMEOUT_S = 30.0
RECOVERY_POLLS = 150


def operands(seed: int, batch: int = 3):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((batch, 4)) * 100).astype(np.float32)
    b = (rng.standard_normal((batch, 4)) * 100).astype(np.float32)
    return a, b


def addsub_inputs(a, b, in_bin=(True, True), datatype="FP32"):
    return [make_input("INPUT0", a, datatype, in_bin[0]), make_input("INPUT1", b, "FP32", in_bin[1])]


def run_addsub(client, in_bin=(True, True), out_bin=(True, True), seed=0, batch=3, **kwargs):
    """Infer addsub with these per-tensor encodings; check names, encodings and exact values."""
    a, b = operands(seed, batch)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=out_bin[0]),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=out_bin[1])]
    result = client.infer("addsub", addsub_inputs(a, b, in_bin), outputs=outputs, **kwargs)
    assert sorted(output_names(result)) == ["OUTPUT0", "OUTPUT1"]
    for name, binary, want in (("OUTPUT0", out_bin[0], a + b), ("OUTPUT1", out_bin[1], a - b)):
        assert_output_encoding(result, name, binary, want.nbytes)
        got = result.as_numpy(name)
        assert got.dtype == np.float32, f"{name} dtype {got.dtype}"
        assert got.shape == want.shape, f"{name} shape {got.shape} != {want.shape}"
        # Bit-exact: float32 sums written by KServe as JSON numbers survive exactly.
        assert got.tobytes() == want.tobytes(), f"{name}: {got} != {want}"
    return result


# ---------------------------------------------------------------- facts about KServe itself


def test_direct_kserve_metadata_and_listing(kserve):
    base = kserve.base
    r = requests.get(f"{base}/v2/models", timeout=10)
    assert (r.status_code, r.json()) == (200, {"models": ["addsub", "double", "half"]})
    r = requests.get(f"{base}/v2/models/addsub", timeout=10)
    assert r.status_code == 200
    meta = r.json()
    assert meta["versions"] is None and meta["platform"] == ""
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("INPUT0", "FP32", [-1, 4]), ("INPUT1", "FP32", [-1, 4])]
    r = requests.post(f"{base}/v2/repository/index", json={}, timeout=10)
    assert r.status_code == 404, r.text
    r = requests.get(f"{base}/v2/models/addsub/versions/2", timeout=10)
    assert (r.status_code, r.json()) == (501, {"error": "Model versioning not supported yet."})


def test_direct_kserve_writes_nan_as_null_and_does_not_validate(kserve):
    url = f"{kserve.base}/v2/models/addsub/infer"
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": ["NaN", 2, 3, 4]},
                       {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}
    r = requests.post(url, json=body, timeout=10)
    assert r.status_code == 200, r.text
    out = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert out == {"OUTPUT0": [None, 3.0, 4.0, 5.0], "OUTPUT1": [None, 1.0, 2.0, 3.0]}
    assert isinstance(r.json()["id"], str)
    # A [1,3] input for a [-1,4] model goes through: only the gateway validates.
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
                       {"name": "INPUT1", "shape": [1, 3], "datatype": "FP32", "data": [1, 1, 1]}]}
    r = requests.post(url, json=body, timeout=10)
    assert r.status_code == 200, r.text


def test_direct_kserve_refuses_raw_binary_and_ignores_classification(kserve):
    url = f"{kserve.base}/v2/models/double/infer"
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    r = requests.post(url, data=x.tobytes(), timeout=10,
                      headers={IHCL: "0", "Content-Type": "application/octet-stream"})
    assert r.status_code == 400, r.text
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}]}
    r = requests.post(url, json=body, timeout=10)
    assert r.status_code == 200, r.text
    (out,) = r.json()["outputs"]
    assert (out["datatype"], out["data"]) == ("FP32", [2.0, 4.0, 6.0, 8.0])


# ---------------------------------------------------------------- encodings


def test_json_in_json_out(gw_ks):
    run_addsub(gw_ks, in_bin=(False, False), out_bin=(False, False), seed=1)


def test_binary_in_binary_out(gw_ks):
    run_addsub(gw_ks, in_bin=(True, True), out_bin=(True, True), seed=2)


@pytest.mark.parametrize("in_bin,out_bin", [((True, False), (True, False)),
                                            ((False, True), (False, True)),
                                            ((True, False), (False, True))],
                         ids=["in-bin-json_out-bin-json", "in-json-bin_out-json-bin",
                              "in-bin-json_out-json-bin"])
def test_mixed_encodings(gw_ks, in_bin, out_bin):
    run_addsub(gw_ks, in_bin=in_bin, out_bin=out_bin, seed=3)


def test_batch_of_one_and_larger_batch(gw_ks):
    run_addsub(gw_ks, seed=4, batch=1)
    run_addsub(gw_ks, seed=5, batch=50)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_only_the_requested_output(gw_ks, binary):
    """addsub returns every output whatever is asked; the gateway returns only OUTPUT1."""
    a, b = operands(6)
    result = gw_ks.infer("addsub", addsub_inputs(a, b, (True, False)),
                         outputs=[httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary)])
    assert output_names(result) == ["OUTPUT1"]
    assert_output_encoding(result, "OUTPUT1", binary, a.nbytes)
    assert result.as_numpy("OUTPUT1").tobytes() == (a - b).tobytes()


def test_gzip_request_body(gw_ks):
    run_addsub(gw_ks, in_bin=(True, True), out_bin=(True, True), seed=7,
               request_compression_algorithm="gzip")
    run_addsub(gw_ks, in_bin=(False, False), out_bin=(False, True), seed=8,
               request_compression_algorithm="gzip")


def test_gzip_request_body_raw_http(gateway_kserve):
    """The same without tritonclient: a gzip JSON body, a JSON answer."""
    a, b = operands(9, batch=1)
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": a.ravel().tolist()},
                       {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": b.ravel().tolist()}],
            "outputs": [{"name": "OUTPUT0"}]}
    r = requests.post(f"{gateway_kserve.base}/v2/models/addsub/infer",
                      data=gzip.compress(json.dumps(body).encode()), timeout=10,
                      headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert r.status_code == 200, r.text
    (out,) = r.json()["outputs"]
    assert out["name"] == "OUTPUT0"
    assert np.array(out["data"], dtype=np.float32).tobytes() == (a + b).ravel().tobytes()


def test_direct_kserve_refuses_fp16_in_json(kserve):
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP16", "data": [1, 2, 3, 4]}]}
    r = requests.post(f"{kserve.base}/v2/models/half/infer", json=body, timeout=10)
    assert r.status_code == 400, r.text
    assert "Please use the binary data format" in r.json()["error"], r.text


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_fp16_reaches_kserve_in_binary(gw_ks, gateway_kserve, binary):
    """KServe reads binary tensors without listing the extension, and refuses FP16 in JSON:
    the gateway sends it binary, whatever the client sent (FP16 in JSON is the gateway's to
    accept)."""
    x = np.array([[1.0, 2.5, -3.0, 0.125], [0.0, -0.5, 1024.0, 6.0]], dtype=np.float16)
    if binary:
        result = gw_ks.infer("half", [make_input("INPUT0", x, "FP16", True)])
        got = result.as_numpy("OUTPUT0")
        assert got.dtype == np.float16
    else:
        body = {"inputs": [{"name": "INPUT0", "shape": [2, 4], "datatype": "FP16",
                            "data": x.astype(np.float64).ravel().tolist()}]}
        r = requests.post(f"{gateway_kserve.base}/v2/models/half/infer", json=body, timeout=10)
        assert r.status_code == 200, r.text
        (out,) = r.json()["outputs"]
        assert (out["datatype"], out["shape"]) == ("FP16", [2, 4])
        got = np.array(out["data"], dtype=np.float16).reshape(out["shape"])
    assert got.tobytes() == (2 * x).tobytes()


def test_raw_binary_request(gateway_kserve):
    """IHCL: 0 and the bytes of the only input of `double`. KServe itself refuses such a
    request (test_direct_*); through the gateway it works: the leading -1 is the batch
    dimension and a raw request a batch of one (src/protocol/raw.rs, Triton's rule), so the
    shape is [1,4], and the output comes back binary."""
    x = np.array([[-3.75, 0.5, 1e-3, 12345.5]], dtype=np.float32)
    r = requests.post(f"{gateway_kserve.base}/v2/models/double/infer", data=x.tobytes(), timeout=10,
                      headers={IHCL: "0", "Content-Type": "application/octet-stream"})
    assert r.status_code == 200, r.text
    assert IHCL in r.headers, dict(r.headers)
    result = httpclient.InferenceServerClient.parse_response_body(
        r.content, header_length=int(r.headers[IHCL]))
    assert output_names(result) == ["OUTPUT0"]
    assert_output_encoding(result, "OUTPUT0", True, x.nbytes)
    got = result.as_numpy("OUTPUT0")
    assert got.shape == (1, 4) and got.dtype == np.float32
    assert got.tobytes() == (2 * x).tobytes()


def test_raw_binary_request_of_two_rows_is_refused(gateway_kserve):
    x = np.zeros((2, 4), dtype=np.float32)
    r = requests.post(f"{gateway_kserve.base}/v2/models/double/infer", data=x.tobytes(), timeout=10,
                      headers={IHCL: "0", "Content-Type": "application/octet-stream"})
    assert r.status_code == 400, r.text
    assert r.json() == {"error": "raw binary request for input 'INPUT0': a body of 32 bytes does not "
                                 "match shape [-1,4] of FP32, which needs 16 bytes"}


def test_raw_binary_request_needs_a_model_with_one_input(gateway_kserve):
    r = requests.post(f"{gateway_kserve.base}/v2/models/addsub/infer", data=b"\0" * 16, timeout=10,
                      headers={IHCL: "0", "Content-Type": "application/octet-stream"})
    assert r.status_code == 400, r.text
    assert "exactly one input" in r.json()["error"], r.text


# ---------------------------------------------------------------- classification


@pytest.mark.parametrize("in_binary,out_binary", [(True, True), (False, False), (True, False)],
                         ids=["bin-bin", "json-json", "bin-json"])
def test_class_count(gw_ks, in_binary, out_binary):
    """KServe ignores `classification`; the gateway applies Triton's: BYTES `value:index`,
    six decimals, highest first."""
    a = np.array([[1.1, 3.3, 2.2, 0.5], [-1.0, -2.0, 7.25, 7.0]], dtype=np.float32)
    b = np.zeros_like(a)
    wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=out_binary, class_count=2)
    result = gw_ks.infer("addsub", addsub_inputs(a, b, (in_binary, in_binary)), outputs=[wanted])
    assert output_names(result) == ["OUTPUT0"]
    out = result.get_output("OUTPUT0")
    assert out["datatype"] == "BYTES"
    assert out["shape"] == [2, 2]
    got = [[v if isinstance(v, bytes) else v.encode() for v in row]
           for row in result.as_numpy("OUTPUT0").tolist()]
    assert got == [[b"3.300000:1", b"2.200000:2"], [b"7.250000:2", b"7.000000:3"]]


# ---------------------------------------------------------------- validation (KServe has none)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_error_wrong_shape_exact_message(gw_ks, binary):
    a, b = operands(10, batch=1)
    inputs = addsub_inputs(a[:, :3].copy(), b[:, :3].copy(), (binary, binary))
    e = expect_error(lambda: gw_ks.infer("addsub", inputs), 400)
    assert e.message() == "input 'INPUT0': shape [1,3] does not match the model's [-1,4] at dimension 1"


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_error_wrong_datatype_exact_message(gw_ks, binary):
    a, b = operands(11, batch=1)
    # INT32 has FP32's byte size: only a datatype check catches it (KServe answers 200).
    inputs = addsub_inputs(a.astype(np.int32), b, (binary, binary), datatype="INT32")
    e = expect_error(lambda: gw_ks.infer("addsub", inputs), 400)
    assert e.message() == "input 'INPUT0': datatype INT32 does not match the model's FP32"


def test_error_missing_input_exact_message(gateway_kserve):
    """KServe would answer 500 (KeyError); the gateway answers 400 first."""
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    r = requests.post(f"{gateway_kserve.base}/v2/models/addsub/infer", json=body, timeout=10)
    assert r.status_code == 400, r.text
    assert r.json() == {"error": "model 'addsub' requires input 'INPUT1', which the request does not have"}


# ---------------------------------------------------------------- NaN (KServe writes null)


def nan_operands():
    a = np.array([[np.nan, 1.5, -2.0, 4.0], [0.25, np.nan, 8.0, -1.0]], dtype=np.float32)
    b = np.array([[1.0, 1.0, 1.0, 1.0], [2.0, 2.0, np.nan, 3.0]], dtype=np.float32)
    return a, b


@pytest.mark.parametrize("out_binary", [True, False], ids=["out-binary", "out-json"])
def test_nan_output_comes_back_as_nan(gw_ks, out_binary):
    """KServe writes the NaN of a JSON output as null; the client must get NaN back."""
    a, b = nan_operands()
    outputs = [httpclient.InferRequestedOutput(n, binary_data=out_binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = gw_ks.infer("addsub", addsub_inputs(a, b, (True, True)), outputs=outputs)
    for name, want in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
        assert_output_encoding(result, name, out_binary, want.nbytes)
        got = result.as_numpy(name).astype(np.float32)
        assert got.shape == want.shape
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
        finite = ~np.isnan(want)
        assert got[finite].tobytes() == want[finite].tobytes(), name


def test_nan_output_in_json_is_the_string_nan(gateway_kserve):
    """README, "Non-finite floats in JSON": the JSON answer holds the string "NaN"."""
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": ["NaN", 2, 3, 4]},
                       {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]}],
            "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1"}]}
    r = requests.post(f"{gateway_kserve.base}/v2/models/addsub/infer", json=body, timeout=10)
    assert r.status_code == 200, r.text
    out = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert out == {"OUTPUT0": ["NaN", 3.0, 4.0, 5.0], "OUTPUT1": ["NaN", 1.0, 2.0, 3.0]}
    assert np.isnan(np.array(out["OUTPUT0"], dtype=np.float32)[0])


# ---------------------------------------------------------------- health, metadata, id


def test_health_ready_and_model_metadata(gateway_kserve, gw_ks):
    r = requests.get(f"{gateway_kserve.base}/v2/health/ready", timeout=10)
    assert r.status_code == 200, r.text
    r = requests.get(f"{gateway_kserve.base}/v2/models/addsub", timeout=10)
    assert r.status_code == 200, r.text
    meta = r.json()
    assert meta["name"] == "addsub"
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("INPUT0", "FP32", [-1, 4]), ("INPUT1", "FP32", [-1, 4])]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["outputs"]] == [
        ("OUTPUT0", "FP32", [-1, 4]), ("OUTPUT1", "FP32", [-1, 4])]
    assert gw_ks.is_server_ready()
    assert gw_ks.is_model_ready("addsub") and gw_ks.is_model_ready("double")
    assert not gw_ks.is_model_ready("no_such_model")


def test_response_id(gw_ks):
    """`id` echoed when the request has one and absent otherwise (Triton's rule), though
    KServe makes up a UUID for requests without one."""
    a, b = operands(12, batch=1)
    with_id = gw_ks.infer("addsub", addsub_inputs(a, b), request_id="req-7")
    assert with_id.get_response().get("id") == "req-7"
    without = gw_ks.infer("addsub", addsub_inputs(a, b))
    assert "id" not in without.get_response(), without.get_response()


# ---------------------------------------------------------------- versions


def test_version_in_path_is_refused_for_a_model_without_versions(gateway_kserve, gw_ks):
    """KServe lists no versions ("versions": null) and answers 501 to versioned paths; the
    gateway refuses a version for metadata, readiness and infer alike with a 404."""
    base = f"{gateway_kserve.base}/v2/models/addsub/versions/2"
    valid = {"inputs": [{"name": n, "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}
                        for n in ("INPUT0", "INPUT1")]}
    for method, url, body in (("GET", base, None), ("GET", f"{base}/ready", None),
                              ("POST", f"{base}/infer", valid)):
        r = requests.request(method, url, json=body, timeout=10)
        assert r.status_code == 404, f"{method} {url}: {r.status_code} {r.text}"
        assert r.json() == {"error": NO_VERSION_ERROR}, f"{method} {url}"
    a, b = operands(13, batch=1)
    e = expect_error(lambda: gw_ks.infer("addsub", addsub_inputs(a, b), model_version="2"), 404)
    assert e.message() == NO_VERSION_ERROR


# ---------------------------------------------------------------- KServe dies and comes back


def _infer_raw(gateway, timeout=10.0):
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                       {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [4, 3, 2, 1]}],
            "outputs": [{"name": "OUTPUT0"}]}
    return requests.post(f"{gateway.base}/v2/models/addsub/infer", json=body, timeout=timeout)


def test_kserve_killed_and_restarted(kserve_outage):
    gw = kserve_outage.gateway
    r = _infer_raw(gw)
    assert r.status_code == 200, r.text

    kserve_outage.kill()
    for _ in range(OUTAGE_POLLS):
        r = _infer_raw(gw)
        assert r.status_code in (502, 503), f"infer during the outage: {r.status_code} {r.text}"
        assert isinstance(r.json().get("error"), str) and r.json()["error"], r.text
        time.sleep(OUTAGE_POLL_S)

    kserve_outage.restart()
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    last = None
    for _ in range(RECOVERY_POLLS):
        r = _infer_raw(gw, timeout=max(0.5, min(10.0, deadline - time.monotonic())))
        last = (r.status_code, r.text)
        if r.status_code == 200:
            (out,) = r.json()["outputs"]
            assert out["data"] == [5.0, 5.0, 5.0, 5.0]
            return
        assert r.status_code in (502, 503), f"infer after the restart: {last}"
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    pytest.fail(f"infer did not recover within {RECOVERY_TIMEOUT_S:.0f} s of KServe's restart: {last}")
