#!/usr/bin/env python3
"""Mutation testing of the modules a change touched, with mutmut 3 (https://github.com/boxed/mutmut).

    pip install mutmut                      # only this script needs it (not a test dependency)
    python scripts/mutation-test.py                       # modules changed since the merge base with origin/main
    python scripts/mutation-test.py wide_export/base/outdir.py wide_export/generation/decoding.py
    python scripts/mutation-test.py --since HEAD~3 --max-children 2
    python scripts/mutation-test.py --list                # which modules and tests, without running
    python scripts/mutation-test.py --survivors MODULE    # after adding tests: only the last run's survivors again
    python scripts/mutation-test.py --survivors --sample 40 MODULE   # 40 of them, evenly spread (slow tests)

For each module: a scratch copy of the work tree (`.mutation/<module>/`: tracked and unignored files
of wide_export/ and tests/, and pyproject.toml with `[tool.mutmut]` narrowed to this module and its
tests), `mutmut run` there (mutants of this module only; each mutant runs only the selected tests that
reach the mutated function), then a line `module: killed/total (ratio)` and the surviving mutants
(`cd .mutation/<module> && mutmut show NAME` shows one; `mutmut browse` all). The project's own tree
is never modified. Exit status 1 when a module is under --target (default 0.8).

Which tests a module gets: TESTS below (fast, in-process tests; tests that start tritonserver or
subprocesses are left out: they would run unmutated code or take minutes per mutant). A changed module
missing from TESTS is reported and skipped: add it there.

The generated Triton repository's files (generation_model.py, generation/decoding.py, textgen.py, metrics.py) are
imported by the tests from a repository folder under other module names, which mutmut cannot switch;
under mutmut (MUTANT_UNDER_TEST set) tests/triton/support.py loads the package's generation_model
instead of the repository's model.py (the same text) and makes it take its siblings from the package,
so their mutants are the ones exercised.

Equivalent mutants (no test can tell them from the original) are listed with a one-line reason in
scripts/mutation-equivalent.json and not counted; one listed there but killed is reported as stale.
Mutants whose tests crashed (segfault, abort) count as killed; with --sample the ones not run are
reported as "not checked" and not counted. mutmut 3 does not mutate decorated functions (pydantic
validators, properties), so those are pinned by tests but never appear here.

Tests that need an export share one, made once under .mutation/export-cache ($WIDE_TEST_EXPORT_CACHE,
tests/verify/conftest.py), instead of exporting again for every mutant.

Budget: about 15 minutes for the modules of one change on 2 cores (--max-children 2).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / ".mutation"

# tests/triton/test_triton_repository.py less test_tensorrt_repository_from_a_real_engine: that one exports the
# demo model (a subprocess) and builds a TensorRT-RTX engine, about 30 s in every mutant's run here
_REPOSITORY_WITHOUT_A_REAL_ENGINE = [f"tests/triton/test_triton_repository.py::{name}" for name in (
    "test_onnxruntime_repository_layout_and_config", "test_template_keys_are_strict",
    "test_errors_leave_nothing_behind", "test_tensorrt_repository_matches_the_manifest",
    "test_tensorrt_manifest_errors", "test_tensorrt_rtx_engines_are_warned_about_before_writing",
    "test_engines_with_the_onnxruntime_backend_get_a_hint")]

# module -> the tests that pin it down (fast, in-process)
TESTS: dict[str, list[str]] = {
    "wide_export/generation/decoding.py": ["tests/triton/test_triton_inflight_batch.py",
                                "tests/triton/test_triton_serving_limits.py",
                                "tests/triton/test_triton_inflight_units.py", "tests/model/test_decode_loop.py",
                                "tests/verify/test_reference_steps.py"],
    "wide_export/generation/textgen.py": ["tests/triton/test_triton_textgen.py",
                                      "tests/triton/test_triton_textgen_edges.py"],
    "wide_export/tritonserver/metrics.py": ["tests/triton/test_triton_metrics.py",
                                      "tests/triton/test_triton_metrics_contract.py"],
    # model.py's siblings split off from it: the same tests reach them through model.py's names
    "wide_export/generation/settings.py": ["tests/triton/test_generation_model_units.py",
                                       "tests/triton/test_triton_generation.py", "tests/triton/test_triton_bls.py",
                                       "tests/triton/test_triton_bls_device.py", "tests/frontend/test_models.py",
                                       "tests/frontend/test_repository.py"],
    "wide_export/generation/rows.py": ["tests/triton/test_generation_model_units.py",
                                   "tests/triton/test_triton_generation.py",
                                   "tests/triton/test_triton_serving_limits.py"],
    "wide_export/generation/ortstep.py": ["tests/triton/test_generation_model_units.py",
                                      "tests/triton/test_triton_generation.py",
                                      "tests/triton/test_triton_iobinding.py"],
    "wide_export/tritonserver/generation_model.py": ["tests/triton/test_triton_generation.py",
                                               "tests/triton/test_generation_model_units.py",
                                               "tests/triton/test_triton_serving_limits.py",
                                               "tests/triton/test_triton_bls.py",
                                               "tests/triton/test_triton_bls_device.py",
                                               "tests/triton/test_triton_iobinding.py"],
    "wide_export/base/outdir.py": ["tests/test_outdir.py", "tests/faults/test_interrupt_publish.py",
                              "tests/cli/test_interrupt_races.py",
                              "tests/faults/test_outputs.py::test_two_writers_of_one_output_exactly_one_publishes",
                              "tests/faults/test_outputs.py::test_force_over_an_output_that_cannot_be_removed",
                              "tests/faults/test_outputs.py::test_force_when_the_old_output_cannot_be_moved_at_publish"],
    "wide_export/base/signals.py": ["tests/faults/test_interrupt_publish.py", "tests/cli/test_interrupt_races.py"],
    "wide_export/export/genai_config.py": ["tests/export/test_genai_special_tokens.py",
                                           "tests/export/test_genai_config_contract.py"],
    "wide_export/export/gguf.py": ["tests/export/test_gguf.py"],
    "wide_export/verify/tolerances.py": ["tests/verify/test_tolerances.py", "tests/verify/test_compare.py"],
    "wide_export/verify/compare.py": ["tests/verify/test_compare.py", "tests/verify/test_compare_report.py"],
    "wide_export/verify/slices.py": ["tests/verify/test_slices_units.py"],
    "wide_export/verify/evaluator.py": ["tests/verify/test_evaluator.py"],
    "wide_export/verify/reference.py": ["tests/verify/test_reference_steps.py"],
    "wide_export/export/verify_onnx.py": ["tests/verify/test_onnx_verify_units.py", "tests/verify/test_verify_run.py"],
    "wide_export/verify/common.py": ["tests/verify/test_onnx_verify_units.py", "tests/verify/test_verify_run.py"],
    "wide_export/export/session.py": ["tests/verify/test_onnx_verify_units.py"],
    "wide_export/base/childproc.py": ["tests/test_childproc.py"],
    "wide_export/cpu/step.py": ["tests/cpu/test_decode_step.py"],
    # the engine runs of trt/verify.py need TensorRT and a GPU: only its manifest reader and its share of the
    # verification units run here; tp/ranks.py's rank processes run in tests/tp/test_tp_run.py (subprocesses)
    "wide_export/trt/verify.py": ["tests/faults/test_hostile_manifests.py",
                                       "tests/verify/test_onnx_verify_units.py"],
    # test_sharded_verify runs the simulated world of a cached sharded export (SimulatedWorld) in-process;
    # test_tp_run's rank processes only reach read_manifest here, which test_hostile_manifests pins in seconds
    "wide_export/tp/ranks.py": ["tests/faults/test_hostile_manifests.py", "tests/verify/test_sharded_verify.py"],
    # test_sharded_verify verifies one cached two-rank export (seconds a mutant); test_tp_export exports per test
    "wide_export/tp/verify.py": ["tests/verify/test_onnx_verify_units.py",
                                      "tests/verify/test_sharded_verify.py"],
    "wide_export/tritonserver/contract.py": ["tests/triton/test_contract.py", "tests/frontend/test_engine_units.py"],
    "wide_export/checkpoint/options.py": ["tests/test_python_api.py::test_sources_load_what_the_loader_loads_from_the_same_options",
                                          "tests/test_python_api.py::test_sources_pass_every_option_to_the_loader"],
    # the OpenAI front end: in-process on tests/frontend/fakes.py's engine (TestClient, or uvicorn
    # in a thread of the test process); test_serve_cli.py and test_openai_e2e.py run subprocesses / tritonserver
    "wide_export/serving/openai/protocol.py": ["tests/frontend/test_app.py", "tests/frontend/test_protocol.py"],
    "wide_export/serving/openai/errors.py": ["tests/frontend/test_app.py", "tests/frontend/test_errors.py"],
    "wide_export/serving/openai/sse.py": ["tests/frontend/test_app.py", "tests/frontend/test_sse.py"],
    "wide_export/serving/openai/chat.py": ["tests/frontend/test_chat.py", "tests/frontend/test_repository.py"],
    "wide_export/serving/openai/models.py": ["tests/frontend/test_repository.py", "tests/frontend/test_models.py"],
    "wide_export/serving/triton_engine.py": ["tests/frontend/test_engine.py", "tests/frontend/test_engine_units.py"],
    "wide_export/serving/openai/app.py": ["tests/frontend/test_app.py", "tests/frontend/test_app_shapes.py"],
    "wide_export/serving/openai/runner.py": ["tests/frontend/test_openai_client.py", "tests/frontend/test_runner.py"],
    # the rest of triton/: repository generation in-process on tests/triton/tiny_llm.py's model
    "wide_export/tritonserver/ports.py": ["tests/triton/test_triton_units.py", "tests/triton/test_serve_ports.py"],
    "wide_export/tritonserver/templates.py": ["tests/triton/test_triton_units.py", "tests/triton/test_triton_repository.py"],
    "wide_export/tritonserver/textfiles.py": ["tests/triton/test_triton_units.py", "tests/triton/test_triton_repository.py"],
    # test_triton_cli.py's other tests start tritonserver or `wide-export serve`, and the real-engine test
    # exports the demo and builds a TensorRT engine in a child process: minutes per surviving mutant
    "wide_export/tritonserver/repository.py": [
        "tests/triton/test_triton_repository.py::test_onnxruntime_repository_layout_and_config",
        "tests/triton/test_triton_repository.py::test_template_keys_are_strict",
        "tests/triton/test_triton_repository.py::test_errors_leave_nothing_behind",
        "tests/triton/test_triton_repository.py::test_tensorrt_repository_matches_the_manifest",
        "tests/triton/test_triton_repository.py::test_tensorrt_manifest_errors",
        "tests/triton/test_triton_repository.py::test_tensorrt_rtx_engines_are_warned_about_before_writing",
        "tests/triton/test_triton_repository.py::test_engines_with_the_onnxruntime_backend_get_a_hint",
        "tests/triton/test_triton_repository_contents.py",
        "tests/triton/test_triton_cli.py::test_triton_command_writes_a_repository_and_refuses_to_overwrite",
        "tests/triton/test_triton_cli.py::test_repository_is_created_with_normal_permissions"],
    "wide_export/tritonserver/export_folder.py": ["tests/triton/test_triton_units.py", "tests/triton/test_triton_sources.py",
                                      *_REPOSITORY_WITHOUT_A_REAL_ENGINE],
    "wide_export/tritonserver/trt_engines.py": ["tests/triton/test_triton_engines.py", *_REPOSITORY_WITHOUT_A_REAL_ENGINE],
    # server.py, supervise.py, client.py: on fakes (a fake process, clock and tritonclient, a loopback
    # http.server); the tests that start a real tritonserver (test_triton_cli.py, test_serve_ports.py,
    # test_triton_server.py) take minutes per mutant and are left to CI
    "wide_export/tritonserver/server.py": ["tests/triton/test_server_units.py"],
    "wide_export/tritonserver/supervise.py": ["tests/triton/test_supervise_units.py"],
    "wide_export/tritonserver/client.py": ["tests/triton/test_client_units.py"],
    # the kernels' auto policy: table validation, choice, the measured policy's record
    "wide_export/kernels/policy.py": ["tests/kernels/test_policy.py"],
}

# a mutant whose tests crashed (SIGSEGV, SIGKILL: "segfault"; SIGABRT and other signals: "suspicious") was told
# apart from the original too: counted as killed, and said so
KILLED = {"killed", "caught by type check", "segfault", "suspicious"}
ALSO_COPIED = {"README.md"}  # tests/verify/test_tolerances.py reads its tolerance table
# equivalent mutants (no test can tell them from the original), each with its reason: not counted
EQUIVALENT_FILE = ROOT / "scripts" / "mutation-equivalent.json"


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def changed_modules(since: str | None) -> list[str]:
    if since is None:
        for ref in ("origin/main", "main"):
            try:
                since = git("merge-base", "HEAD", ref).strip()
                break
            except subprocess.CalledProcessError:
                continue
    if since is None:
        sys.exit("no origin/main or main to compare with: pass --since REF or the modules")
    names = set(git("diff", "--name-only", since).split()) | set(git("ls-files", "-o", "--exclude-standard").split())
    return sorted(n for n in names if n.startswith("wide_export/") and n.endswith(".py") and (ROOT / n).is_file())


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"[tool.mutmut] value {value!r}")


def scratch_copy(module: str, tests: list[str], keep: bool = False) -> Path:
    """A copy of the work tree for mutating `module`, its pyproject's [tool.mutmut] narrowed to it.

    keep=True (--survivors) refreshes the files of the last run's copy and keeps mutmut's results there."""
    where = SCRATCH / module.removesuffix(".py").replace("/", ".")
    if not keep:
        shutil.rmtree(where, ignore_errors=True)
    files = [f for f in git("ls-files", "-co", "--exclude-standard").splitlines()
             if (f.startswith(("wide_export/", "tests/")) or f in ALSO_COPIED) and (ROOT / f).is_file()]
    for f in files:
        (where / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, where / f)
    (where / "pyproject.toml").write_text(_narrowed_pyproject(module, tests))
    return where


def _narrowed_pyproject(module: str, tests: list[str]) -> str:
    """The project's pyproject.toml with [tool.mutmut] narrowed to `module` and its tests."""
    text = (ROOT / "pyproject.toml").read_text()
    shared = tomllib.loads(text).get("tool", {}).get("mutmut", {})
    text = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", "", text)
    settings = {**shared, "source_paths": ["wide_export"], "only_mutate": [module],
                "pytest_add_cli_args_test_selection": tests,
                "also_copy": sorted({*shared.get("also_copy", []), *ALSO_COPIED})}  # into mutmut's mutants/
    return text + "\n[tool.mutmut]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in settings.items())


def equivalents() -> dict[str, str]:
    """mutant name -> why it is equivalent (scripts/mutation-equivalent.json), not counted."""
    if not EQUIVALENT_FILE.is_file():
        return {}
    data = json.loads(EQUIVALENT_FILE.read_text())
    return {name: why for per_module in data.values() for name, why in per_module.items()}


def results(where: Path, module: str) -> dict[str, str]:
    """mutant name -> status, for this module's mutants."""
    out = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=where,
                         capture_output=True, text=True).stdout
    prefix = module.removesuffix(".py").replace("/", ".") + "."
    found = {}
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name.startswith(prefix):
            found[name] = status.strip()
    return found


def run_module(module: str, tests: list[str], max_children: int, survivors_only: bool = False,
               sample: int = 0) -> tuple[int, int, dict]:
    where = SCRATCH / module.removesuffix(".py").replace("/", ".")
    again = []
    if survivors_only:
        known = equivalents()
        again = [n for n, s in results(where, module).items() if not (s in KILLED or s == "timeout")
                 and n not in known] if (where / "mutants").is_dir() else []
        if sample and len(again) > sample:  # an even spread over the module's functions
            again = [again[round(i * (len(again) - 1) / (sample - 1))] for i in range(sample)] if sample > 1 \
                else again[:1]
        if not again:
            print(f"{module}: no survivors of an earlier run in {where}: running all mutants")
    if again and (where / "pyproject.toml").read_text() != _narrowed_pyproject(module, tests):
        # other tests or settings: mutmut drops all its results then, so every mutant must run again
        print(f"{module}: tests or settings changed since the last run: running all mutants")
        again = []
    where = scratch_copy(module, tests, keep=bool(again))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MUTANT_UNDER_TEST")}
    # tests that need an export make it once there and reuse it (tests/verify/test_verify_run.py)
    env["WIDE_TEST_EXPORT_CACHE"] = str(SCRATCH / "export-cache")
    (SCRATCH / "export-cache").mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    for attempt in (1, 2):  # once more when the first stats run failed (a test that failed once under load)
        # SIGINT at its default, as under a terminal: started in the background (`&`, nohup) it is
        # inherited as ignored, and the tests of Ctrl-C handling would fail unmutated
        proc = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *again],
                              cwd=where, env=env, capture_output=True, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        (where / "mutmut-run.log").write_text(proc.stdout + proc.stderr)
        found = results(where, module)
        if "failed to collect stats" not in proc.stdout + proc.stderr:
            break
        print(f"{module}: mutmut's stats run failed (a test failed unmutated); trying again")
    if proc.returncode != 0 and not found:
        print(f"{module}: mutmut failed (exit {proc.returncode}); log: {where / 'mutmut-run.log'}")
        print("\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:]))
        return 0, 0, {}
    known = equivalents()
    equivalent = {n: known[n] for n in found if n in known}
    unchecked = {n for n, s in found.items() if s == "not checked" and n not in equivalent}
    counted = {n: s for n, s in found.items() if n not in equivalent and n not in unchecked}
    killed = sum(s in KILLED or s == "timeout" for s in counted.values())  # a timeout: the mutant hung a test
    survivors = {n: s for n, s in counted.items() if not (s in KILLED or s == "timeout")}
    timeouts = sum(s == "timeout" for s in counted.values())
    crashes = sum(s in ("segfault", "suspicious") for s in counted.values())
    rerun = f", {len(again)} survivors of the last run tried again" if again else ""
    if unchecked:  # --survivors --sample: the rest was not run
        rerun += f", {len(unchecked)} not checked (not counted)"
    print(f"{module}: {killed}/{len(counted)} killed ({killed / max(len(counted), 1):.0%}; {timeouts} of them by "
          f"a timeout, {crashes} by a crash; {len(equivalent)} equivalent not counted{rerun}) in "
          f"{time.monotonic() - began:.0f} s")
    for name, status in sorted(survivors.items()):
        print(f"    {status:12} {name}")
    stale = [n for n in equivalent if found[n] in KILLED]
    for name in stale:  # listed as equivalent but a test kills it: the list is out of date
        print(f"    note: {name} is listed in {EQUIVALENT_FILE.name} but was killed")
    return killed, len(counted), survivors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("modules", nargs="*", help="files to mutate (default: changed since --since)")
    ap.add_argument("--since", help="git ref to diff against (default: merge-base HEAD origin/main)")
    ap.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--target", type=float, default=0.8, help="kill ratio each module must reach")
    ap.add_argument("--list", action="store_true", help="print modules and tests only")
    ap.add_argument("--sample", type=int, default=0,
                    help="with --survivors: try only this many of them (evenly spread); the rest stay not checked")
    ap.add_argument("--survivors", action="store_true",
                    help="only try again the survivors of the last run (tests added since), keeping the other results")
    args = ap.parse_args()
    try:
        import mutmut  # noqa: F401
    except ImportError:
        sys.exit("mutmut is not installed: pip install mutmut")
    modules = [str(Path(m).resolve().relative_to(ROOT)) for m in args.modules] or changed_modules(args.since)
    plan = []
    for module in modules:
        tests = [t for t in TESTS.get(module, []) if (ROOT / t.split("::")[0]).is_file()]
        if not tests:
            print(f"{module}: no tests mapped in scripts/mutation-test.py TESTS: skipped")
            continue
        plan.append((module, tests))
    if args.list or not plan:
        for module, tests in plan:
            print(f"{module}: {' '.join(tests)}")
        return 0
    below = []
    for module, tests in plan:
        killed, total, _ = run_module(module, tests, args.max_children, args.survivors, args.sample)
        if total == 0 or killed / total < args.target:
            below.append(module)
    if below:
        print(f"under {args.target:.0%} killed: {' '.join(below)}")
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
