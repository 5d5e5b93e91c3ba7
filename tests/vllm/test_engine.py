"""WIDE through vLLM's engine on CPU: greedy tokens equal to transformers with the routers hooked and the LoRA
merged by hand (support.reference_tokens), for every family, with prefix caching and chunked prefill, eager
and compiled, with the kernels' custom ops, at tensor parallel 2 and pipeline parallel 2; and the refusals
of a mismatched folder at load. Each engine runs in its own child process (support.run_engine)."""

from __future__ import annotations

import json

import pytest

from tests.vllm.support import (CACHED, PROMPTS, checkpoint, engine_env, export, hf_cache, reference_tokens,
                                run_engine)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(checkpoint, folder, reference tokens) of the Llama family (attention_bias: q, k, v and o biases)."""
    root = tmp_path_factory.mktemp("vllm-llama")
    ckpt = checkpoint(root / "ckpt", "llama")
    return ckpt, export(ckpt, root / "out"), reference_tokens(ckpt)


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_each_family_equals_the_reference_with_prefix_caching_and_chunked_prefill(family, tmp_path, llama):
    if family == "llama":
        ckpt, out, want = llama
    else:
        ckpt = checkpoint(tmp_path / "ckpt", family)
        out, want = export(ckpt, tmp_path / "out"), reference_tokens(ckpt)
    dense = reference_tokens(ckpt, routed=False)
    assert dense != want, "the routers change no token: this model cannot tell WIDE from its dense twin"
    got = run_engine(out, tmp_path, rounds=2, enforce_eager=True, **CACHED)
    assert got["rounds"][0] == want
    assert got["rounds"][1] == want  # the same batch again, its prefix blocks now from the cache
    assert got["prefix_cache_hits"], "the second round found nothing in the prefix cache"


def test_compiled_equals_the_reference(llama, tmp_path):
    """Compiled (vLLM's default: torch.compile, inductor on CPU), from the folder as the Hugging Face cache
    stores a downloaded repository: the snapshot's files are links into its blobs/, which the plugin's
    confinement check admits."""
    _, out, want = llama
    snapshot = hf_cache(out, tmp_path / "hub")
    got = run_engine(snapshot, tmp_path, **CACHED)
    assert got["tokens"] == want


def test_router_custom_op_compiled(llama, tmp_path):
    """WIDE_VLLM_KERNELS=triton: the router runs our Triton kernel (here in its CPU interpreter) as the
    custom op torch.ops.wide_vllm.router, traced through its fake implementation by torch.compile. (vLLM's
    CPU backend repacks the linear layers' weights for its own GEMM, so on CPU the masked projections stay
    native; on CUDA they run the kernels too.)"""
    _, out, want = llama
    env = engine_env(WIDE_VLLM_KERNELS="triton", TRITON_INTERPRET="1")
    got = run_engine(out, tmp_path, env=env)
    assert got["tokens"] == want


def test_cpu_kernels_serve_the_routed_projections(llama, tmp_path):
    """On CPU the default mode (auto = cpu) runs wide_export.cpu's kernels: q, gate/up and o / down with
    their own weight layouts. The engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) counts the
    kernels' calls: decode's single tokens take the masked kernels; the tokens equal the reference."""
    _, out, want = llama
    got = run_engine(out, tmp_path, env=engine_env(VLLM_ENABLE_V1_MULTIPROCESSING="0"), enforce_eager=True)
    assert got["tokens"] == want
    for kind in ("n", "gated", "kt"):
        assert got["cpu_paths"].get(f"{kind}/masked", 0) > 0, got["cpu_paths"]


def test_native_mode_equals_the_reference(llama, tmp_path):
    """WIDE_VLLM_KERNELS=native: the masks multiply the activations over vLLM's own (repacked) GEMMs."""
    _, out, want = llama
    got = run_engine(out, tmp_path, env=engine_env(WIDE_VLLM_KERNELS="native", VLLM_ENABLE_V1_MULTIPROCESSING="0"),
                     enforce_eager=True)
    assert got["tokens"] == want
    assert not got["cpu_paths"], got["cpu_paths"]


def test_tensor_parallel_2(llama, tmp_path):
    """Each rank holds half the heads (one of the two attention groups) and six of the twelve FFN groups,
    and applies its slice of the replicated router's mask."""
    _, out, want = llama
    got = run_engine(out, tmp_path, env=engine_env(2), enforce_eager=True, tensor_parallel_size=2,
                     distributed_executor_backend="mp")
    assert got["tokens"] == want


def test_pipeline_parallel_2(llama, tmp_path):
    """Layer 0 on stage 0, layer 1 on stage 1: the FFN router of stage 1's layer reads the residual stream
    handed over as IntermediateTensors. Compiled: vLLM's CPU runner allocates the pipeline's intermediate
    tensors in its warm-up, which eager mode skips (its own Llama fails the same way)."""
    _, out, want = llama
    got = run_engine(out, tmp_path, env=engine_env(2), pipeline_parallel_size=2,
                     distributed_executor_backend="mp")
    assert got["tokens"] == want


def test_a_world_size_that_splits_a_group_is_refused_at_load(tmp_path):
    from tests.helpers import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "ckpt", num_heads=4, num_kv_heads=2, head_dim=32, hidden_size=128,
                           attn_groups=1, ffn_groups=12, seed=8)  # one group of all 4 heads
    out = export(ckpt, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["wide"]["tensor_parallel_sizes"] == [1]
    text = run_engine(out, tmp_path, env=engine_env(2), enforce_eager=True, tensor_parallel_size=2,
                      distributed_executor_backend="mp", expect_fail=True)
    assert "WIDE: tensor_parallel_size 2 " in text and "layer 0's 1 attention groups" in text
    assert "runs at tensor_parallel_size 1" in text


def test_a_folder_whose_config_and_weights_disagree_is_refused_at_load(llama, tmp_path):
    import shutil

    _, out, _ = llama
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["wide"]["layers"][1]["ffn"]["rank"] = 8  # the folder's tensors have rank 16
    (bad / "config.json").write_text(json.dumps(cfg))
    text = run_engine(bad, tmp_path, enforce_eager=True, expect_fail=True)
    # the first of its two tensors vLLM hands over (the bias or the weight) is refused
    assert any(f"WIDE: model.layers.1.router_ffn.compressor.{leaf} has shape {got} " in text
               and f" implies {want} " in text and "re-create the folder" in text
               for leaf, got, want in (("bias", [16], [8]), ("weight", [16, 128], [8, 128])))

