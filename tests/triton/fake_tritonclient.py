"""InferInput / InferRequestedOutput of a fake `tritonclient.http` or `tritonclient.grpc` module: they
keep what the code under test gave them (the client and supervise unit tests read it back)."""

from __future__ import annotations


class InferInput:
    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, shape, dtype
        self.data = None

    def set_data_from_numpy(self, array):
        self.data = array


class InferRequestedOutput:
    def __init__(self, name):
        self.name = name
