"""tritonclient straight to MLServer, JSON only: checks the MLServer models and the harness
without the gateway, and pins down what MLServer 1.7 lacks (the reason the gateway
transcodes and filters)."""

import numpy as np
import pytest
import tritonclient.http as httpclient

from interop_util import expect_error, make_input, output_names, run_simple, simple_operands


def test_server_and_model_metadata(mlserver_client):
    assert mlserver_client.is_server_live()
    assert mlserver_client.is_server_ready()
    meta = mlserver_client.get_server_metadata()
    assert meta["name"] == "mlserver"
    assert meta["version"].startswith("1.7.")
    model = mlserver_client.get_model_metadata("simple")
    assert [(t["name"], t["datatype"], t["shape"]) for t in model["inputs"]] == [
        ("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])]
    assert [(t["name"], t["datatype"], t["shape"]) for t in model["outputs"]] == [
        ("OUTPUT0", "INT32", [-1, 16]), ("OUTPUT1", "INT32", [-1, 16])]
    ident = mlserver_client.get_model_metadata("identity_fp32")
    assert [(t["name"], t["datatype"], t["shape"]) for t in ident["inputs"]] == [
        ("INPUT0", "FP32", [-1, -1])]
    assert mlserver_client.is_model_ready("simple")
    assert mlserver_client.is_model_ready("identity_fp32")
    assert not mlserver_client.is_model_ready("no_such_model")


def test_simple_json(mlserver_client):
    run_simple(mlserver_client, in_bin=(False, False), out_bin=(False, False))


def test_identity_fp32_json_exact(mlserver_client):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((4, 9)) * 1e3).astype(np.float32)
    x[0, :4] = [np.float32(1e-45), np.finfo(np.float32).max, np.finfo(np.float32).tiny, -0.0]
    result = mlserver_client.infer(
        "identity_fp32", [make_input("INPUT0", x, "FP32", False)],
        outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    got = result.as_numpy("OUTPUT0").astype(np.float32)
    assert got.shape == x.shape
    assert got.tobytes() == x.tobytes()


def test_unknown_model_404(mlserver_client):
    a, b = simple_operands(1)
    inputs = [make_input("INPUT0", a, "INT32", False), make_input("INPUT1", b, "INT32", False)]
    expect_error(lambda: mlserver_client.infer("no_such_model", inputs), 404, "no_such_model")


# --- What MLServer 1.7 itself does not do (characterisation of the pinned version). ---

def test_mlserver_ignores_requested_outputs(mlserver_client):
    a, b = simple_operands(2)
    inputs = [make_input("INPUT0", a, "INT32", False), make_input("INPUT1", b, "INT32", False)]
    result = mlserver_client.infer(
        "simple", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)])
    # Both outputs, both JSON: the output list and binary_data are ignored.
    assert output_names(result) == ["OUTPUT0", "OUTPUT1"]
    assert "binary_data_size" not in (result.get_output("OUTPUT1").get("parameters") or {})


def test_mlserver_rejects_binary_input(mlserver_client):
    a, b = simple_operands(3)
    inputs = [make_input("INPUT0", a, "INT32", True), make_input("INPUT1", b, "INT32", False)]
    with pytest.raises(Exception) as info:
        mlserver_client.infer("simple", inputs)
    assert info.value.status() == "422"
