"""model.config.rank_groups: the one rule by which a tensor-parallel rank slices a router's mask (the PyTorch
decoder's tp hook and the vLLM plugin both use it), by hand."""

from wide_export.model.config import rank_groups


def test_contiguous_whole_groups_per_rank_by_hand():
    assert [rank_groups(8, 2, r) for r in range(2)] == [(0, 4), (4, 8)]
    assert [rank_groups(64, 4, r) for r in range(4)] == [(0, 16), (16, 32), (32, 48), (48, 64)]
    assert rank_groups(8, 1, 0) == (0, 8) and rank_groups(None, 2, 1) is None
    for groups, tp in ((8, 8), (112, 2), (128, 8)):
        parts = [rank_groups(groups, tp, r) for r in range(tp)]
        assert parts[0][0] == 0 and parts[-1][1] == groups
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))  # no gap, no overlap
