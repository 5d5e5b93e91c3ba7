"""`wide-export verify --onnx OUT` as a library call: a single-device export through ONNX Runtime
(export/verify_onnx.py), a `wide-export onnx --tp N` folder rank by rank with the all-reduces simulated
(tp/verify.py), both against the PyTorch reference."""

from __future__ import annotations

from pathlib import Path

from wide_export.base.errors import WideError


def verify_onnx(onnx_dir: Path, *, loaded=None, report_path: Path | None = None, stages=None,
                load_kwargs: dict | None = None, sliced: bool | None = None, **settings):
    """The export's VerifyReport; `sliced` (one layer slice at a time) applies to a single-device export."""
    from wide_export.tp.ranks import is_tp_export

    if is_tp_export(onnx_dir):
        from wide_export.tp.verify import verify_tp

        if sliced:
            raise WideError("--sliced verifies a single-device export", "drop --sliced for a --tp export (each "
                            "rank's graph runs whole, stage by stage)")
        return verify_tp(onnx_dir, loaded=loaded, report_path=report_path, stages=stages,
                         load_kwargs=load_kwargs, **settings)
    from wide_export.export.verify_onnx import verify_graph

    return verify_graph(onnx_dir, loaded=loaded, report_path=report_path, stages=stages, load_kwargs=load_kwargs,
                        sliced=sliced, **settings)
