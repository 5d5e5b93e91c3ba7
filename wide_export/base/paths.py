"""Files read from a user's folder stay inside it; JSON files are parsed within size and depth limits.

A model folder, export folder or engine folder names other files (safetensors shards in an index,
external-data `location`s in model.onnx, `files.*` in wide_config.json, engines and plugins in
wide_engine.json) and may hold symlinks. Every such file must resolve -- after symlinks and `..` --
inside its folder, so that a crafted folder cannot make us read, copy or link a file elsewhere
(`ln -s /etc/shadow special_tokens_map.json`, `location: ../../etc/shadow`).

One exception, by design of the Hugging Face cache: a snapshot folder
`.../models--ORG--NAME/snapshots/<rev>/` holds symlinks to `../../blobs/<hash>`, so for a folder
inside `snapshots/` the `blobs/` folder beside `snapshots/` counts as inside too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from wide_export.base.errors import WideError

# JSON files we parse (configs, manifests, indexes) are a few KB; 64 MiB leaves room for anything
# legitimate (a sharded index lists every tensor) while keeping a hostile file from filling memory.
JSON_MAX_BYTES = int(os.environ.get("WIDE_JSON_MAX_BYTES", 64 << 20))
# Our JSON files nest a few levels; Python's parser gives up (RecursionError) near 1000.
JSON_MAX_DEPTH = 64


def _resolve(path: Path) -> Path:
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError, ValueError) as err:  # a loop (RuntimeError before 3.13), a NUL byte
        raise WideError(f"cannot resolve {path}: {err}", "replace the broken or looping symlink") from None


def allowed_roots(folder: Path) -> list[Path]:
    """The folder itself and, for a Hugging Face cache snapshot, the cache's blob store."""
    root = _resolve(folder)
    roots = [root]
    for parent in root.parents:
        if parent.name == "snapshots" and parent.parent.name.startswith("models--"):
            roots.append(parent.parent / "blobs")
            break
    return roots


def confined(path: Path | str, folder: Path, what: str) -> Path:
    """`path` (a file of `folder`, joined to it by the caller: `folder / name`) resolved, symlinks
    followed; a WideError naming it when that lies outside `folder` (or its Hugging Face blob store).
    An absolute or `..` name a folder holds (an external-data location) ends up outside and is refused
    the same way. The file need not exist."""
    given = Path(path)
    target = _resolve(given)
    if not any(target.is_relative_to(root) for root in allowed_roots(folder)):
        where = f"{given} is" if target == given else f"{given} resolves to {target},"
        raise WideError(f"{what} {where} outside {folder}",
                        f"files named by the folder must lie inside it: copy the file into {folder} "
                        "instead of linking or pointing to it")
    return target


def read_json(path: Path, what: str | None = None, hint: str = "the file is damaged; replace it",
              max_bytes: int | None = None) -> Any:
    """json.loads of a file after checking its size, with one-line errors for bad, huge or deep JSON."""
    path = Path(path)
    what = what or str(path)
    limit = JSON_MAX_BYTES if max_bytes is None else max_bytes
    try:
        size = path.stat().st_size
        if size > limit:
            raise WideError(f"{what} is {size} bytes, more than the {limit} a JSON file here may hold", hint)
        text = path.read_bytes()
    except OSError as err:
        raise WideError(f"cannot read {what}: {err.strerror or err}", hint) from None
    return parse_json(text, what, hint)


def parse_json(text: bytes | str, what: str, hint: str = "the file is damaged; replace it") -> Any:
    """json.loads of `text` with one-line errors, refusing nesting deeper than JSON_MAX_DEPTH."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise WideError(f"{what} is not usable JSON: nested too deep", hint) from None
    except (ValueError, UnicodeDecodeError) as err:
        raise WideError(f"{what} is not valid JSON: {err}", hint) from None
    check_depth(value, what, hint)
    return value


def check_depth(value: Any, what: str, hint: str) -> None:
    """Refuse JSON nested deeper than JSON_MAX_DEPTH (walked without recursion)."""
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if depth > JSON_MAX_DEPTH:
            raise WideError(f"{what} is not usable JSON: nested deeper than {JSON_MAX_DEPTH} levels", hint)
        if isinstance(item, dict):
            todo.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            todo.extend((v, depth + 1) for v in item)


# ---------------------------------------------------------------- ONNX graphs and their external data
def load_graph(onnx_file: Path):
    """model.onnx without its external data (nothing but the graph file is opened)."""
    import onnx

    try:
        return onnx.load(str(onnx_file), load_external_data=False)
    except Exception as err:  # onnx raises DecodeError and friends
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise WideError(f"{onnx_file} is not a readable ONNX model: {first}",
                        hint="the file is damaged or truncated; re-export the model with `wide-export onnx`") from None


def external_data_files(model, onnx_file: Path) -> tuple[Path, ...]:
    """The files model.onnx keeps its weights in, each checked -- before anything opens or links it -- to
    lie inside the graph's folder (an absolute or `..` location, or a symlink out, is refused) and to exist."""
    from onnx.external_data_helper import uses_external_data

    folder = onnx_file.parent
    names = set()
    for tensor in _all_initializers(model):
        if not uses_external_data(tensor) and not tensor.external_data:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), None)
        if not location:
            raise WideError(f"{onnx_file}: tensor {tensor.name!r} keeps its data externally but names no file",
                            hint="the file is damaged; re-export the model with `wide-export onnx`")
        names.add(location)
    files = []
    for name in sorted(names):
        confined(folder / name, folder, f"external data of {onnx_file.name}:")
        if not (folder / name).is_file():
            raise WideError(f"{onnx_file} refers to external data {name}, which is missing",
                            hint="copy the whole folder written by `wide-export onnx`")
        files.append(folder / name)
    return tuple(files)


def _all_initializers(model):
    """Every tensor of the model: initializers and tensor attributes, in subgraphs and functions too."""
    graphs, nodes = [model.graph], [n for f in model.functions for n in f.node]
    while graphs or nodes:
        if graphs:
            graph = graphs.pop()
            yield from graph.initializer
            for sparse in graph.sparse_initializer:
                yield from (sparse.values, sparse.indices)
            nodes.extend(graph.node)
            continue
        for attr in nodes.pop().attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                graphs.append(attr.g)
            graphs.extend(attr.graphs)


# ---------------------------------------------------------------------------------------------------------
# Copies that cannot race: the file is opened once, the open file is checked, and the copy reads that file.
# Checking a path and then copying it by path lets a swap in between (the name turned into a symlink to a
# private file elsewhere) copy the other file.
def _opened_path(fd: int) -> Path | None:
    """What an open descriptor is, as the kernel names it (Linux /proc); None where there is no /proc."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return None


def open_confined(path: Path | str, folder: Path, what: str) -> tuple[int, os.stat_result]:
    """(descriptor, its fstat) of `folder`'s file `path`, opened once and checked open: a regular file, owned by
    us or by the folder's owner, that the kernel says lies inside `folder` (or its Hugging Face blob store).
    The last component is opened with O_NOFOLLOW (a name swapped for a symlink fails), O_NONBLOCK (a FIFO
    swapped in cannot hang the open). The caller closes the descriptor."""
    import stat

    target = confined(path, folder, what)  # symlinks inside the folder (a Hugging Face snapshot) followed here
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target, flags)
    except OSError as err:
        raise WideError(f"cannot open {what} {path}: {err.strerror or err}",
                        "the file changed while it was read, or is not a plain file: check the folder") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise WideError(f"{what} {path} is not a regular file", "replace it with the file itself")
        opened = _opened_path(fd)
        if opened is not None and not any(opened.is_relative_to(root) for root in allowed_roots(folder)):
            raise WideError(f"{what} {path} changed while it was opened: it is now {opened}, outside {folder}",
                            "something is changing the folder; copy it somewhere only you can write")
        owners = {os.geteuid()}
        try:
            owners.add(os.stat(folder).st_uid)
        except OSError:
            pass
        if info.st_uid not in owners:
            raise WideError(f"{what} {path} belongs to another user (uid {info.st_uid})",
                            "copy the file into the folder as yourself")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def read_confined(path: Path | str, folder: Path, what: str, max_bytes: int | None = None,
                  hint: str = "the file is damaged; replace it") -> bytes:
    """The bytes of `folder`'s file `path`, read from one checked descriptor (open_confined) and refused
    before reading when larger than `max_bytes` (JSON_MAX_BYTES by default), also when it grows meanwhile."""
    limit = JSON_MAX_BYTES if max_bytes is None else max_bytes
    fd, info = open_confined(path, folder, what)
    try:
        if info.st_size > limit:
            raise WideError(f"{what} {path} is {info.st_size} bytes, more than the {limit} it may hold here", hint)
        with open(fd, "rb", closefd=False) as source:
            data = source.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise WideError(f"{what} {path} grew past {limit} bytes while it was read", hint)
    return data


def copy_confined(path: Path | str, dst: Path, folder: Path, what: str) -> None:
    """Copy `folder`'s file `path` to the new file `dst` from one descriptor (open_confined): the bytes
    copied are those of the file that was checked. `dst` keeps the source's permission bits (a 0600 file
    stays 0600) and times, and must not exist (O_EXCL, O_NOFOLLOW)."""
    fd, info = open_confined(path, folder, what)
    try:
        copy_from(fd, info, dst)
    finally:
        os.close(fd)


def copy_from(fd: int, info: os.stat_result, dst: Path) -> None:
    """Write the open file `fd` (fstat `info`) to the new file `dst`, with its permission bits and times."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        out = os.open(dst, flags, info.st_mode & 0o777)
    except OSError as err:
        raise WideError(f"cannot create {dst}: {err.strerror or err}", "the output folder changed under us; "
                        "run the command again") from None
    with open(out, "wb") as sink:  # a buffered file: every byte written (os.write may write part of a chunk)
        while chunk := os.read(fd, 1 << 20):
            sink.write(chunk)
        sink.flush()
        os.fchmod(out, info.st_mode & 0o777)  # the umask narrowed the mode given to open
    os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns))
