"""Writes the large-tensor bodies: FP32 with 1M elements as JSON and as binary, and a 16 MB
binary body (4M FP32). Prints the JSON header lengths for Inference-Header-Content-Length."""
import json
import struct
import sys
from pathlib import Path

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
n = 1_000_000
vals = [((i * 2654435761) % 1000003) / 1000003.0 for i in range(n)]
json_body = {"inputs": [{"name": "INPUT0", "shape": [1, n], "datatype": "FP32", "data": vals}],
             "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
(out / "fp32_1m_json_to_binary.json").write_text(json.dumps(json_body))
raw = struct.pack(f"<{n}f", *vals)


def binary(name, count, data, binary_out):
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "shape": [1, count], "datatype": "FP32", "parameters": {"binary_data_size": len(data)}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": binary_out}}],
    }).encode()
    (out / name).write_bytes(header + data)
    return len(header)


h1 = binary("fp32_1m_binary_to_json.bin", n, raw, False)
big = raw * 4
h2 = binary("fp32_4m_passthrough.bin", 4 * n, big, True)
mb = bytes(range(256)) * 4096  # 1 MiB
header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, len(mb)], "datatype": "UINT8",
                                 "parameters": {"binary_data_size": len(mb)}}],
                     "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
(out / "uint8_1mb.bin").write_bytes(header + mb)
print(json.dumps({"binary_to_json": h1, "passthrough": h2, "uint8_1mb": len(header)}))
