"""MLServer custom runtime: FP32 [-1, -1] INPUT0 -> OUTPUT0, unchanged."""

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse


class IdentityModel(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        if len(payload.inputs) != 1 or payload.inputs[0].name != "INPUT0":
            names = [i.name for i in payload.inputs]
            raise InferenceError(f"expected exactly one input 'INPUT0', got {names}")
        tensor = payload.inputs[0]
        if tensor.datatype != "FP32":
            raise InferenceError(
                f"input 'INPUT0' has datatype {tensor.datatype}, model expects FP32"
            )
        if len(tensor.shape) != 2:
            raise InferenceError(
                f"input 'INPUT0' has shape {list(tensor.shape)}, model expects [-1,-1]"
            )
        data = NumpyCodec.decode_input(tensor).astype(np.float32, copy=False)
        return InferenceResponse(
            id=payload.id,
            model_name=self.name,
            model_version=self.version,
            outputs=[NumpyCodec.encode_output("OUTPUT0", data)],
        )
