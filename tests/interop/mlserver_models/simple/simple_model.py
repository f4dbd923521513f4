"""MLServer custom runtime that mirrors tensorgate's built-in `simple` model.

INPUT0, INPUT1: INT32 [-1, 16]  ->  OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1
(int32 arithmetic that wraps on overflow, like Triton's `simple` example).
"""

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse


def _input(payload: InferenceRequest, name: str) -> np.ndarray:
    found = [i for i in payload.inputs if i.name == name]
    if len(found) != 1:
        raise InferenceError(f"expected exactly one input '{name}'")
    tensor = found[0]
    if tensor.datatype != "INT32":
        raise InferenceError(
            f"input '{name}' has datatype {tensor.datatype}, model expects INT32"
        )
    shape = list(tensor.shape)
    if len(shape) != 2 or shape[1] != 16:
        raise InferenceError(f"input '{name}' has shape {shape}, model expects [-1,16]")
    return NumpyCodec.decode_input(tensor).astype(np.int32, copy=False)


class SimpleModel(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        for tensor in payload.inputs:
            if tensor.name not in ("INPUT0", "INPUT1"):
                raise InferenceError(f"unexpected input '{tensor.name}'")
        a = _input(payload, "INPUT0")
        b = _input(payload, "INPUT1")
        if a.shape != b.shape:
            raise InferenceError(
                f"INPUT0 shape {list(a.shape)} differs from INPUT1 shape {list(b.shape)}"
            )
        with np.errstate(over="ignore"):
            total = (a + b).astype(np.int32)
            diff = (a - b).astype(np.int32)
        return InferenceResponse(
            id=payload.id,
            model_name=self.name,
            model_version=self.version,
            outputs=[
                NumpyCodec.encode_output("OUTPUT0", total),
                NumpyCodec.encode_output("OUTPUT1", diff),
            ],
        )
