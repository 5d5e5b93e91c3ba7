"""Helpers shared by the Triton tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def load_generation_module(version_dir: Path):
    """Import a generated `<model>/1/model.py` as a module (outside Triton)."""
    name = f"wide_generation_{abs(hash(str(version_dir)))}"
    spec = importlib.util.spec_from_file_location(name, version_dir / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def serve_until_teardown(repo: Path):
    """Fixture body: a real tritonserver on 127.0.0.1 serving `repo`; at teardown it must stop cleanly."""
    from wide_export.triton import TritonServer

    server = TritonServer(repo)
    server.start(timeout=120)
    yield server
    code = server.stop()
    print(server.log_tail(10))
    assert code == 0, f"tritonserver did not stop cleanly (code {code})"


def run_concurrently(targets: list, timeout_s: float) -> None:
    """Run each callable in its own thread; fail on a hung thread or on the first error raised in one."""
    import threading

    errors: list[BaseException] = []

    def guard(fn):
        try:
            fn()
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=guard, args=(fn,), daemon=True) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    assert not any(t.is_alive() for t in threads), "a client thread hung"
    assert not errors, errors[0]
