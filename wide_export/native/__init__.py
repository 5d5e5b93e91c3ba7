"""Native code from Python: build plugins/ with CMake (`build`) and call the CUDA
kernels through ctypes on torch tensors (`kernels`)."""
