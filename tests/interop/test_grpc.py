"""tritonclient.grpc (and grpcio with the generated stubs) -> tensorgate's gRPC front:
inference.GRPCInferenceService, wire-compatible with Triton's, and grpc.health.v1.Health on
the same port, in front of the built-in models, three workers, MLServer (REST behind) and a
stand-in backend written here (slow, failing and unready models).

Every error is checked by its gRPC code and its exact message; where REST has the same
error, the gRPC message must be the REST one, word for word."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

import interop_util as util
from interop_util import REPO_ROOT
from test_builtin import NUMERIC, bits, sample

MAX_BATCH = 2147483647
BUILTIN_NAMES = {"simple", "accumulate", "classifier"} | {
    f"identity_{t}" for t in ("bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32",
                              "int64", "fp16", "bf16", "fp32", "fp64", "bytes")}
UNSUPPORTED_MEMORY = ("{} is not supported by tensorgate: it forwards tensors in the request itself; "
                      "send them in the request (binary tensor data over REST, raw_input_contents over gRPC)")
NOT_FOR_A_GATEWAY = "{} are not supported by tensorgate: set them on the backends themselves"
WAIT_S = 30.0  # bound of every wait for a callback or a thread


# ---------------------------------------------------------------- helpers


def grpc_input(name: str, arr: np.ndarray, datatype: str) -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, list(arr.shape), datatype)
    inp.set_data_from_numpy(arr)
    return inp


def simple_grpc(a, b, datatype="INT32"):
    return [grpc_input("INPUT0", a, datatype), grpc_input("INPUT1", b, "INT32")]


def simple_rest(a, b, datatype="INT32"):
    return [util.make_input("INPUT0", a, datatype, True), util.make_input("INPUT1", b, "INT32", True)]


def grpc_error(fn, code: str, message: Optional[str] = None) -> InferenceServerException:
    """`fn()` must raise a tritonclient.grpc error with this code (and exactly this message)."""
    try:
        fn()
    except InferenceServerException as e:
        assert e.status() == f"StatusCode.{code}", f"status {e.status()} (want {code}): {e.message()}"
        if message is not None:
            assert e.message() == message
        return e
    raise AssertionError(f"expected {code}, the call succeeded")


def rpc_error(fn, code: grpc.StatusCode, message: Optional[str] = None) -> grpc.RpcError:
    """`fn()` must raise a grpc.RpcError with this code (and exactly this message)."""
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, f"code {e.code()} (want {code}): {e.details()}"
        if message is not None:
            assert e.details() == message
        return e
    raise AssertionError(f"expected {code}, the call succeeded")


def rest_error(fn, status: int) -> str:
    """The message of the REST error `fn()` raises, which must have this status."""
    return util.expect_error(fn, status).message()


def names(result: grpcclient.InferResult) -> List[str]:
    return [o.name for o in result.get_response().outputs]


class Raw:
    """grpcio with tritonclient's generated stubs, for what tritonclient does not expose
    (metadata, typed contents, deadlines, one channel's calls)."""

    def __init__(self, target: str, credentials=None):
        self.channel = (grpc.secure_channel(target, credentials) if credentials
                        else grpc.insecure_channel(target))
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def close(self):
        self.channel.close()

    def infer(self, request, metadata=(), timeout=30.0):
        """(response, initial metadata dict, trailing metadata dict)."""
        response, call = self.stub.ModelInfer.with_call(request, metadata=list(metadata), timeout=timeout)
        return response, dict(call.initial_metadata()), dict(call.trailing_metadata())


def raw_request(model: str, inputs, outputs=(), parameters: Optional[Dict] = None, raw=True,
                version: str = "", request_id: str = "") -> service_pb2.ModelInferRequest:
    """inputs: (name, datatype, shape, numpy array or None, typed contents dict or None)."""
    req = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    for name, datatype, shape, arr, typed in inputs:
        t = req.inputs.add(name=name, datatype=datatype, shape=list(shape))
        if typed:
            for field, values in typed.items():
                getattr(t.contents, field).extend(values)
        if raw and arr is not None:
            req.raw_input_contents.append(np.ascontiguousarray(arr).tobytes())
    for o in outputs:
        req.outputs.add(name=o)
    for k, v in (parameters or {}).items():
        p = req.parameters[k]
        if isinstance(v, bool):
            p.bool_param = v
        elif isinstance(v, int):
            p.int64_param = v
        else:
            p.string_param = v
    return req


def accumulate_request(value: int, seq, start=False, end=False) -> service_pb2.ModelInferRequest:
    x = np.array([value], dtype=np.int32)
    return raw_request("accumulate", [("INPUT0", "INT32", [1], x, None)],
                       parameters={"sequence_id": seq, "sequence_start": start, "sequence_end": end})


def accumulate_grpc(client, value, seq, start=False, end=False, **kw) -> int:
    r = client.infer("accumulate", [grpc_input("INPUT0", np.array([value], dtype=np.int32), "INT32")],
                     sequence_id=seq, sequence_start=start, sequence_end=end, **kw)
    return int(r.as_numpy("OUTPUT0")[0])


def accumulate_rest(client, value, seq, start=False, end=False) -> int:
    r = client.infer("accumulate", [util.make_input("INPUT0", np.array([value], dtype=np.int32), "INT32", True)],
                     sequence_id=seq, sequence_start=start, sequence_end=end)
    return int(r.as_numpy("OUTPUT0")[0])


class StreamCollector:
    """A tritonclient stream whose callback results land in a queue, read in order."""

    def __init__(self, client, headers=None):
        self.client = client
        self.results: "queue.Queue[Tuple[object, object]]" = queue.Queue()
        client.start_stream(callback=lambda result, error: self.results.put((result, error)),
                            headers=headers)

    def take(self, n: int, timeout_s: float = WAIT_S):
        out = []
        deadline = time.monotonic() + timeout_s
        for _ in range(n):
            out.append(self.results.get(timeout=max(0.1, deadline - time.monotonic())))
        return out

    def close(self):
        self.client.stop_stream()


@pytest.fixture(scope="module")
def rest_builtin(grpc_gateway_builtin):
    """tritonclient.http to the REST listener of the same gateway as grpc_builtin."""
    client = httpclient.InferenceServerClient(grpc_gateway_builtin.url, network_timeout=30.0)
    yield client
    client.close()


@pytest.fixture(scope="module")
def raw_builtin(grpc_gateway_builtin):
    raw = Raw(grpc_gateway_builtin.grpc_url)
    yield raw
    raw.close()


# ---------------------------------------------------------------- health and metadata


def test_server_live_and_ready(grpc_builtin):
    assert grpc_builtin.is_server_live()
    assert grpc_builtin.is_server_ready()


def test_model_ready_like_triton(grpc_builtin):
    assert grpc_builtin.is_model_ready("simple")
    assert grpc_builtin.is_model_ready("simple", "1")
    assert grpc_builtin.is_model_ready("accumulate")
    # Unknown models and versions are not ready, not errors.
    assert not grpc_builtin.is_model_ready("simple", "2")
    assert not grpc_builtin.is_model_ready("nope")


def test_server_metadata(grpc_builtin, grpc_gateway_builtin):
    meta = grpc_builtin.get_server_metadata()
    rest = requests.get(f"{grpc_gateway_builtin.base}/v2", timeout=10).json()
    assert meta.name == "tensorgate" == rest["name"]
    assert meta.version and meta.version == rest["version"]
    assert {"binary_tensor_data", "classification", "sequence", "statistics"} <= set(meta.extensions)
    assert list(meta.extensions) == rest["extensions"]


@pytest.mark.parametrize("model", ["simple", "accumulate", "classifier", "identity_bytes", "identity_bf16"])
def test_model_metadata_matches_rest(grpc_builtin, grpc_gateway_builtin, model):
    meta = grpc_builtin.get_model_metadata(model)
    rest = requests.get(f"{grpc_gateway_builtin.base}/v2/models/{model}", timeout=10).json()
    assert (meta.name, list(meta.versions), meta.platform) == (model, ["1"], "tensorgate_builtin")
    tensors = lambda ts: [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in ts]
    assert tensors(meta.inputs) == rest["inputs"]
    assert tensors(meta.outputs) == rest["outputs"]


def test_model_metadata_of_simple(grpc_builtin):
    meta = grpc_builtin.get_model_metadata("simple", "1")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [
        ("OUTPUT0", "INT32", [-1, 16]), ("OUTPUT1", "INT32", [-1, 16])]


def test_metadata_errors(grpc_builtin):
    grpc_error(lambda: grpc_builtin.get_model_metadata("nope"), "NOT_FOUND", "unknown model 'nope'")
    grpc_error(lambda: grpc_builtin.get_model_metadata("simple", "2"), "NOT_FOUND",
               "model 'simple' has no version '2' (its versions are 1)")
    grpc_error(lambda: grpc_builtin.get_model_config("nope"), "NOT_FOUND", "unknown model 'nope'")
    grpc_error(lambda: grpc_builtin.get_inference_statistics("nope"), "NOT_FOUND", "unknown model 'nope'")


def config_tensors(ts):
    return [(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in ts]


def test_model_config_of_simple(grpc_builtin):
    c = grpc_builtin.get_model_config("simple").config
    assert (c.name, c.platform, c.max_batch_size) == ("simple", "tensorgate_builtin", MAX_BATCH)
    assert not c.HasField("sequence_batching")
    assert config_tensors(c.input) == [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
    assert config_tensors(c.output) == [("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])]


def test_model_config_without_batch_dimension(grpc_builtin):
    """accumulate's tensors are [1]: no leading -1, so no batching, and dims as they are."""
    c = grpc_builtin.get_model_config("accumulate").config
    assert (c.name, c.platform, c.max_batch_size) == ("accumulate", "tensorgate_builtin", 0)
    assert c.HasField("sequence_batching")  # a sequence model, as Triton's config says
    assert config_tensors(c.input) == [("INPUT0", "TYPE_INT32", [1])]
    assert config_tensors(c.output) == [("OUTPUT0", "TYPE_INT32", [1])]


def test_model_config_of_classifier(grpc_builtin):
    c = grpc_builtin.get_model_config("classifier").config
    assert c.max_batch_size == MAX_BATCH
    assert config_tensors(c.input) == [("INPUT0", "TYPE_FP32", [8])]
    assert config_tensors(c.output) == [("OUTPUT0", "TYPE_FP32", [10])]


@pytest.mark.parametrize("kind", sorted(t.split("_", 1)[1] for t in BUILTIN_NAMES if t.startswith("identity_")))
def test_model_config_datatypes(grpc_builtin, kind):
    c = grpc_builtin.get_model_config(f"identity_{kind}").config
    want = "TYPE_STRING" if kind == "bytes" else f"TYPE_{kind.upper()}"
    assert c.max_batch_size == MAX_BATCH
    assert config_tensors(c.input) == [("INPUT0", want, [-1])]
    assert config_tensors(c.output) == [("OUTPUT0", want, [-1])]


def test_repository_index_matches_rest(grpc_builtin, grpc_gateway_builtin):
    index = grpc_builtin.get_model_repository_index()
    got = sorted((m.name, m.version, m.state) for m in index.models)
    rest = requests.post(f"{grpc_gateway_builtin.base}/v2/repository/index", json={}, timeout=10).json()
    assert got == sorted((m["name"], m.get("version", ""), m["state"]) for m in rest)
    assert {name for name, _, _ in got} == BUILTIN_NAMES
    assert all(state == "READY" for _, _, state in got), got
    ready_only = service_pb2.RepositoryIndexRequest(ready=True)
    raw = Raw(grpc_gateway_builtin.grpc_url)
    try:
        assert sorted(m.name for m in raw.stub.RepositoryIndex(ready_only, timeout=10).models) == sorted(BUILTIN_NAMES)
    finally:
        raw.close()


def test_statistics_match_rest_and_count_grpc(grpc_builtin, rest_builtin, grpc_gateway_builtin):
    model = "identity_uint16"

    def grpc_stats():
        [s] = grpc_builtin.get_inference_statistics(model).model_stats
        i = s.inference_stats
        return {"name": s.name, "version": s.version, "last_inference": s.last_inference,
                "inference_count": s.inference_count, "execution_count": s.execution_count,
                **{k: (getattr(i, k).count, getattr(i, k).ns)
                   for k in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")}}

    def rest_stats():
        [s] = requests.get(f"{grpc_gateway_builtin.base}/v2/models/{model}/stats", timeout=10).json()["model_stats"]
        i = s["inference_stats"]
        return {"name": s["name"], "version": s["version"], "last_inference": s["last_inference"],
                "inference_count": s["inference_count"], "execution_count": s["execution_count"],
                **{k: (i[k]["count"], i[k]["ns"])
                   for k in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")}}

    before = grpc_stats()
    assert before == rest_stats()
    x = np.arange(10, dtype=np.uint16).reshape(2, 5)
    grpc_builtin.infer(model, [grpc_input("INPUT0", x, "UINT16")])                      # batch 2
    grpc_builtin.infer(model, [grpc_input("INPUT0", np.zeros((3, 1), np.uint16), "UINT16")])  # batch 3
    stream = StreamCollector(grpc_builtin)
    try:
        stream.client.async_stream_infer(model, [grpc_input("INPUT0", x[:1], "UINT16")])  # batch 1
        [(result, error)] = stream.take(1)
        assert error is None, error
    finally:
        stream.close()
    rest_builtin.infer(model, [util.make_input("INPUT0", x[:1], "UINT16", True)])    # batch 1
    grpc_error(lambda: grpc_builtin.infer(model, [grpc_input("INPUT0", x.astype(np.int16), "INT16")]),
               "INVALID_ARGUMENT", "input 'INPUT0': datatype INT16 does not match the model's UINT16")
    after = grpc_stats()
    assert after == rest_stats(), "gRPC and REST statistics differ"
    assert (after["name"], after["version"]) == (model, "1")
    assert after["inference_count"] - before["inference_count"] == 7
    assert after["execution_count"] - before["execution_count"] == 4
    assert after["success"][0] - before["success"][0] == 4
    assert after["fail"][0] - before["fail"][0] == 1
    assert after["last_inference"] >= before["last_inference"] and after["last_inference"] > 0
    # The whole list too: every model, no filter.
    all_models = {s.name for s in grpc_builtin.get_inference_statistics().model_stats}
    assert all_models == BUILTIN_NAMES


@pytest.mark.parametrize("call,action", [
    (lambda c: c.load_model("simple"), "load"),
    (lambda c: c.unload_model("simple"), "unload"),
], ids=["load", "unload"])
def test_repository_control_needs_a_backend_with_a_repository(grpc_builtin, call, action):
    # The built-in backend here has no model repository: nothing could load the model.
    grpc_error(lambda: call(grpc_builtin), "INVALID_ARGUMENT",
               f"cannot {action} model 'simple': no backend of this gateway has a model repository "
               "(the model_repository extension)")


@pytest.mark.parametrize("call,message", [
    (lambda c: c.get_system_shared_memory_status(), UNSUPPORTED_MEMORY.format("system shared memory")),
    (lambda c: c.register_system_shared_memory("r", "/tg-shm", 64), UNSUPPORTED_MEMORY.format("system shared memory")),
    (lambda c: c.unregister_system_shared_memory(), UNSUPPORTED_MEMORY.format("system shared memory")),
    (lambda c: c.get_cuda_shared_memory_status(), UNSUPPORTED_MEMORY.format("CUDA shared memory")),
    (lambda c: c.register_cuda_shared_memory("r", b"", 0, 64), UNSUPPORTED_MEMORY.format("CUDA shared memory")),
    (lambda c: c.unregister_cuda_shared_memory(), UNSUPPORTED_MEMORY.format("CUDA shared memory")),
    (lambda c: c.get_trace_settings(), NOT_FOR_A_GATEWAY.format("trace settings")),
    (lambda c: c.update_trace_settings(settings={"trace_rate": "1"}), NOT_FOR_A_GATEWAY.format("trace settings")),
    (lambda c: c.get_log_settings(), NOT_FOR_A_GATEWAY.format("log settings")),
    (lambda c: c.update_log_settings({"log_info": True}), NOT_FOR_A_GATEWAY.format("log settings")),
], ids=["shm-status", "shm-register", "shm-unregister", "cuda-status", "cuda-register",
        "cuda-unregister", "trace-get", "trace-update", "log-get", "log-update"])
def test_unimplemented_rpcs(grpc_builtin, call, message):
    grpc_error(lambda: call(grpc_builtin), "UNIMPLEMENTED", message)


def test_unknown_service_is_unimplemented(raw_builtin):
    call = raw_builtin.channel.unary_unary("/foo.Bar/Baz", request_serializer=lambda b: b,
                                           response_deserializer=lambda b: b)
    rpc_error(lambda: call(b"", timeout=10), grpc.StatusCode.UNIMPLEMENTED,
              "tensorgate serves inference.GRPCInferenceService and grpc.health.v1.Health, not 'foo.Bar'")


def test_grpc_health(raw_builtin):
    check = lambda service: raw_builtin.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    assert check("").status == health_pb2.HealthCheckResponse.SERVING
    assert check("inference.GRPCInferenceService").status == health_pb2.HealthCheckResponse.SERVING
    rpc_error(lambda: check("nope"), grpc.StatusCode.NOT_FOUND,
              "unknown service 'nope'; tensorgate reports '' and 'inference.GRPCInferenceService'")
    watch = raw_builtin.health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
    try:
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    finally:
        watch.cancel()


# ---------------------------------------------------------------- inference, built-in models


def test_simple(grpc_builtin):
    a, b = util.simple_operands(61)
    result = grpc_builtin.infer("simple", simple_grpc(a, b))
    assert sorted(names(result)) == ["OUTPUT0", "OUTPUT1"]
    response = result.get_response()
    # Every output raw, as Triton answers.
    assert len(response.raw_output_contents) == 2
    assert all(not o.HasField("contents") for o in response.outputs)
    assert (response.model_name, response.model_version) == ("simple", "1")
    for name, want in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
        got = result.as_numpy(name)
        assert got.dtype == np.int32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("wanted", ["OUTPUT0", "OUTPUT1"])
def test_simple_only_requested_output(grpc_builtin, wanted):
    a, b = util.simple_operands(62, batch=1)
    result = grpc_builtin.infer("simple", simple_grpc(a, b), outputs=[grpcclient.InferRequestedOutput(wanted)])
    assert names(result) == [wanted]
    np.testing.assert_array_equal(result.as_numpy(wanted), a + b if wanted == "OUTPUT0" else a - b)


def test_request_id_and_version(grpc_builtin):
    a, b = util.simple_operands(63, batch=1)
    with_id = grpc_builtin.infer("simple", simple_grpc(a, b), model_version="1", request_id="req-9")
    assert with_id.get_response().id == "req-9"
    assert grpc_builtin.infer("simple", simple_grpc(a, b)).get_response().id == ""
    grpc_error(lambda: grpc_builtin.infer("simple", simple_grpc(a, b), model_version="2"), "NOT_FOUND",
               "model 'simple' has no version '2' (its versions are 1)")


@pytest.mark.parametrize("kind", list(NUMERIC) + ["bf16"])
def test_identity_round_trips_exactly(grpc_builtin, kind):
    x = sample(kind, seed=zlib.crc32(b"grpc" + kind.encode()))
    result = grpc_builtin.infer(f"identity_{kind}", [grpc_input("INPUT0", x, kind.upper())])
    [out] = result.get_response().outputs
    assert (out.name, out.datatype, list(out.shape)) == ("OUTPUT0", kind.upper(), list(x.shape))
    got = result.as_numpy("OUTPUT0")
    assert got.dtype == x.dtype and got.shape == x.shape
    assert bits(got) == bits(x), f"{kind}: sent {x.ravel()[:8]} got {got.ravel()[:8]}"


@pytest.mark.parametrize("kind", ["fp16", "fp32", "fp64", "bf16"])
def test_identity_non_finite(grpc_builtin, kind):
    x = sample(kind, seed=7, finite=False)
    x.flat[-1] = np.nan
    result = grpc_builtin.infer(f"identity_{kind}", [grpc_input("INPUT0", x, kind.upper())])
    assert bits(result.as_numpy("OUTPUT0")) == bits(x)


def test_identity_bytes(grpc_builtin):
    values = [b"hello", b"", "\u00e9t\u00e9 \u2603".encode(), b"x" * 300, b"\xff\xfe\x00 not utf-8", b"0"]
    x = np.array(values, dtype=np.object_).reshape(2, 3)
    result = grpc_builtin.infer("identity_bytes", [grpc_input("INPUT0", x, "BYTES")])
    got = result.as_numpy("OUTPUT0")
    assert got.shape == (2, 3)
    assert [bytes(v) for v in got.ravel()] == values


@pytest.mark.parametrize("shape", [(0, 4), (3, 0)])
def test_identity_empty_tensor(grpc_builtin, shape):
    x = np.zeros(shape, dtype=np.float32)
    result = grpc_builtin.infer("identity_fp32", [grpc_input("INPUT0", x, "FP32")])
    assert list(result.get_response().outputs[0].shape) == list(shape)
    assert result.as_numpy("OUTPUT0").shape == shape


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(grpc_builtin, algorithm):
    """tritonclient's compression_algorithm, which Triton's gRPC server accepts."""
    a, b = util.simple_operands(78, batch=2)
    result = grpc_builtin.infer("simple", simple_grpc(a, b), compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


# ---------------------------------------------------------------- classification


def test_classification_with_labels(grpc_builtin, rest_builtin):
    rng = np.random.default_rng(64)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    result = grpc_builtin.infer("classifier", [grpc_input("INPUT0", x, "FP32")],
                                outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=3)])
    [out] = result.get_response().outputs
    assert (out.datatype, list(out.shape)) == ("BYTES", [2, 3])
    classes = result.as_numpy("OUTPUT0")
    logits = grpc_builtin.infer("classifier", [grpc_input("INPUT0", x, "FP32")]).as_numpy("OUTPUT0")
    labels = (REPO_ROOT / "config" / "labels" / "classifier.txt").read_text().split("\n")
    for row, got in zip(logits, classes):
        order = sorted(range(10), key=lambda i: (-row[i], i))[:3]
        assert [bytes(v) for v in got] == [f"{row[i]:.6f}:{i}:{labels[i]}".encode() for i in order]
    rest = rest_builtin.infer("classifier", [util.make_input("INPUT0", x, "FP32", True)],
                              outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True, class_count=3)])
    assert [[bytes(v) for v in r] for r in rest.as_numpy("OUTPUT0")] == [[bytes(v) for v in r] for r in classes]


@pytest.mark.parametrize("kind", ["int32", "uint8", "fp16", "bf16", "fp64"])
def test_classification_as_over_rest(grpc_builtin, rest_builtin, kind):
    x = sample(kind, shape=(3, 9), seed=zlib.crc32(kind.encode()))
    if kind == "fp64":
        x[0, 5] = x[0, 1]  # a tie: the lower index first
    result = grpc_builtin.infer(f"identity_{kind}", [grpc_input("INPUT0", x, kind.upper())],
                                outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=4)])
    rest = rest_builtin.infer(f"identity_{kind}", [util.make_input("INPUT0", x, kind.upper(), True)],
                              outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True, class_count=4)])
    got = [[bytes(v) for v in row] for row in result.as_numpy("OUTPUT0")]
    assert got == [[bytes(v) for v in row] for row in rest.as_numpy("OUTPUT0")]
    assert len(got) == 3 and all(len(row) == 4 for row in got)


def test_classification_error_as_over_rest(grpc_builtin, rest_builtin):
    x = np.array([[b"a", b"b"]], dtype=np.object_)
    message = "output 'OUTPUT0': classification is not supported for datatype BYTES"
    grpc_error(lambda: grpc_builtin.infer("identity_bytes", [grpc_input("INPUT0", x, "BYTES")],
                                          outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=1)]),
               "INVALID_ARGUMENT", message)
    assert rest_error(lambda: rest_builtin.infer(
        "identity_bytes", [util.make_input("INPUT0", x, "BYTES", True)],
        outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=1)]), 400) == message


# ---------------------------------------------------------------- client errors, as over REST


def _bad_requests():
    a, b = util.simple_operands(65, batch=1)
    f = a.astype(np.float32)
    short_a, short_b = a[:, :15].copy(), b[:, :15].copy()
    flat_a, flat_b = a.ravel().copy(), b.ravel().copy()
    extra = np.zeros((1, 1), np.int32)
    g_out9 = [grpcclient.InferRequestedOutput("OUTPUT9")]
    r_out9 = [httpclient.InferRequestedOutput("OUTPUT9", binary_data=True)]
    return [
        ("datatype", "INVALID_ARGUMENT", 400, "input 'INPUT0': datatype FP32 does not match the model's INT32",
         lambda c: c.infer("simple", simple_grpc(f, b, "FP32")),
         lambda c: c.infer("simple", simple_rest(f, b, "FP32"))),
        ("shape", "INVALID_ARGUMENT", 400, "input 'INPUT0': shape [1,15] does not match the model's [-1,16] at dimension 1",
         lambda c: c.infer("simple", simple_grpc(short_a, short_b)),
         lambda c: c.infer("simple", simple_rest(short_a, short_b))),
        ("rank", "INVALID_ARGUMENT", 400, "input 'INPUT0': shape [16] has rank 1 but the model expects rank 2 [-1,16]",
         lambda c: c.infer("simple", simple_grpc(flat_a, flat_b)),
         lambda c: c.infer("simple", simple_rest(flat_a, flat_b))),
        ("missing-input", "INVALID_ARGUMENT", 400, "model 'simple' requires input 'INPUT1', which the request does not have",
         lambda c: c.infer("simple", simple_grpc(a, b)[:1]),
         lambda c: c.infer("simple", simple_rest(a, b)[:1])),
        ("unknown-input", "INVALID_ARGUMENT", 400, "unknown input 'EXTRA' for model 'simple' (its inputs are INPUT0, INPUT1)",
         lambda c: c.infer("simple", simple_grpc(a, b) + [grpc_input("EXTRA", extra, "INT32")]),
         lambda c: c.infer("simple", simple_rest(a, b) + [util.make_input("EXTRA", extra, "INT32", True)])),
        ("unknown-output", "INVALID_ARGUMENT", 400,
         "unknown output 'OUTPUT9' requested from model 'simple' (its outputs are OUTPUT0, OUTPUT1)",
         lambda c: c.infer("simple", simple_grpc(a, b), outputs=g_out9),
         lambda c: c.infer("simple", simple_rest(a, b), outputs=r_out9)),
        ("unknown-model", "NOT_FOUND", 404, "unknown model 'nope'",
         lambda c: c.infer("nope", simple_grpc(a, b)),
         lambda c: c.infer("nope", simple_rest(a, b))),
        ("no-sequence-id", "INVALID_ARGUMENT", 400,
         "inference request to model 'accumulate' must specify a non-zero or non-empty correlation ID",
         lambda c: c.infer("accumulate", [grpc_input("INPUT0", np.array([1], np.int32), "INT32")]),
         lambda c: c.infer("accumulate", [util.make_input("INPUT0", np.array([1], np.int32), "INT32", True)])),
    ]


@pytest.mark.parametrize("case", _bad_requests(), ids=lambda c: c[0])
def test_client_errors_as_over_rest(grpc_builtin, rest_builtin, case):
    _, code, status, message, via_grpc, via_rest = case
    grpc_error(lambda: via_grpc(grpc_builtin), code, message)
    assert rest_error(lambda: via_rest(rest_builtin), status) == message


# ---------------------------------------------------------------- typed and raw contents


def test_typed_contents(raw_builtin):
    a, b = util.simple_operands(66, batch=2)
    req = raw_request("simple", [("INPUT0", "INT32", [2, 16], None, {"int_contents": a.ravel().tolist()}),
                                 ("INPUT1", "INT32", [2, 16], None, {"int_contents": b.ravel().tolist()})],
                      raw=False)
    response, _, _ = raw_builtin.infer(req)
    # Answers are raw whatever the request used.
    assert len(response.raw_output_contents) == 2
    assert all(not o.HasField("contents") for o in response.outputs)
    result = grpcclient.InferResult(response)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("kind,field,values,dtype", [
    ("bool", "bool_contents", [True, False, True], np.bool_),
    ("int8", "int_contents", [-128, 0, 127], np.int8),
    ("int16", "int_contents", [-32768, 1, 32767], np.int16),
    ("int64", "int64_contents", [-(2**63), 0, 2**63 - 1], np.int64),
    ("uint8", "uint_contents", [0, 1, 255], np.uint8),
    ("uint16", "uint_contents", [0, 7, 65535], np.uint16),
    ("uint32", "uint_contents", [0, 7, 2**32 - 1], np.uint32),
    ("uint64", "uint64_contents", [0, 7, 2**64 - 1], np.uint64),
    ("fp32", "fp32_contents", [-0.0, 1.5, 3.25], np.float32),
    ("fp64", "fp64_contents", [-0.0, 1e300, 1 / 3], np.float64),
])
def test_typed_contents_every_field(raw_builtin, kind, field, values, dtype):
    req = raw_request(f"identity_{kind}", [("INPUT0", kind.upper(), [1, 3], None, {field: values})], raw=False)
    response, _, _ = raw_builtin.infer(req)
    got = grpcclient.InferResult(response).as_numpy("OUTPUT0")
    assert bits(got) == bits(np.array([values], dtype=dtype))


def test_typed_bytes_contents(raw_builtin):
    values = [b"a", b"", b"\xff\x00"]
    req = raw_request("identity_bytes", [("INPUT0", "BYTES", [3, 1], None, {"bytes_contents": values})], raw=False)
    response, _, _ = raw_builtin.infer(req)
    assert [bytes(v) for v in grpcclient.InferResult(response).as_numpy("OUTPUT0").ravel()] == values


def _contents_errors():
    i32 = np.arange(16, dtype=np.int32).reshape(1, 16)
    return [
        ("out-of-range", "identity_int8", [("INPUT0", "INT8", [1, 2], None, {"int_contents": [200, 1]})], False,
         "input 'INPUT0': element 0 (200) is out of range for INT8"),
        ("fp16-typed", "identity_fp16", [("INPUT0", "FP16", [1, 1], None, {"fp32_contents": [1.0]})], False,
         "input 'INPUT0': FP16 data must be sent in raw_input_contents: InferTensorContents has no field for it"),
        ("wrong-field", "identity_int32", [("INPUT0", "INT32", [1, 1], None, {"fp32_contents": [1.0]})], False,
         "input 'INPUT0': has fp32_contents, but INT32 data goes in int_contents"),
        ("count", "identity_int32", [("INPUT0", "INT32", [1, 16], None, {"int_contents": list(range(15))})], False,
         "input 'INPUT0': shape [1,16] needs 16 elements, int_contents has 15"),
        ("raw-size", "identity_int32", [("INPUT0", "INT32", [1, 16], i32[:, :15], None)], True,
         "input 'INPUT0': raw_input_contents has 60 bytes but shape [1,16] of INT32 needs 64"),
        ("raw-entries", "simple", [("INPUT0", "INT32", [1, 16], i32, None), ("INPUT1", "INT32", [1, 16], None, None)], True,
         "raw_input_contents has 1 entries for 2 inputs; it needs one per input, in order (every input raw, or every input typed in contents, never a mix)"),
        ("both", "identity_int32", [("INPUT0", "INT32", [1, 16], i32, {"int_contents": list(range(16))})], True,
         "input 'INPUT0': has both typed contents and raw_input_contents"),
        ("neither", "identity_int32", [("INPUT0", "INT32", [1, 16], None, None)], False,
         "input 'INPUT0': has neither contents nor an entry in raw_input_contents"),
        ("datatype", "identity_int32", [("INPUT0", "FLOAT", [1, 16], i32, None)], True,
         "input 'INPUT0': unknown datatype 'FLOAT'"),
        ("negative-dim", "identity_int32", [("INPUT0", "INT32", [-1, 16], i32, None)], True,
         "input 'INPUT0': shape [-1,16] has a negative dimension"),
        ("duplicate", "simple", [("INPUT0", "INT32", [1, 16], i32, None), ("INPUT0", "INT32", [1, 16], i32, None)], True,
         "duplicate input name 'INPUT0'"),
    ]


@pytest.mark.parametrize("case", _contents_errors(), ids=lambda c: c[0])
def test_contents_errors(raw_builtin, case):
    _, model, inputs, raw, message = case
    rpc_error(lambda: raw_builtin.infer(raw_request(model, inputs, raw=raw)), grpc.StatusCode.INVALID_ARGUMENT, message)


def test_malformed_message_is_a_client_error(raw_builtin):
    """Bytes that are no ModelInferRequest are the client's fault, like a REST body that is
    not JSON (400): INVALID_ARGUMENT, not INTERNAL (the gateway's fault)."""
    call = raw_builtin.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                           request_serializer=lambda b: b, response_deserializer=lambda b: b)
    rpc_error(lambda: call(b"\xff\xff\xff\xff", timeout=10), grpc.StatusCode.INVALID_ARGUMENT)


# ---------------------------------------------------------------- metadata: request id, backend


def test_request_id_metadata_is_echoed(raw_builtin):
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    req = raw_request("identity_fp32", [("INPUT0", "FP32", [1, 4], x, None)])
    _, initial, _ = raw_builtin.infer(req, metadata=[("x-request-id", "rid-123")])
    assert initial.get("x-request-id") == "rid-123", initial
    assert initial.get("x-tensorgate-backend") == "builtin", initial
    bad = raw_request("nope", [("INPUT0", "FP32", [1, 4], x, None)])
    e = rpc_error(lambda: raw_builtin.infer(bad, metadata=[("x-request-id", "rid-456")]), grpc.StatusCode.NOT_FOUND,
                  "unknown model 'nope'")
    echoed = {**dict(e.initial_metadata() or ()), **dict(e.trailing_metadata() or ())}
    assert echoed.get("x-request-id") == "rid-456", echoed


# ---------------------------------------------------------------- sequences


def test_sequence_int64_id(grpc_builtin):
    assert accumulate_grpc(grpc_builtin, 5, 4101, start=True) == 5
    assert accumulate_grpc(grpc_builtin, 3, 4101) == 8
    assert accumulate_grpc(grpc_builtin, -1, 4101, end=True) == 7
    # Ended: the next request needs START again.
    grpc_error(lambda: accumulate_grpc(grpc_builtin, 1, 4101), "INVALID_ARGUMENT",
               "inference request for sequence 4101 to model 'accumulate' must specify the START flag on the first request of the sequence")


def test_sequence_string_id(grpc_builtin):
    assert accumulate_grpc(grpc_builtin, 10, "seq-grpc-a", start=True) == 10
    assert accumulate_grpc(grpc_builtin, 20, "seq-grpc-a") == 30
    grpc_error(lambda: accumulate_grpc(grpc_builtin, 1, "seq-grpc-unknown"), "INVALID_ARGUMENT",
               "inference request for sequence 'seq-grpc-unknown' to model 'accumulate' must specify the START flag on the first request of the sequence")
    assert accumulate_grpc(grpc_builtin, 1, "seq-grpc-a", end=True) == 31


@pytest.mark.parametrize("seq", [4201, "seq-4201"], ids=["int", "string"])
def test_sequence_across_transports(grpc_builtin, rest_builtin, seq):
    assert accumulate_rest(rest_builtin, 4, seq, start=True) == 4
    assert accumulate_grpc(grpc_builtin, 6, seq) == 10
    assert accumulate_rest(rest_builtin, 1, seq) == 11
    assert accumulate_grpc(grpc_builtin, 2, seq, end=True) == 13


# ---------------------------------------------------------------- streaming


def test_stream_in_order_with_errors(grpc_builtin):
    a, b = util.simple_operands(67, batch=1)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    stream = StreamCollector(grpc_builtin)
    try:
        send = stream.client.async_stream_infer
        send("simple", simple_grpc(a, b), request_id="s1")
        send("simple", simple_grpc(a[:, :15].copy(), b[:, :15].copy()), request_id="s2")
        send("identity_fp32", [grpc_input("INPUT0", x, "FP32")], request_id="s3")
        send("nope", [grpc_input("INPUT0", x, "FP32")], request_id="s4")
        send("simple", simple_grpc(a, b), request_id="s5", outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
        (r1, e1), (r2, e2), (r3, e3), (r4, e4), (r5, e5) = stream.take(5)
    finally:
        stream.close()
    assert e1 is None and r1.get_response().id == "s1"
    np.testing.assert_array_equal(r1.as_numpy("OUTPUT0"), a + b)
    assert r2 is None and e2.message() == "input 'INPUT0': shape [1,15] does not match the model's [-1,16] at dimension 1"
    assert e3 is None and r3.get_response().id == "s3"
    assert bits(r3.as_numpy("OUTPUT0")) == bits(x)
    assert r4 is None and e4.message() == "unknown model 'nope'"
    assert e5 is None and r5.get_response().id == "s5" and names(r5) == ["OUTPUT1"]
    np.testing.assert_array_equal(r5.as_numpy("OUTPUT1"), a - b)


def test_stream_sequences(grpc_builtin):
    """Two sequences interleaved on one stream, one int and one string id, each in order."""
    stream = StreamCollector(grpc_builtin)
    try:
        send = lambda v, seq, **kw: stream.client.async_stream_infer(
            "accumulate", [grpc_input("INPUT0", np.array([v], np.int32), "INT32")], sequence_id=seq, **kw)
        send(1, 4301, sequence_start=True)
        send(100, "seq-4301", sequence_start=True)
        for v in range(2, 21):
            send(v, 4301)
            send(100, "seq-4301")
        send(0, 4301, sequence_end=True)
        send(0, "seq-4301", sequence_end=True)
        results = stream.take(42)
    finally:
        stream.close()
    assert [e for _, e in results if e is not None] == []
    sums = [int(r.as_numpy("OUTPUT0")[0]) for r, _ in results]
    ints, strings = sums[0::2], sums[1::2]
    assert ints == [sum(range(1, n + 1)) for n in range(1, 21)] + [210]
    assert strings == [100 * n for n in range(1, 21)] + [2000]


def test_stream_classification_and_bytes(grpc_builtin):
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    s = np.array([[b"x", b"\xff"]], dtype=np.object_)
    stream = StreamCollector(grpc_builtin)
    try:
        stream.client.async_stream_infer("classifier", [grpc_input("INPUT0", x, "FP32")],
                                         outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)])
        stream.client.async_stream_infer("identity_bytes", [grpc_input("INPUT0", s, "BYTES")])
        (r1, e1), (r2, e2) = stream.take(2)
    finally:
        stream.close()
    assert e1 is None and e2 is None, (e1, e2)
    assert r1.as_numpy("OUTPUT0").shape == (1, 2)
    assert all(re.fullmatch(rb"-?\d+\.\d{6}:\d:\w+", bytes(v)) for v in r1.as_numpy("OUTPUT0").ravel())
    assert [bytes(v) for v in r2.as_numpy("OUTPUT0").ravel()] == [b"x", b"\xff"]


# ---------------------------------------------------------------- three workers behind one channel


def worker_counts(workers, model="simple") -> List[int]:
    out = []
    for w in workers:
        [s] = requests.get(f"{w.base}/v2/models/{model}/stats", timeout=10).json()["model_stats"]
        out.append(s["inference_count"])
    return out


def test_one_client_reaches_every_worker(grpc_fleet, workers):
    before = worker_counts(workers)
    a, b = util.simple_operands(68, batch=1)
    for _ in range(60):
        result = grpc_fleet.infer("simple", simple_grpc(a, b))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    delta = [x - y for x, y in zip(worker_counts(workers), before)]
    assert sum(delta) == 60, delta
    assert all(d > 0 for d in delta), f"requests per worker: {delta}"


def test_one_channel_balances_per_request(grpc_gateway_fleet):
    raw = Raw(grpc_gateway_fleet.grpc_url)
    try:
        x = np.arange(16, dtype=np.int32).reshape(1, 16)
        req = raw_request("simple", [("INPUT0", "INT32", [1, 16], x, None), ("INPUT1", "INT32", [1, 16], x, None)])
        seen: Dict[str, int] = {}
        for _ in range(60):
            _, initial, _ = raw.infer(req)
            backend = initial.get("x-tensorgate-backend")
            seen[backend] = seen.get(backend, 0) + 1
    finally:
        raw.close()
    assert set(seen) == {"backend-0", "backend-1", "backend-2"}, seen


@pytest.mark.parametrize("seq", [4401, "seq-4401"], ids=["int", "string"])
def test_sequence_started_over_rest_continues_over_grpc(grpc_gateway_fleet, seq):
    raw = Raw(grpc_gateway_fleet.grpc_url)
    try:
        body = {"parameters": {"sequence_id": seq, "sequence_start": True},
                "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [7]}]}
        r = requests.post(f"{grpc_gateway_fleet.base}/v2/models/accumulate/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [7]
        backend = r.headers["x-tensorgate-backend"]
        for value, want in ((3, 10), (5, 15)):
            response, initial, _ = raw.infer(accumulate_request(value, seq))
            assert initial.get("x-tensorgate-backend") == backend
            assert int(grpcclient.InferResult(response).as_numpy("OUTPUT0")[0]) == want
        body = {"parameters": {"sequence_id": seq, "sequence_end": True},
                "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}]}
        r = requests.post(f"{grpc_gateway_fleet.base}/v2/models/accumulate/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert (r.headers["x-tensorgate-backend"], r.json()["outputs"][0]["data"]) == (backend, [16])
    finally:
        raw.close()


@pytest.mark.parametrize("seq", [4501, "seq-4501"], ids=["int", "string"])
def test_sequence_started_over_grpc_continues_over_rest(grpc_gateway_fleet, seq):
    raw = Raw(grpc_gateway_fleet.grpc_url)
    try:
        response, initial, _ = raw.infer(accumulate_request(2, seq, start=True))
        backend = initial["x-tensorgate-backend"]
        assert int(grpcclient.InferResult(response).as_numpy("OUTPUT0")[0]) == 2
        for value, want in ((3, 5), (4, 9)):
            body = {"parameters": {"sequence_id": seq},
                    "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [value]}]}
            r = requests.post(f"{grpc_gateway_fleet.base}/v2/models/accumulate/infer", json=body, timeout=30)
            assert r.status_code == 200, r.text
            assert (r.headers["x-tensorgate-backend"], r.json()["outputs"][0]["data"]) == (backend, [want])
        response, initial, _ = raw.infer(accumulate_request(1, seq, end=True))
        assert initial["x-tensorgate-backend"] == backend
        assert int(grpcclient.InferResult(response).as_numpy("OUTPUT0")[0]) == 10
    finally:
        raw.close()


def test_stream_sequences_in_a_fleet(grpc_fleet):
    """Many sequences on one stream, spread over the workers, each keeping its state."""
    ids = list(range(4600, 4612))
    stream = StreamCollector(grpc_fleet)
    try:
        for step in range(5):
            for seq in ids:
                stream.client.async_stream_infer(
                    "accumulate", [grpc_input("INPUT0", np.array([seq], np.int32), "INT32")],
                    sequence_id=seq, sequence_start=step == 0, sequence_end=step == 4)
        results = stream.take(5 * len(ids))
    finally:
        stream.close()
    assert [e.message() for _, e in results if e is not None] == []
    sums = [int(r.as_numpy("OUTPUT0")[0]) for r, _ in results]
    assert sums == [seq * (step + 1) for step in range(5) for seq in ids]


# ---------------------------------------------------------------- MLServer (REST) behind the gRPC front


def test_mlserver_simple(grpc_ml):
    a, b = util.simple_operands(69)
    result = grpc_ml.infer("simple", simple_grpc(a, b))
    assert sorted(names(result)) == ["OUTPUT0", "OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("wanted", ["OUTPUT0", "OUTPUT1"])
def test_mlserver_outputs_filtered(grpc_ml, wanted):
    """MLServer returns both outputs whatever is asked; through the gateway only the one asked."""
    a, b = util.simple_operands(70, batch=2)
    result = grpc_ml.infer("simple", simple_grpc(a, b), outputs=[grpcclient.InferRequestedOutput(wanted)],
                           request_id="ml-1")
    assert names(result) == [wanted]
    assert result.get_response().id == "ml-1"
    np.testing.assert_array_equal(result.as_numpy(wanted), a + b if wanted == "OUTPUT0" else a - b)


def test_mlserver_identity_fp32_exact(grpc_ml):
    x = sample("fp32", shape=(4, 9), seed=71)
    x[0, :3] = [np.float32(1e-45), -0.0, 16777217.0]
    got = grpc_ml.infer("identity_fp32", [grpc_input("INPUT0", x, "FP32")]).as_numpy("OUTPUT0")
    assert got.dtype == np.float32 and bits(got) == bits(x)


def test_mlserver_classification(grpc_ml):
    rng = np.random.default_rng(72)
    x = rng.standard_normal((2, 6)).astype(np.float32)
    result = grpc_ml.infer("identity_fp32", [grpc_input("INPUT0", x, "FP32")],
                           outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    want = [[f"{float(row[i]):.6f}:{i}".encode() for i in sorted(range(6), key=lambda i: (-float(row[i]), i))[:2]]
            for row in x]
    assert [[bytes(v) for v in row] for row in result.as_numpy("OUTPUT0")] == want


def test_mlserver_errors_and_metadata(grpc_ml):
    a, b = util.simple_operands(73, batch=1)
    grpc_error(lambda: grpc_ml.infer("simple", simple_grpc(a.astype(np.float32), b, "FP32")), "INVALID_ARGUMENT",
               "input 'INPUT0': datatype FP32 does not match the model's INT32")
    grpc_error(lambda: grpc_ml.infer("nope", simple_grpc(a, b)), "NOT_FOUND", "unknown model 'nope'")
    assert grpc_ml.is_server_ready() and grpc_ml.is_model_ready("simple")
    meta = grpc_ml.get_model_metadata("simple")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])]
    c = grpc_ml.get_model_config("simple").config
    assert c.max_batch_size == MAX_BATCH
    assert config_tensors(c.input) == [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]


# ---------------------------------------------------------------- a stand-in backend: slow, failing, unready


SLOW_MODELS = {"sleep": "READY", "broken": "READY", "garbage": "READY", "picky": "READY", "down": "UNAVAILABLE"}


class StandIn(BaseHTTPRequestHandler):
    """A v2 REST server with INT32 [1] -> [1] models: `sleep` sleeps INPUT0 milliseconds
    and echoes it, `broken` answers 500, `garbage` 200 with a body that is not JSON, `picky`
    400, and `down` is listed but not ready. No binary tensors: the gateway sends JSON."""

    protocol_version = "HTTP/1.0"

    def log_message(self, *args):
        pass

    def _send(self, status: int, body, content_type="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self):
        path = self.path
        if path == "/v2":
            return self._send(200, {"name": "stand-in", "version": "1", "extensions": []})
        if path in ("/v2/health/ready", "/v2/health/live"):
            return self._send(200, {})
        m = re.fullmatch(r"/v2/models/([^/]+)(/ready)?", path)
        if m and m.group(1) in SLOW_MODELS:
            name = m.group(1)
            if m.group(2):
                return self._send(503 if name == "down" else 200, {})
            tensor = lambda n: {"name": n, "datatype": "INT32", "shape": [1]}
            return self._send(200, {"name": name, "versions": ["1"], "platform": "stand-in",
                                    "inputs": [tensor("INPUT0")], "outputs": [tensor("OUTPUT0")]})
        self._send(404, {"error": f"no route {path}"})

    def do_POST(self):
        body = self._body()
        if self.path == "/v2/repository/index":
            return self._send(200, [{"name": n, "version": "1", "state": s} for n, s in SLOW_MODELS.items()])
        m = re.fullmatch(r"/v2/models/([^/]+)(/versions/1)?/infer", self.path)
        if not m or m.group(1) not in SLOW_MODELS:
            return self._send(404, {"error": f"no route {self.path}"})
        name = m.group(1)
        if name == "broken":
            return self._send(500, {"error": "boom"})
        if name == "garbage":
            return self._send(200, b"this is not JSON")
        if name == "picky":
            return self._send(400, {"error": "picky refuses this request"})
        req = json.loads(body)
        value = int(np.array(req["inputs"][0]["data"]).ravel()[0])
        time.sleep(value / 1000)
        answer = {"model_name": name, "model_version": "1",
                  "outputs": [{"name": "OUTPUT0", "datatype": "INT32", "shape": [1], "data": [value]}]}
        if "id" in req:
            answer["id"] = req["id"]
        self._send(200, answer)


@pytest.fixture(scope="module")
def stand_in():
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="stand-in", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def slow_gateway(launch_gateway, stand_in):
    server = launch_gateway("tensorgate-grpc-standin", [stand_in], ["sleep", "broken", "garbage", "picky"])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def slow(slow_gateway):
    client = grpcclient.InferenceServerClient(slow_gateway.grpc_url)
    yield client
    client.close()


def sleep_input(ms: int):
    return [grpc_input("INPUT0", np.array([ms], np.int32), "INT32")]


def test_timeout_parameter_is_deadline_exceeded(slow, slow_gateway):
    """tritonclient's `timeout` (microseconds, the v2 `timeout` parameter): the gateway's
    own deadline, the same answer as REST's 504."""
    message = "the request to model 'sleep' timed out on backend 'backend-0' (the request's timeout parameter)"
    start = time.monotonic()
    grpc_error(lambda: slow.infer("sleep", sleep_input(3000), timeout=200_000), "DEADLINE_EXCEEDED", message)
    assert time.monotonic() - start < 2.5
    rest = httpclient.InferenceServerClient(slow_gateway.url, network_timeout=30.0)
    try:
        assert rest_error(lambda: rest.infer("sleep", [util.make_input("INPUT0", np.array([3000], np.int32), "INT32", False)],
                                             timeout=200_000), 504) == message
    finally:
        rest.close()


def test_grpc_deadline_is_deadline_exceeded(slow_gateway):
    raw = Raw(slow_gateway.grpc_url)
    try:
        req = raw_request("sleep", [("INPUT0", "INT32", [1], np.array([3000], np.int32), None)])
        start = time.monotonic()
        rpc_error(lambda: raw.infer(req, timeout=0.3), grpc.StatusCode.DEADLINE_EXCEEDED)
        assert time.monotonic() - start < 2.5
        # A deadline with room to spare changes nothing.
        fast = raw_request("sleep", [("INPUT0", "INT32", [1], np.array([10], np.int32), None)])
        response, _, _ = raw.infer(fast, timeout=10)
        assert int(grpcclient.InferResult(response).as_numpy("OUTPUT0")[0]) == 10
    finally:
        raw.close()


def test_backend_fault_is_internal(slow):
    grpc_error(lambda: slow.infer("broken", sleep_input(0)), "INTERNAL", "backend 'backend-0': boom")
    e = grpc_error(lambda: slow.infer("garbage", sleep_input(0)), "INTERNAL")
    assert e.message().startswith("backend 'backend-0' sent an invalid response: "), e.message()


def test_backend_client_error_is_invalid_argument(slow):
    grpc_error(lambda: slow.infer("picky", sleep_input(0)), "INVALID_ARGUMENT", "picky refuses this request")


def test_model_without_a_ready_backend_is_unavailable(slow):
    assert slow.is_model_ready("sleep")
    assert not slow.is_model_ready("down")
    grpc_error(lambda: slow.infer("down", sleep_input(0)), "UNAVAILABLE", "no healthy backend serves model 'down'")


def test_stream_answers_in_request_order_while_running_concurrently(slow):
    sleeps = [800, 50, 600, 0, 300]
    stream = StreamCollector(slow)
    try:
        start = time.monotonic()
        for i, ms in enumerate(sleeps):
            stream.client.async_stream_infer("sleep", sleep_input(ms), request_id=f"r{i}")
        results = stream.take(len(sleeps))
        elapsed = time.monotonic() - start
    finally:
        stream.close()
    assert [e for _, e in results if e is not None] == []
    assert [r.get_response().id for r, _ in results] == [f"r{i}" for i in range(len(sleeps))]
    assert [int(r.as_numpy("OUTPUT0")[0]) for r, _ in results] == sleeps
    assert elapsed < sum(sleeps) / 1000, f"{elapsed:.2f} s: the stream's requests ran one after another"


def test_shedding_is_unavailable(launch_gateway, stand_in):
    gw = launch_gateway("tensorgate-grpc-shed", [stand_in], ["sleep"],
                        config="[limits]\nmax_concurrent_requests = 1\n")
    first = grpcclient.InferenceServerClient(gw.grpc_url)
    second = grpcclient.InferenceServerClient(gw.grpc_url)
    outcome: Dict[str, object] = {}
    try:
        t = threading.Thread(target=lambda: outcome.setdefault("first", first.infer("sleep", sleep_input(2000))))
        t.start()
        time.sleep(0.7)
        grpc_error(lambda: second.infer("sleep", sleep_input(0)), "UNAVAILABLE",
                   "tensorgate is handling its limit of 1 concurrent requests (limits.max_concurrent_requests); retry later")
        # Health RPCs hold no permit.
        assert second.is_server_live() and second.is_model_ready("sleep")
        t.join(timeout=WAIT_S)
        assert int(outcome["first"].as_numpy("OUTPUT0")[0]) == 2000
        assert int(second.infer("sleep", sleep_input(0)).as_numpy("OUTPUT0")[0]) == 0
    finally:
        first.close()
        second.close()
        gw.stop()


def test_drain(launch_gateway, stand_in):
    """SIGTERM: readiness and grpc.health turn false at once while requests are still served
    for shutdown_delay_ms; then the listener closes (a new connection is UNAVAILABLE), the
    request in flight finishes, and the process exits 0."""
    gw = launch_gateway("tensorgate-grpc-drain", [stand_in], ["sleep"],
                        config="[limits]\nshutdown_delay_ms = 1500\ndrain_timeout_ms = 10000\n")
    in_flight = grpcclient.InferenceServerClient(gw.grpc_url)
    outcome: Dict[str, object] = {}

    def run():
        try:
            outcome["result"] = in_flight.infer("sleep", sleep_input(3500))
        except Exception as e:  # reported below
            outcome["error"] = e

    try:
        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.3)
        gw.proc.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        during = Raw(gw.grpc_url)
        try:
            assert not during.stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=5).ready
            assert during.stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=5).live
            status = during.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
            response, _, _ = during.infer(raw_request("sleep", [("INPUT0", "INT32", [1], np.array([0], np.int32), None)]))
            assert int(grpcclient.InferResult(response).as_numpy("OUTPUT0")[0]) == 0
        finally:
            during.close()
        time.sleep(1.8)  # past shutdown_delay_ms: the listener is closed
        after = Raw(gw.grpc_url)
        try:
            rpc_error(lambda: after.stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=3),
                      grpc.StatusCode.UNAVAILABLE)
        finally:
            after.close()
        t.join(timeout=WAIT_S)
        assert "error" not in outcome, outcome.get("error")
        assert int(outcome["result"].as_numpy("OUTPUT0")[0]) == 3500
        assert gw.proc.proc.wait(timeout=WAIT_S) == 0
    finally:
        in_flight.close()
        gw.stop()


# ---------------------------------------------------------------- auth


@pytest.fixture(scope="module")
def auth_gateway(launch_gateway):
    server = launch_gateway("tensorgate-grpc-auth", config='[auth]\ntokens_env = "TG_TOKENS"\n',
                            env={"TG_TOKENS": "secret"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def auth_client(auth_gateway):
    client = grpcclient.InferenceServerClient(auth_gateway.grpc_url)
    yield client
    client.close()


GOOD = {"authorization": "Bearer secret"}
UNAUTHENTICATED = "missing or invalid bearer token"


def test_auth_infer(auth_client):
    a, b = util.simple_operands(74, batch=1)
    for headers in (None, {"authorization": "Bearer wrong"}, {"authorization": "secret"}):
        grpc_error(lambda: auth_client.infer("simple", simple_grpc(a, b), headers=headers),
                   "UNAUTHENTICATED", UNAUTHENTICATED)
    result = auth_client.infer("simple", simple_grpc(a, b), headers=GOOD)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


@pytest.mark.parametrize("call", [
    lambda c, h: c.get_server_metadata(headers=h),
    lambda c, h: c.get_model_metadata("simple", headers=h),
    lambda c, h: c.get_model_config("simple", headers=h),
    lambda c, h: c.get_model_repository_index(headers=h),
    lambda c, h: c.get_inference_statistics("simple", headers=h),
], ids=["server-metadata", "model-metadata", "model-config", "index", "statistics"])
def test_auth_other_rpcs(auth_client, call):
    grpc_error(lambda: call(auth_client, None), "UNAUTHENTICATED", UNAUTHENTICATED)
    call(auth_client, GOOD)


def test_auth_health_is_exempt(auth_client, auth_gateway):
    assert auth_client.is_server_live()
    assert auth_client.is_server_ready()
    assert auth_client.is_model_ready("simple")
    raw = Raw(auth_gateway.grpc_url)
    try:
        status = raw.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    finally:
        raw.close()


def test_auth_stream(auth_client):
    a, b = util.simple_operands(75, batch=1)
    stream = StreamCollector(auth_client)
    try:
        # The gateway refuses the whole stream at once, so tritonclient may already have
        # marked it broken (and says so) before this request is queued.
        try:
            stream.client.async_stream_infer("simple", simple_grpc(a, b))
        except InferenceServerException as e:
            assert "no longer in valid state" in e.message(), e.message()
        [(result, error)] = stream.take(1)
    finally:
        stream.close()
    assert result is None and error is not None
    assert (error.status(), error.message()) == ("StatusCode.UNAUTHENTICATED", UNAUTHENTICATED)
    stream = StreamCollector(auth_client, headers=GOOD)
    try:
        stream.client.async_stream_infer("simple", simple_grpc(a, b))
        [(result, error)] = stream.take(1)
    finally:
        stream.close()
    assert error is None, error
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


# ---------------------------------------------------------------- limits


@pytest.fixture(scope="module")
def limits_gateway(launch_gateway):
    server = launch_gateway("tensorgate-grpc-limits",
                            config="[limits]\nmax_body_bytes = 1000\nmax_tensor_elements = 100\n")
    yield server
    server.stop()


def test_message_over_max_body_bytes(limits_gateway):
    client = grpcclient.InferenceServerClient(limits_gateway.grpc_url)
    try:
        small = np.arange(50, dtype=np.uint8).reshape(1, 50)
        assert bits(client.infer("identity_uint8", [grpc_input("INPUT0", small, "UINT8")]).as_numpy("OUTPUT0")) == bits(small)
        big = np.zeros((1, 1200), dtype=np.uint8)
        grpc_error(lambda: client.infer("identity_uint8", [grpc_input("INPUT0", big, "UINT8")]), "RESOURCE_EXHAUSTED",
                   "the request message is larger than the limit of 1000 bytes (limits.max_body_bytes)")
    finally:
        client.close()


def test_stream_message_over_max_body_bytes(limits_gateway):
    """A message over the limit on a stream gets the same answer as a unary one: the
    stream may end there (its framing is not read further), but not silently."""
    client = grpcclient.InferenceServerClient(limits_gateway.grpc_url)
    stream = StreamCollector(client)
    try:
        small = np.arange(10, dtype=np.uint8).reshape(1, 10)
        stream.client.async_stream_infer("identity_uint8", [grpc_input("INPUT0", small, "UINT8")], request_id="ok")
        [(result, error)] = stream.take(1)
        assert error is None and result.get_response().id == "ok", error
        big = np.zeros((1, 1200), dtype=np.uint8)
        stream.client.async_stream_infer("identity_uint8", [grpc_input("INPUT0", big, "UINT8")], request_id="big")
        try:
            [(result, error)] = stream.take(1, timeout_s=5.0)
        except queue.Empty:
            raise AssertionError("no answer for the message over the limit: the stream ended silently") from None
        assert result is None and error is not None
        assert (error.status(), error.message()) == (
            "StatusCode.RESOURCE_EXHAUSTED", "the request message is larger than the limit of 1000 bytes (limits.max_body_bytes)")
    finally:
        stream.close()
        client.close()


def test_tensor_over_max_elements_as_over_rest(limits_gateway):
    message = "input 'INPUT0': shape [1,200] has 200 elements; the limit is 100 per tensor"
    x = np.zeros((1, 200), dtype=np.uint8)
    client = grpcclient.InferenceServerClient(limits_gateway.grpc_url)
    rest = httpclient.InferenceServerClient(limits_gateway.url)
    try:
        grpc_error(lambda: client.infer("identity_uint8", [grpc_input("INPUT0", x, "UINT8")]),
                   "RESOURCE_EXHAUSTED", message)
        assert rest_error(lambda: rest.infer("identity_uint8", [util.make_input("INPUT0", x, "UINT8", True)]), 413) == message
    finally:
        client.close()
        rest.close()


# ---------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for localhost and a client certificate (test_pki, as in
    test_tls.py)."""
    tool = Path(os.environ.get("TG_TEST_PKI_BIN", REPO_ROOT / "target" / "debug" / "examples" / "test_pki"))
    if not tool.exists():
        pytest.fail(f"{tool} is not built: run cargo build --examples")
    d = tmp_path_factory.mktemp("grpc-pki")
    subprocess.run([str(tool), str(d)], check=True, capture_output=True, timeout=60)
    return d


def tls_config(pki, mtls: bool) -> str:
    client_ca = f'client_ca = "{pki / "ca.crt"}"\n' if mtls else ""
    return f'[server.tls]\ncert = "{pki / "server.crt"}"\nkey = "{pki / "server.key"}"\n{client_ca}'


def test_tls(launch_gateway, pki):
    gw = launch_gateway("tensorgate-grpc-tls", config=tls_config(pki, False), tls_ca=pki / "ca.crt")
    try:
        client = grpcclient.InferenceServerClient(gw.grpc_url, ssl=True, root_certificates=str(pki / "ca.crt"))
        try:
            a, b = util.simple_operands(76, batch=1)
            np.testing.assert_array_equal(client.infer("simple", simple_grpc(a, b)).as_numpy("OUTPUT0"), a + b)
            assert client.get_server_metadata().name == "tensorgate"
        finally:
            client.close()
        plain = grpcclient.InferenceServerClient(gw.grpc_url)
        try:
            grpc_error(lambda: plain.is_server_live(client_timeout=5), "UNAVAILABLE")
        finally:
            plain.close()
    finally:
        gw.stop()


def test_mtls(launch_gateway, pki):
    gw = launch_gateway("tensorgate-grpc-mtls", config=tls_config(pki, True), tls_ca=pki / "ca.crt",
                        tls_client=(pki / "client.crt", pki / "client.key"))
    with_cert = grpcclient.InferenceServerClient(
        gw.grpc_url, ssl=True, root_certificates=str(pki / "ca.crt"),
        private_key=str(pki / "client.key"), certificate_chain=str(pki / "client.crt"))
    without = grpcclient.InferenceServerClient(gw.grpc_url, ssl=True, root_certificates=str(pki / "ca.crt"))
    try:
        a, b = util.simple_operands(77, batch=1)
        np.testing.assert_array_equal(with_cert.infer("simple", simple_grpc(a, b)).as_numpy("OUTPUT0"), a + b)
        grpc_error(lambda: without.infer("simple", simple_grpc(a, b), client_timeout=5), "UNAVAILABLE")
    finally:
        with_cert.close()
        without.close()
        gw.stop()
