"""A real KServe 0.21 ModelServer (pip `kserve`) with two custom v2 models, for the interop
tests (tests/interop/test_kserve.py). Run with the Python of .venv-kserve:

    python addsub_server.py --http_port PORT --enable_grpc false [--host 127.0.0.1]

Every argument but --host is KServe's own (kserve.model_server parses sys.argv when it is
imported): --http_port, --enable_grpc, --grpc_port, ... The v2 REST endpoints are always on;
--protocol only concerns a transformer's calls to its predictor, so it is not needed.

Models:
  addsub  INPUT0, INPUT1 FP32 [-1, 4] -> OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1.
          Written like the custom model of KServe's documentation: it returns every output,
          always as JSON, whatever the request asked (requested outputs and binary_data are
          not passed on to InferResponse). A NaN in an input gives NaN outputs, which KServe
          writes as JSON null (orjson); so does an infinity.
  double  INPUT0 FP32 [-1, 4] -> OUTPUT0 = 2 * INPUT0. Written like KServe's own predictors
          (kserve.utils.utils.get_predict_response): it honours the requested outputs and
          their binary_data, so KServe's binary output path is exercised too.
  half    INPUT0 FP16 [-1, 4] -> OUTPUT0 = 2 * INPUT0, FP16, like double. KServe refuses FP16
          in JSON ("Please use the binary data format"), so it works only in binary.

Both return a string `id` (the request's, else a new UUID), as KServe requires. Nothing here
works around how KServe answers (metadata without versions, no repository index, ...): the
point is to test the gateway against KServe as it is. The one change is the listen address:
KServe hard-codes 0.0.0.0, and the tests listen on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, Optional

_own = argparse.ArgumentParser(add_help=False)
_own.add_argument("--host", default="127.0.0.1")
_own_args, _rest = _own.parse_known_args()
# kserve.model_server parses sys.argv at import: leave it only its own arguments.
sys.argv = [sys.argv[0]] + _rest

import numpy as np  # noqa: E402
import kserve  # noqa: E402
from kserve import InferOutput, InferRequest, InferResponse  # noqa: E402
from kserve.protocol.rest import server as rest_server  # noqa: E402
from kserve.utils.utils import generate_uuid  # noqa: E402

_init = rest_server.RESTServer.__init__


def _init_on_host(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.config.host = _own_args.host  # uvicorn binds when it starts serving


rest_server.RESTServer.__init__ = _init_on_host

FP32_4 = {"datatype": "FP32", "shape": [-1, 4]}


class AddSub(kserve.Model):
    def __init__(self, name: str = "addsub"):
        super().__init__(name)
        self.load()

    def get_input_types(self):
        return [dict(name="INPUT0", **FP32_4), dict(name="INPUT1", **FP32_4)]

    def get_output_types(self):
        return [dict(name="OUTPUT0", **FP32_4), dict(name="OUTPUT1", **FP32_4)]

    def predict(self, payload: InferRequest, headers: Optional[Dict[str, str]] = None) -> InferResponse:
        by_name = {i.name: i.as_numpy().astype(np.float32) for i in payload.inputs}
        a, b = by_name["INPUT0"], by_name["INPUT1"]
        outputs = []
        for name, value in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
            out = InferOutput(name=name, shape=list(value.shape), datatype="FP32")
            out.set_data_from_numpy(value, binary_data=False)
            outputs.append(out)
        return InferResponse(model_name=self.name, infer_outputs=outputs,
                             response_id=payload.id if payload.id else generate_uuid())


class Double(kserve.Model):
    def __init__(self, name: str = "double"):
        super().__init__(name)
        self.load()

    def get_input_types(self):
        return [dict(name="INPUT0", **FP32_4)]

    def get_output_types(self):
        return [dict(name="OUTPUT0", **FP32_4)]

    def predict(self, payload: InferRequest, headers: Optional[Dict[str, str]] = None) -> InferResponse:
        x = payload.inputs[0].as_numpy().astype(np.float32)
        out = InferOutput(name="OUTPUT0", shape=list(x.shape), datatype="FP32")
        out.set_data_from_numpy(2 * x, binary_data=payload.use_binary_outputs)
        return InferResponse(model_name=self.name, infer_outputs=[out],
                             response_id=payload.id if payload.id else generate_uuid(),
                             use_binary_outputs=payload.use_binary_outputs,
                             requested_outputs=payload.request_outputs)


class Half(Double):
    def __init__(self, name: str = "half"):
        super().__init__(name)

    def get_input_types(self):
        return [dict(name="INPUT0", datatype="FP16", shape=[-1, 4])]

    def get_output_types(self):
        return [dict(name="OUTPUT0", datatype="FP16", shape=[-1, 4])]

    def predict(self, payload: InferRequest, headers: Optional[Dict[str, str]] = None) -> InferResponse:
        x = payload.inputs[0].as_numpy().astype(np.float16)
        out = InferOutput(name="OUTPUT0", shape=list(x.shape), datatype="FP16")
        out.set_data_from_numpy(2 * x, binary_data=True)
        return InferResponse(model_name=self.name, infer_outputs=[out],
                             response_id=payload.id if payload.id else generate_uuid(),
                             use_binary_outputs=True,
                             requested_outputs=payload.request_outputs)


if __name__ == "__main__":
    kserve.ModelServer().start([AddSub(), Double(), Half()])
