"""A small tritonclient wrapper for the generation model (HTTP or gRPC)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from wide_export.errors import WideError

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
        outputs = [self._module.InferRequestedOutput("output_ids")]
        if self.protocol == "http":
            result = self._client.infer(self.model, tensors, outputs=outputs, timeout=int(self.timeout * 1e6))
        else:
            result = self._client.infer(self.model, tensors, outputs=outputs, client_timeout=self.timeout)
        return result.as_numpy("output_ids")

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
        inputs = {"input_ids": (ids, "INT64"),
                  "max_new_tokens": (np.full((batch, 1), max_new_tokens, np.int32), "INT32")}
        if temperature is not None:
            inputs["temperature"] = (np.full((batch, 1), temperature, np.float32), "FP32")
        if top_p is not None:
            inputs["top_p"] = (np.full((batch, 1), top_p, np.float32), "FP32")
        if seed is not None:
            inputs["seed"] = (np.full((batch, 1), seed, np.int64), "INT64")
        if ignore_eos is not None:
            inputs["ignore_eos"] = (np.full((batch, 1), ignore_eos, np.bool_), "BOOL")
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
