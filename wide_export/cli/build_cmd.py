"""`wide-export build`: compile plugins/ (CUDA kernels + TensorRT plugins) with CMake."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wide_export.cli.common import user_errors

DirOpt = lambda flag, text: typer.Option(flag, help=text, show_default=False)  # noqa: E731


@user_errors
def build(
    build_dir: Annotated[Optional[Path], DirOpt("--build-dir", "Build folder (default: <repo>/build/native).")] = None,
    cuda_arch: Annotated[Optional[str], DirOpt("--cuda-arch", "CUDA architectures, e.g. '80;90' or 90 "
                                               "(default: 80;86;89;90).")] = None,
    tensorrt_root: Annotated[Optional[Path], DirOpt("--tensorrt-root", "TensorRT install prefix "
                                                    "(include/ and lib/).")] = None,
    tensorrt_include_dir: Annotated[Optional[Path], DirOpt("--tensorrt-include-dir",
                                                           "Folder holding NvInfer.h.")] = None,
    tensorrt_lib_dir: Annotated[Optional[Path], DirOpt("--tensorrt-lib-dir", "Folder holding libnvinfer.")] = None,
    jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", min=1, help="Parallel compile jobs "
                                                "(default: all cores).", show_default=False)] = None,
) -> None:
    """Build the CUDA kernel library and the TensorRT plugin library in one go.

    Shows its progress (configure, the Triton AOT compile count, nvcc, link; one line per stage when
    piped); the full output goes to build.log in the build folder. Ctrl-C or SIGTERM stops CMake and every
    compiler it started; a build folder this run created is removed. Triton caches compiled kernels in
    ~/.triton/cache ($TRITON_CACHE_DIR): a rebuild for the same architectures takes seconds, not minutes.
    """
    from rich.console import Console

    from wide_export.native.build import build_native
    from wide_export.base.progress import Steps

    console = Console(highlight=False, soft_wrap=True)  # whole paths, also when piped
    with Steps("build", console=Console(stderr=True, highlight=False)) as steps:
        result = build_native(
            build_dir=build_dir, cuda_archs=cuda_arch, tensorrt_root=tensorrt_root,
            tensorrt_include_dir=tensorrt_include_dir, tensorrt_lib_dir=tensorrt_lib_dir, jobs=jobs,
            on_progress=steps.update,
        )
    console.print(f"[green]built[/] into {result.build_dir}")
    for lib in result.libraries:
        console.print(f"  {lib}")
    if result.trt_note:
        console.print(f"[yellow]note:[/] {result.trt_note}")


def register(app: typer.Typer) -> None:
    app.command("build", no_args_is_help=False)(build)
