"""The demo model and other in-memory WIDE models, built from state dicts in the trainer's format.

Here and not in ``wide_export.model`` so that the model package never imports
the checkpoint package (the router state goes through checkpoint.router's checks).
"""

from __future__ import annotations

from typing import Any

from wide_export.model.demo import DEMO_SPEC
from wide_export.model.synthetic import SyntheticSpec


def model_from_states(hf: Any, base_state: dict, router_state: dict, dtype=None):
    """WideForCausalLM from in-memory HF-named base tensors and a router.pth-style state dict."""
    from wide_export.checkpoint.router import routers_from_state
    from wide_export.model.build import build_model
    from wide_export.model.config import WideConfig

    cfg = WideConfig.from_hf(hf)
    routers = routers_from_state(router_state, cfg) if router_state else {}
    return build_model(hf, cfg, base_state.items(), routers, dtype)


def demo_model(spec: SyntheticSpec = DEMO_SPEC, dtype=None):
    """A WideForCausalLM with the demo weights, built in memory (no files); routers stay float32."""
    from wide_export.model.synthetic import random_base_state, random_router_state

    return model_from_states(spec.hf_config(), random_base_state(spec), random_router_state(spec), dtype)
