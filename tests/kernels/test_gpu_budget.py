"""scripts/gpu-check.sh's test stage must fit its timeout: bound the cold JIT compiles its gpu cases need.

Counted on CPU (tests/kernels/jit_budget.py records the launches of every gpu-marked case of
test_kernels.py instead of running them). At ~1 s per cold specialisation on the device, the budget
leaves the rest of the stage's 150 s for the C-runtime tests and the Llama layer."""

from __future__ import annotations

JIT_BUDGET = 80


def test_gpu_cases_need_a_bounded_number_of_jit_specialisations(capsys):
    from tests.kernels.jit_budget import gpu_test_keys

    keys = gpu_test_keys()
    with capsys.disabled():
        print(f"\ngpu cases of test_kernels.py: {len(keys)} JIT specialisations (budget {JIT_BUDGET})")
    assert len(keys) <= JIT_BUDGET
    # the count is real: every decode kernel and algorithm is among them
    names = {k[0] for k in keys}
    assert {"wide_gemv_n_kernel", "wide_gemv_k_kernel", "wide_splitk_reduce_kernel", "wide_router_split_kernel",
            "wide_tile_gemm_n_kernel", "wide_grouped_gemm_n_kernel"} <= names
