"""bench vllm's explicit KV cache on CPU (both engines the same bytes), computed by hand."""

from types import SimpleNamespace

from wide_export.bench.vllm import kv_cache_bytes


def test_kv_cache_bytes_hold_every_sequence_in_whole_blocks():
    cfg = SimpleNamespace(num_layers=6, num_key_value_heads=4, head_dim=128)  # the llama-0.4b preset's
    # k and v, 6 layers, 4 KV heads of 128, float32: 24576 bytes a token; 160 tokens -> 2 blocks of 128, + 1
    assert kv_cache_bytes(cfg, 4, 16, 160) == 16 * 3 * 128 * 24576
    assert kv_cache_bytes(cfg, 2, 1, 128) == 2 * 128 * 12288
