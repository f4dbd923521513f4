"""tritonclient against MLServer directly (JSON) and through tensorgate (binary), with the
same model and load: 4 client threads for a fixed time each, in interleaved rounds. Prints
JSON results (medians, and the ratio of each round)."""
import json
import statistics
import sys
import threading
import time

import numpy as np
import tritonclient.http as http

direct, gateway, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])


def run(url, binary):
    a = np.arange(64 * 16, dtype=np.int32).reshape(64, 16)
    counts = []

    def worker():
        c = http.InferenceServerClient(url)
        inputs = [http.InferInput("INPUT0", [64, 16], "INT32"), http.InferInput("INPUT1", [64, 16], "INT32")]
        inputs[0].set_data_from_numpy(a, binary_data=binary)
        inputs[1].set_data_from_numpy(a, binary_data=binary)
        outputs = [http.InferRequestedOutput("OUTPUT0", binary_data=binary)]
        n, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            r = c.infer("simple", inputs, outputs=outputs)
            assert r.as_numpy("OUTPUT0")[0, 1] == 2
            n += 1
        counts.append(n)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / seconds


# Interleaved rounds, reported as medians: a shared VM's speed drifts between minutes, and
# a single direct run followed by a single gateway run measures the drift as much as the
# gateway.
ROUNDS = 3
run(direct, False)  # warm up
run(gateway, True)
rounds = [(run(direct, False), run(gateway, True)) for _ in range(ROUNDS)]
print(json.dumps({
    "direct_json_rps": statistics.median(d for d, _ in rounds),
    "gateway_binary_rps": statistics.median(g for _, g in rounds),
    "ratio": statistics.median(g / d for d, g in rounds),
    "round_ratios": [g / d for d, g in rounds],
}))
