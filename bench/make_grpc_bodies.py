"""Writes the bodies of the gRPC-against-REST comparison (bench/grpc_vs_rest.sh), each the
same inference in the three encodings a client can choose: gRPC (one length-prefixed
ModelInferRequest frame, raw contents, as tritonclient.grpc sends it), REST binary (JSON
header plus raw bytes) and REST JSON. Prints the REST binary header lengths as JSON."""
import json
import struct
import sys
from pathlib import Path

import numpy as np
from tritonclient.grpc import service_pb2 as pb

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)


def grpc_frame(model, inputs, outputs):
    m = pb.ModelInferRequest(model_name=model)
    for name, arr, dt in inputs:
        t = m.inputs.add()
        t.name, t.datatype = name, dt
        t.shape.extend(arr.shape)
        m.raw_input_contents.append(arr.tobytes())
    for name in outputs:
        m.outputs.add().name = name
    body = m.SerializeToString()
    return b"\x00" + struct.pack(">I", len(body)) + body


def rest_binary(inputs, outputs):
    header = json.dumps({
        "inputs": [{"name": n, "shape": list(a.shape), "datatype": dt,
                    "parameters": {"binary_data_size": a.nbytes}} for n, a, dt in inputs],
        "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs],
    }).encode()
    return header, header + b"".join(a.tobytes() for _, a, _ in inputs)


def rest_json(inputs, outputs):
    return json.dumps({
        "inputs": [{"name": n, "shape": list(a.shape), "datatype": dt, "data": a.flatten().tolist()}
                   for n, a, dt in inputs],
        "outputs": [{"name": o} for o in outputs],
    }).encode()


lengths = {}
a = np.arange(16, dtype=np.int32).reshape(1, 16)
b = np.ones((1, 16), dtype=np.int32)
small = [("INPUT0", a, "INT32"), ("INPUT1", b, "INT32")]
(out / "simple.grpc").write_bytes(grpc_frame("simple", small, ["OUTPUT0", "OUTPUT1"]))
header, body = rest_binary(small, ["OUTPUT0", "OUTPUT1"])
(out / "simple.bin").write_bytes(body)
lengths["simple"] = len(header)
(out / "simple.json").write_bytes(rest_json(small, ["OUTPUT0", "OUTPUT1"]))

n = 1 << 20
big = [("INPUT0", np.random.default_rng(1).random((1, n), dtype=np.float32), "FP32")]
(out / "fp32_1m.grpc").write_bytes(grpc_frame("identity_fp32", big, ["OUTPUT0"]))
header, body = rest_binary(big, ["OUTPUT0"])
(out / "fp32_1m.bin").write_bytes(body)
lengths["fp32_1m"] = len(header)
print(json.dumps(lengths))
