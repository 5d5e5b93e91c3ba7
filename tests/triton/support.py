"""Helpers shared by the Triton tests."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path


def load_generation_module(version_dir: Path):
    """Import a generated `<model>/1/model.py` as a module (outside Triton).

    Under mutmut (scripts/mutation-test.py) the package's module itself: model.py is a copy of its
    (mutated) text, but mutmut switches a mutant on by the module's name, which a copy loaded under
    another name does not have; every function of the module takes the version folder as an argument."""
    if "MUTANT_UNDER_TEST" in os.environ:
        module = importlib.import_module("wide_export.tritonserver.generation_model")
        assert (version_dir / "model.py").read_text() == Path(module.__file__).read_text(), \
            f"{version_dir / 'model.py'} is not the package's generation_model.py"
        _siblings_from_the_package(module)
        return module
    name = f"wide_generation_{abs(hash(str(version_dir)))}"
    spec = importlib.util.spec_from_file_location(name, version_dir / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def _siblings_from_the_package(module) -> None:
    """mutmut switches a mutant on by its module's name (wide_export.generation.decoding); the copies a
    repository's model.py loads from its own folder have other names, so their mutants would never be
    on. Under mutmut the loaded model.py takes its siblings (decoding, textgen, metrics, ...) from the
    package (the mutated copy mutmut imports), the rest of the test as it is."""
    import importlib

    from wide_export.tritonserver import repository

    if not hasattr(module, "file_load_sibling"):  # the package's module is loaded again for every repository
        module.file_load_sibling = module.load_sibling  # the original, for the test of load_sibling itself
    home = {name[:-3]: package for package, names in repository.SIBLINGS.items() for name in names}
    module.load_sibling = lambda name: importlib.import_module(f"{home[name]}.{name}")


def drive_staggered(batch, rows: dict, plan: list, ticks: int):
    """Run an in-flight `Batch` (the generated generation/decoding.py) tick by tick: the rows whose plan entry
    (tick it arrives at, ...) is this tick are prefilled together and join, otherwise the batch decodes
    one step; finished rows leave. Returns (tokens per row index, the batch width at each tick that had
    rows, how many arrivals found rows already decoding)."""
    import numpy as np

    owner: dict[int, int] = {}
    done, widths, joined_running = {}, [], 0
    for t in range(ticks):
        arriving = [i for i, (at, *_) in enumerate(plan) if at == t]
        if arriving:
            joined_running += bool(batch.rows)
            for i, active in zip(arriving, batch.prefill([rows[i] for i in arriving])):
                owner[id(active)] = i
        if batch.rows:
            widths.append(batch.width)
            if not arriving:
                batch.decode()
        finished = [a for a in batch.rows if a.remaining <= 0]
        for a in finished:
            done[owner[id(a)]] = np.array(a.tokens[:a.row.max_new_tokens])
        batch.leave(finished)
        if len(done) == len(plan):
            break
    return done, widths, joined_running


def serve_until_teardown(repo: Path):
    """Fixture body: a real tritonserver on 127.0.0.1 serving `repo`; at teardown it must stop cleanly."""
    from wide_export.tritonserver import TritonServer

    server = TritonServer(repo, refuse="shared-memory,logging,trace")  # tests count requests in its statistics
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


def model_statistics(server, model: str = "wide_llm") -> dict:
    """The model's entry of Triton's inference statistics (inference_count, execution_count, ...)."""
    import tritonclient.http as http

    client = http.InferenceServerClient(server.endpoints.http)
    try:
        return client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()


def requests_done(server, model: str = "wide_llm") -> int:
    """How many requests of the model Triton has released (inference_count): a streamed request counts
    once its final response went out, whether it ran to its end or the model closed it early for a
    client that left."""
    return int(model_statistics(server, model)["inference_count"])


def wait_until(condition, timeout_s: float) -> bool:
    """Poll `condition` until it holds (True) or `timeout_s` passed (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
