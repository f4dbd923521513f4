"""tritonclient (and plain `requests`) -> tensorgate serving its built-in models in-process."""

import json
import zlib

import ml_dtypes
import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from interop_util import (REPO_ROOT, assert_output_encoding, expect_error, make_input,
                          output_names, run_simple, simple_operands)

NUMERIC = {
    "bool": np.bool_, "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32,
    "uint64": np.uint64, "int8": np.int8, "int16": np.int16, "int32": np.int32,
    "int64": np.int64, "fp16": np.float16, "fp32": np.float32, "fp64": np.float64,
}
ENCODINGS = [(True, True), (False, False), (True, False), (False, True)]
ENCODING_IDS = ["bin-bin", "json-json", "bin-json", "json-bin"]


def sample(kind: str, shape=(3, 7), seed=0, finite=True) -> np.ndarray:
    """Random values of the type, with its edge values in the first elements."""
    rng = np.random.default_rng(seed)
    dt = ml_dtypes.bfloat16 if kind == "bf16" else NUMERIC[kind]
    if kind == "bool":
        x = rng.integers(0, 2, size=shape).astype(np.bool_)
        x.flat[: min(2, x.size)] = [True, False][: x.size]
        return x
    if np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        x = rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
        edge = np.array([info.min, info.max, 0, 1], dtype=dt)[: x.size]
        x.flat[: len(edge)] = edge
        return x
    info = ml_dtypes.finfo(dt) if kind == "bf16" else np.finfo(dt)
    x = (rng.standard_normal(shape) * 100).astype(dt)
    specials = [info.max, -info.max, info.tiny, info.smallest_subnormal, -0.0, 0.0, 0.5, 1 / 3]
    if not finite:
        specials += [np.inf, -np.inf]
    edge = np.array(specials, dtype=np.float64).astype(dt)[: x.size]
    x.flat[: len(edge)] = edge
    return x


def bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).tobytes()


# ---------------------------------------------------------------- simple


@pytest.mark.parametrize("in_bin,out_bin", [((True, True), (True, True)), ((False, False), (False, False)),
                                            ((True, False), (False, True))],
                         ids=["binary", "json", "mixed"])
def test_simple(gw_builtin, in_bin, out_bin):
    run_simple(gw_builtin, in_bin=in_bin, out_bin=out_bin, seed=21)


def test_simple_int32_wraps_like_triton(gw_builtin):
    a = np.full((1, 16), np.iinfo(np.int32).max, dtype=np.int32)
    b = np.full((1, 16), 1, dtype=np.int32)
    result = gw_builtin.infer("simple", [make_input("INPUT0", a, "INT32", True), make_input("INPUT1", b, "INT32", True)])
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


@pytest.mark.parametrize("wanted", ["OUTPUT0", "OUTPUT1"])
def test_simple_only_requested_output(gw_builtin, wanted):
    a, b = simple_operands(22)
    result = gw_builtin.infer("simple", [make_input("INPUT0", a, "INT32", True), make_input("INPUT1", b, "INT32", True)],
                              outputs=[httpclient.InferRequestedOutput(wanted, binary_data=True)])
    assert output_names(result) == [wanted]


def test_simple_request_id(gw_builtin):
    a, b = simple_operands(23)
    result = gw_builtin.infer("simple", [make_input("INPUT0", a, "INT32", True), make_input("INPUT1", b, "INT32", False)],
                              request_id="req-7")
    assert result.get_response()["id"] == "req-7"


def test_simple_errors(gw_builtin):
    a, b = simple_operands(24, batch=1)
    expect_error(lambda: gw_builtin.infer("simple", [make_input("INPUT0", a.astype(np.float32), "FP32", True),
                                                     make_input("INPUT1", b, "INT32", True)]), 400, "INPUT0")
    expect_error(lambda: gw_builtin.infer("simple", [make_input("INPUT0", a[:, :15].copy(), "INT32", False),
                                                     make_input("INPUT1", b[:, :15].copy(), "INT32", False)]), 400, "INPUT0")
    expect_error(lambda: gw_builtin.infer("no_such_model", [make_input("INPUT0", a, "INT32", True)]), 404, "no_such_model")
    expect_error(lambda: gw_builtin.infer("simple", [make_input("INPUT0", a, "INT32", True), make_input("INPUT1", b, "INT32", True)],
                                          outputs=[httpclient.InferRequestedOutput("OUTPUT9")]), 400, "OUTPUT9")


# ---------------------------------------------------------------- identity_<type>


@pytest.mark.parametrize("in_bin,out_bin", ENCODINGS, ids=ENCODING_IDS)
@pytest.mark.parametrize("kind", list(NUMERIC))
def test_identity_numeric(gw_builtin, kind, in_bin, out_bin):
    x = sample(kind, seed=zlib.crc32(kind.encode()))
    datatype = kind.upper()
    result = gw_builtin.infer(f"identity_{kind}", [make_input("INPUT0", x, datatype, in_bin)],
                              outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=out_bin)])
    out = result.get_output("OUTPUT0")
    assert out["datatype"] == datatype and out["shape"] == list(x.shape), out
    assert_output_encoding(result, "OUTPUT0", out_bin, x.nbytes)
    got = result.as_numpy("OUTPUT0")
    assert got.dtype == x.dtype
    assert bits(got) == bits(x), f"{kind}: sent {x.ravel()[:10]} got {got.ravel()[:10]}"


@pytest.mark.parametrize("kind", ["fp16", "fp32", "fp64"])
def test_identity_nan_and_inf_binary(gw_builtin, kind):
    x = sample(kind, seed=5, finite=False)
    x.flat[-1] = np.nan
    result = gw_builtin.infer(f"identity_{kind}", [make_input("INPUT0", x, kind.upper(), True)],
                              outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])
    assert bits(result.as_numpy("OUTPUT0")) == bits(x)


@pytest.mark.parametrize("kind", ["fp16", "fp32", "fp64"])
def test_identity_nan_and_inf_json(gw_builtin, kind):
    """tritonclient writes NaN and infinities in JSON data as Python's bare literals, which
    Triton reads; so does tensorgate, and the values come back bit for bit."""
    x = np.array([[np.nan, np.inf, -np.inf, 1.5]], dtype=kind.replace("fp", "float"))
    result = gw_builtin.infer(f"identity_{kind}", [make_input("INPUT0", x, kind.upper(), False)],
                              outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    got = result.as_numpy("OUTPUT0")
    assert got.dtype == x.dtype
    assert bits(got) == bits(x), f"sent {x} got {got}"


@pytest.mark.parametrize("out_bin", [True, False], ids=["out-binary", "out-json"])
def test_identity_bf16(gw_builtin, out_bin):
    """tritonclient sends BF16 only in binary (an ml_dtypes.bfloat16 array); tensorgate can
    answer in JSON too (numbers), which tritonclient reads back as bfloat16."""
    x = sample("bf16", seed=31)
    result = gw_builtin.infer("identity_bf16", [make_input("INPUT0", x, "BF16", True)],
                              outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=out_bin)])
    out = result.get_output("OUTPUT0")
    assert out["datatype"] == "BF16" and out["shape"] == list(x.shape), out
    assert_output_encoding(result, "OUTPUT0", out_bin, x.nbytes)
    got = result.as_numpy("OUTPUT0")
    assert got.dtype == ml_dtypes.bfloat16
    assert bits(got) == bits(x), f"sent {x.ravel()[:10]} got {got.ravel()[:10]}"


@pytest.mark.parametrize("kind", ["fp16", "bf16"])
def test_half_types_as_json_numbers(gateway_builtin, kind):
    """tensorgate converts JSON numbers to and from FP16/BF16 (Triton rejects them)."""
    values = [1.0, -2.5, 0.15625, 3.0, 0.0, -0.0, 65504.0 if kind == "fp16" else 3.3895313892515355e38]
    body = {"inputs": [{"name": "INPUT0", "datatype": kind.upper(), "shape": [1, len(values)], "data": values}],
            "outputs": [{"name": "OUTPUT0"}]}
    r = requests.post(f"{gateway_builtin.base}/v2/models/identity_{kind}/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    out = r.json()["outputs"][0]
    assert out["datatype"] == kind.upper() and out["shape"] == [1, len(values)]
    dt = np.float16 if kind == "fp16" else ml_dtypes.bfloat16
    # Any decimal that converts back to the same half value is a right answer.
    assert bits(np.array(out["data"], dtype=np.float64).astype(dt)) == bits(np.array(values).astype(dt)), out["data"]


BYTES_VALUES = [b"hello", b"", "\u00e9t\u00e9 \u2603 \U0001F600".encode(), b"x" * 300,
                b'tab\tnewline\n"quote" back\\slash \x01', b"0"]


@pytest.mark.parametrize("in_bin,out_bin", ENCODINGS, ids=ENCODING_IDS)
def test_identity_bytes(gw_builtin, in_bin, out_bin):
    x = np.array(BYTES_VALUES, dtype=np.object_).reshape(2, 3)
    result = gw_builtin.infer("identity_bytes", [make_input("INPUT0", x, "BYTES", in_bin)],
                              outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=out_bin)])
    out = result.get_output("OUTPUT0")
    assert out["datatype"] == "BYTES" and out["shape"] == [2, 3], out
    got = result.as_numpy("OUTPUT0")
    # Binary outputs come back as bytes, JSON ones as str.
    as_bytes = [v.encode() if isinstance(v, str) else bytes(v) for v in got.ravel()]
    assert as_bytes == BYTES_VALUES


def test_identity_bytes_not_utf8_binary(gw_builtin):
    x = np.array([[b"\xff\xfe\x00", b"\x80"]], dtype=np.object_)
    result = gw_builtin.infer("identity_bytes", [make_input("INPUT0", x, "BYTES", True)],
                              outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])
    assert list(result.as_numpy("OUTPUT0").ravel()) == list(x.ravel())


@pytest.mark.parametrize("shape", [(0, 4), (3, 0)])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_identity_empty_tensor(gw_builtin, shape, binary):
    x = np.zeros(shape, dtype=np.float32)
    result = gw_builtin.infer("identity_fp32", [make_input("INPUT0", x, "FP32", binary)],
                              outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)])
    out = result.get_output("OUTPUT0")
    assert out["shape"] == list(shape), out
    assert result.as_numpy("OUTPUT0").shape == shape


# ---------------------------------------------------------------- plain HTTP, raw binary


def post_infer(gateway, model, body: bytes, headers: dict):
    return requests.post(f"{gateway.base}/v2/models/{model}/infer", data=body, headers=headers, timeout=30)


def split_response(r):
    """(header JSON, binary tail) of a binary response."""
    assert r.headers["Content-Type"].startswith("application/octet-stream"), r.headers
    n = int(r.headers["Inference-Header-Content-Length"])
    return json.loads(r.content[:n]), r.content[n:]


@pytest.mark.parametrize("kind,count", [("fp32", 10), ("int32", 3), ("uint8", 5), ("fp64", 1), ("int16", 7)])
def test_raw_binary_request(gateway_builtin, kind, count):
    """IHCL 0: the body is the only input's data; the leading -1 is the batch (1) and the
    other variable dimension comes from the byte size. Outputs default to binary."""
    x = sample(kind, shape=(count,), seed=41)
    r = post_infer(gateway_builtin, f"identity_{kind}", x.tobytes(),
                   {"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"})
    assert r.status_code == 200, r.text
    header, tail = split_response(r)
    [out] = header["outputs"]
    assert out["name"] == "OUTPUT0" and out["datatype"] == kind.upper()
    assert out["shape"] == [1, count]
    assert out["parameters"]["binary_data_size"] == x.nbytes
    assert tail == x.tobytes()


def test_raw_binary_to_two_input_model_is_400(gateway_builtin):
    r = post_infer(gateway_builtin, "simple", np.zeros(32, np.int32).tobytes(),
                   {"Inference-Header-Content-Length": "0"})
    assert r.status_code == 400, r.text
    assert "error" in r.json()


def test_raw_binary_partial_element_is_400(gateway_builtin):
    r = post_infer(gateway_builtin, "identity_fp32", b"\x00" * 7, {"Inference-Header-Content-Length": "0"})
    assert r.status_code == 400, r.text
    assert "error" in r.json()


def test_hand_built_binary_request(gateway_builtin):
    """JSON header + binary chunk with IHCL; one binary and one JSON output."""
    a, b = simple_operands(42, batch=2)
    header = {"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [2, 16], "parameters": {"binary_data_size": a.nbytes}},
        {"name": "INPUT1", "datatype": "INT32", "shape": [2, 16], "data": b.ravel().tolist()}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}]}
    head = json.dumps(header).encode()
    r = post_infer(gateway_builtin, "simple", head + a.tobytes(),
                   {"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 200, r.text
    resp, tail = split_response(r)
    assert "id" not in resp
    out0, out1 = resp["outputs"]
    assert out0["name"] == "OUTPUT0" and out0["parameters"]["binary_data_size"] == a.nbytes
    assert np.array_equal(np.frombuffer(tail, np.int32).reshape(2, 16), a + b)
    assert out1["name"] == "OUTPUT1" and out1["data"] == (a - b).ravel().tolist()


def test_json_only_response_is_application_json(gateway_builtin):
    a, b = simple_operands(43, batch=1)
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a.tolist()},
                       {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": b.ravel().tolist()}]}
    r = requests.post(f"{gateway_builtin.base}/v2/models/simple/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    assert "Inference-Header-Content-Length" not in r.headers
    outs = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert outs == {"OUTPUT0": (a + b).ravel().tolist(), "OUTPUT1": (a - b).ravel().tolist()}


def test_binary_size_mismatch_is_400(gateway_builtin):
    a = np.arange(16, dtype=np.int32)
    header = {"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}]}
    head = json.dumps(header).encode()
    r = post_infer(gateway_builtin, "simple", head + a.tobytes() + a.tobytes()[:60],
                   {"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 400, r.text
    assert "error" in r.json()


# ---------------------------------------------------------------- classification (extra)


def test_classification_with_labels(gw_builtin):
    rng = np.random.default_rng(51)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    inp = make_input("INPUT0", x, "FP32", True)
    classes = gw_builtin.infer("classifier", [inp],
                               outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=3)]).as_numpy("OUTPUT0")
    assert classes.shape == (2, 3)
    logits = gw_builtin.infer("classifier", [inp]).as_numpy("OUTPUT0")
    labels = (REPO_ROOT / "config" / "labels" / "classifier.txt").read_text().split("\n")
    for row, got in zip(logits, classes):
        order = sorted(range(10), key=lambda i: (-row[i], i))[:3]
        want = [f"{row[i]:.6f}:{i}:{labels[i]}".encode() for i in order]
        assert list(got) == want


# ---------------------------------------------------------------- tritonclient.http.aio


def test_aio_client_reads_every_answer(gateway_builtin):
    """aiohttp asks for gzip on every call and tritonclient.http.aio inflates only inference
    answers itself: metadata, configuration, statistics, the index and error bodies must come
    back uncompressed, successful inferences may come back compressed."""
    import asyncio

    import tritonclient.http.aio as aioclient
    from tritonclient.utils import InferenceServerException

    async def run():
        client = aioclient.InferenceServerClient(url=gateway_builtin.url, conn_timeout=10.0)
        try:
            assert (await client.get_server_metadata())["name"] == "tensorgate"
            assert (await client.get_model_metadata("simple"))["name"] == "simple"
            assert (await client.get_model_config("simple"))["name"] == "simple"
            stats = await client.get_inference_statistics("simple")
            assert stats["model_stats"][0]["name"] == "simple"
            index = await client.get_model_repository_index()
            assert "simple" in {m["name"] for m in index}
            a, b = simple_operands(16, batch=1)
            inputs = [make_input("INPUT0", a, "INT32", True), make_input("INPUT1", b, "INT32", True)]
            result = await client.infer("simple", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            try:
                await client.infer("no_such_model", inputs)
            except InferenceServerException as e:
                return e
            raise AssertionError("an unknown model was served")
        finally:
            await client.close()

    error = asyncio.run(asyncio.wait_for(run(), timeout=60))
    assert error.status() == "404"
    assert error.message() == "unknown model 'no_such_model'"


def test_unsupported_triton_endpoints_are_501_with_a_reason(gw_builtin):
    memory = ("system shared memory is not supported by tensorgate: it forwards tensors in the request "
              "itself; send them in the request (binary tensor data over REST, raw_input_contents over gRPC)")
    expect_error(lambda: gw_builtin.get_system_shared_memory_status(), 501, memory)
    expect_error(lambda: gw_builtin.get_trace_settings(), 501,
                 "trace settings are not supported by tensorgate: set them on the backends themselves")
    expect_error(lambda: gw_builtin.update_log_settings({"log_info": True}), 501,
                 "log settings are not supported by tensorgate: set them on the backends themselves")
