"""Fast CPU generation (wide_export.generation.cpu_generator, model/generate.generate, `wide-export generate`): the
reference model with the compiled kernels, o / down weights stored as W^T, torch's fused attention and a
preallocated KV cache gives the greedy tokens of transformers with the routers hooked on by hand
(tests/model/hf_routing.py, independent of wide_export); the sampler; the command."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.helpers import assert_one_line_error, make_checkpoint
from tests.model.hf_routing import load_routed_hf
from wide_export.cpu import ops as cpu

SPECS = {
    "llama": dict(arch="llama", attention_bias=True, num_heads=8, num_kv_heads=2, hidden_size=128,
                  intermediate_size=192, attn_groups=4, ffn_groups=12, seed=3),
    "qwen3": dict(arch="qwen3", hidden_size=96, num_heads=4, num_kv_heads=2, head_dim=32, attn_groups=2,
                  intermediate_size=192, ffn_groups=12, seed=6),
    "mistral": dict(arch="mistral", sparse_target="attention", hidden_size=128, num_heads=8, num_kv_heads=4,
                    attn_groups=2, seed=4),
}


def _hf_greedy(ckpt, prompts, n: int, routed: bool = True) -> list[list[int]]:
    ref = load_routed_hf(ckpt)
    if not routed:
        ref.remove()
    ref.model.generation_config.eos_token_id = None
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            new = ref.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                     pad_token_id=0)
        out.append(new[0, len(p):].tolist())
    return out


@pytest.mark.parametrize("arch", sorted(SPECS))
def test_fast_generation_gives_the_greedy_tokens_of_transformers_with_routers(tmp_path, arch):
    from wide_export.generation.cpu_generator import CpuGenerator

    ckpt = make_checkpoint(tmp_path / "ck", num_layers=2, **SPECS[arch])
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, 250, (2, 11), generator=gen).tolist()
    want = _hf_greedy(ckpt, prompts, 10)
    assert want != _hf_greedy(ckpt, prompts, 10, routed=False), "the routers change no token here"
    g = CpuGenerator.load(ckpt)
    laid = [n for n, p in g.model.named_parameters() if n.endswith(("o_proj.weight", "down_proj.weight"))
            and p.t().is_contiguous() and not p.is_contiguous()]
    assert laid, "no K-pruned weight was stored as W^T"
    cpu.PATHS.clear()
    got = g.run(prompts, 10, stop_at_eos=False)
    assert got.tokens == want
    assert got.steps == 10 and got.prefill_s > 0 and got.decode_s > 0
    if torch.ops.wide_cpu.isa().split(" ")[0] != "scalar":  # every decode step in one call (cpu/step.py)
        assert cpu.PATHS["step", "fused"] == 9, cpu.PATHS
        cpu.PATHS.clear()  # and op by op, the kernels the step's layers take
        from wide_export.model.methods import CpuKernelsMethod

        assert g.model.use_method(CpuKernelsMethod(fused_step=False)) == 0  # laid out already: left as it is
        assert g.run(prompts, 10, stop_at_eos=False).tokens == want
    assert cpu.PATHS["step", "fused"] == 0
    for kind in ("n", "kt") + (("gated",) if arch != "mistral" else ()):
        assert cpu.PATHS[kind, "masked"] > 0, cpu.PATHS


def test_dense_flag_gives_the_base_models_tokens(tmp_path):
    from wide_export.generation.cpu_generator import CpuGenerator

    ckpt = make_checkpoint(tmp_path / "ck", num_layers=2, **SPECS["llama"])
    prompts = [[5, 9, 17, 33, 65, 129, 7]]
    assert CpuGenerator.load(ckpt, dense=True).run(prompts, 8, stop_at_eos=False).tokens == \
        _hf_greedy(ckpt, prompts, 8, routed=False)


def test_the_static_cache_refuses_more_positions_than_it_holds(tmp_path):
    from wide_export.base.errors import WideError
    from wide_export.model.modeling import StaticKV

    kv = StaticKV(1, 2, 4, 8, torch.float32)
    k = torch.randn(1, 2, 3, 8)
    got_k, _ = kv.append(k, k)
    assert torch.equal(got_k, k) and kv.length == 3
    with pytest.raises(WideError, match="holds 4 positions"):
        kv.append(k, k)


def test_sampling_greedy_top_k_top_p_and_seed():
    from wide_export.generation.torch_step import Sampling

    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]]))
    assert Sampling()(logits).tolist() == [1, 0]
    assert Sampling(temperature=1.0, top_k=1)(logits).tolist() == [1, 0]
    draws = torch.stack([Sampling(temperature=1.0, top_p=0.5, seed=s)(logits) for s in range(50)])
    assert (draws[:, 0] == 1).all() and (draws[:, 1] == 0).all()  # the top token alone reaches 0.5
    draws = torch.stack([Sampling(temperature=1.0, top_p=0.85, seed=s)(logits) for s in range(300)])
    assert set(draws[:, 0].tolist()) == {1, 2}  # 0.6 + 0.3 reach 0.85: token 0 (0.1) is cut
    assert abs(float((draws[:, 0] == 1).float().mean()) - 2 / 3) < 0.1  # renormalised 0.6 / 0.9
    a, b = Sampling(temperature=0.9, seed=7), Sampling(temperature=0.9, seed=7)
    assert [a(logits).tolist() for _ in range(5)] == [b(logits).tolist() for _ in range(5)]


def test_sampling_below_the_greedy_temperature_is_argmax_and_a_tiny_top_p_keeps_the_most_likely():
    """A temperature below 1e-5 is greedy (as vLLM): 1e-45 divides the logits to inf (an error before), and
    5e-6 on two logits 1e-6 apart would draw the second about half the time; a top_p below every probability
    (1e-300: 0 in float32) keeps the most likely token alone. The argmax is torch's, taken here."""
    from wide_export.generation.torch_step import Sampling

    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 8
    logits[3, :2] = torch.tensor([1.0, 1.0 - 1e-6])
    logits[3, 2:] = -5.0
    want = logits.argmax(-1).tolist()
    assert want[3] == 0
    for t in (1e-45, 1e-30, 5e-6):
        for k, p in ((0, 1.0), (5, 0.9)):
            assert [Sampling(temperature=t, top_k=k, top_p=p, seed=s)(logits).tolist() for s in range(30)] == \
                [want] * 30, (t, k, p)
    for p in (1e-300, 1e-45, 1e-9):
        assert [Sampling(temperature=1.0, top_p=p, seed=s)(logits).tolist() for s in range(30)] == [want] * 30, p
    hot = {Sampling(temperature=2e-5, seed=s)(logits)[3].item() for s in range(40)}
    assert hot == {0, 1}  # at and above 1e-5 it samples


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-c", "from wide_export.cli import main; main()", "generate", *args],
                          capture_output=True, text=True, timeout=300, **kw)


def test_generate_command_streams_the_demo_models_text_with_stats():
    done = _cli("--prompt", "hello", "--max-new", "6", "--stats")
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("\n") and len(done.stdout) > 1
    assert "decode" in done.stderr and "tok/s" in done.stderr and "WIDE" in done.stderr


def test_generate_command_ids_on_a_folder_without_tokenizer_equal_the_library(tmp_path):
    from wide_export.generation.cpu_generator import CpuGenerator

    ckpt = make_checkpoint(tmp_path / "ck", num_layers=2, **SPECS["llama"])
    done = _cli("--model", str(ckpt), "--ids", "1,2,3,4", "--max-new", "5")
    assert done.returncode == 0, done.stderr
    want = CpuGenerator.load(ckpt).run([[1, 2, 3, 4]], 5).tokens[0]
    assert [int(t) for t in done.stdout.split()] == want


def test_generate_command_with_a_tiny_temperature_or_top_p_prints_the_greedy_text():
    """--temperature 1e-45 (logits / T overflowed: a traceback before) and --top-p 1e-300 at temperature 1 are
    the greedy answer of --temperature 0."""
    args = ("--ids", "1,15,40,7", "--max-new", "6")
    greedy = _cli(*args, "--temperature", "0")
    assert greedy.returncode == 0, greedy.stderr
    for extra in (("--temperature", "1e-45"), ("--temperature", "1", "--top-p", "1e-300")):
        done = _cli(*args, *extra)
        assert done.returncode == 0 and not done.stderr, done.stderr
        assert done.stdout == greedy.stdout, extra


@pytest.mark.parametrize("args,fragment", [
    ((), "--prompt TEXT or as --ids"),
    (("--prompt", "a", "--ids", "1"), "--prompt TEXT or as --ids"),
    (("--ids", "1,x"), "not a list of token ids"),
    (("--ids", "1", "--max-new", "0"), "--max-new 0"),
    (("--ids", "1", "--top-p", "0"), "--top-p"),
    (("--ids", "1", "--temperature", "nan"), "--temperature"),
    (("--ids", "1", "--dtype", "float64"), "float64"),
    (("--ids", "99999"), "outside the vocabulary"),
])
def test_generate_command_refuses_bad_input_in_one_line(args, fragment):
    line = assert_one_line_error(_cli(*args))
    assert fragment in line


def test_generate_command_needs_ids_where_the_folder_has_no_tokenizer(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ck", num_layers=1)
    assert "--ids" in assert_one_line_error(_cli("--model", str(ckpt), "--prompt", "hi"))
