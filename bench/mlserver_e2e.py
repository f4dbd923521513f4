"""tritonclient against MLServer directly (JSON) and through tensorgate (binary), with the
same model and load: 4 client threads for a fixed time each. Prints JSON results."""
import json
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


run(direct, False)  # warm up
d = run(direct, False)
g = run(gateway, True)
print(json.dumps({"direct_json_rps": d, "gateway_binary_rps": g, "ratio": g / d}))
