"""A small tritonclient wrapper for the generation model (HTTP or gRPC)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from wide_export.base.errors import WideError
from wide_export.tritonserver import contract as C

PROTOCOLS = ("http", "grpc")


class GenerationClient:
    """Send generation requests to a served WIDE model.

    `url` is host:port (loopback for the servers we start). One client per
    thread: tritonclient clients are not meant to be shared across threads.
    """

    def __init__(self, url: str, protocol: str = "http", model: str = "wide_llm", timeout: float = 120.0):
        if protocol not in PROTOCOLS:
            raise WideError(f"unknown protocol {protocol!r}", hint="http or grpc")
        self.protocol, self.model, self.timeout = protocol, model, timeout
        if protocol == "http":
            import tritonclient.http as module

            self._client = module.InferenceServerClient(url, connection_timeout=timeout, network_timeout=timeout)
        else:
            import tritonclient.grpc as module

            self._client = module.InferenceServerClient(url)
        self._module = module

    def _input(self, name: str, array: np.ndarray, dtype: str):
        tensor = self._module.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        return tensor

    def raw_infer(self, inputs: dict[str, tuple[np.ndarray, str]]) -> np.ndarray:
        """Send arbitrary tensors ({name: (array, triton dtype)}); returns output_ids."""
        tensors = [self._input(name, array, dtype) for name, (array, dtype) in inputs.items()]
        outputs = [self._module.InferRequestedOutput(C.OUTPUT_IDS)]
        if self.protocol == "http":
            result = self._client.infer(self.model, tensors, outputs=outputs, timeout=int(self.timeout * 1e6))
        else:
            result = self._client.infer(self.model, tensors, outputs=outputs, client_timeout=self.timeout)
        return result.as_numpy(C.OUTPUT_IDS)

    def generate(
        self,
        prompt: np.ndarray,
        max_new_tokens: int,
        temperature: Optional[float] = None,
        top_p: Optional[float] = None,
        seed: Optional[int] = None,
        ignore_eos: Optional[bool] = None,
    ) -> np.ndarray:
        """New tokens for `prompt` ([T] or [B, T] int64): [max_new_tokens] or [B, max_new_tokens] at most
        (fewer when every row stopped at an end-of-sequence id; `ignore_eos=True`: exactly max_new_tokens)."""
        ids = np.asarray(prompt, dtype=np.int64)
        single = ids.ndim == 1
        ids = ids.reshape(1, -1) if single else ids
        batch = ids.shape[0]
        given = {C.MAX_NEW_TOKENS: (max_new_tokens, np.int32), C.TEMPERATURE: (temperature, np.float32),
                 C.TOP_P: (top_p, np.float32), C.SEED: (seed, np.int64), C.IGNORE_EOS: (ignore_eos, np.bool_)}
        inputs = {C.INPUT_IDS: (ids, C.client_dtype(C.INPUT_IDS))}
        inputs.update({name: (np.full((batch, 1), value, dtype), C.client_dtype(name))
                       for name, (value, dtype) in given.items() if value is not None})
        out = self.raw_infer(inputs)
        return out[0] if single else out

    def is_ready(self) -> bool:
        """Whether the server and the model are ready."""
        return bool(self._client.is_server_ready()) and bool(self._client.is_model_ready(self.model))

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "GenerationClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
