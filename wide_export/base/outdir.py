"""Atomic output folders: write into a hidden temp folder beside OUT, rename at the end.

A failure or Ctrl-C leaves nothing behind; an existing OUT is refused unless
`force`, and then replaced only once the new one is complete.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

from wide_export.base.errors import WideError
from wide_export.base.signals import check_interrupted, mark_published, shielded, signals_deferred


def check_output_dir(output: Path, force: bool, protect: tuple[Path | None, ...] = ()) -> Path:
    """Refuse an existing OUT (unless force) or an unwritable parent, before any work starts.

    `protect`: the user's inputs; an OUT that is one of them or contains one is refused even
    with force, since replacing OUT would delete them; an OUT inside one is refused too, since
    writing it would change what the user gave (and a later run would read it as part of the input).
    """
    output = Path(output).absolute()
    for given in filter(None, protect):
        given = Path(given).resolve()
        if given == output.resolve() or output.resolve() in given.parents:
            raise WideError(f"output {output} would replace your input {given}",
                            "choose an --output outside the input folders")
        if given in output.resolve().parents:
            raise WideError(f"output {output} is inside your input {given}",
                            "choose an --output outside the input folders (it would be written into them)")
    if output.exists() and not force:
        raise WideError(f"output {output} already exists", "pass --force to replace it, or choose another --output")
    if output.exists() and not output.is_dir():
        raise WideError(f"output {output} exists and is not a folder", "choose another --output")
    if output.exists():
        _check_removable(output)
    check_writable_parent(output, "--output")
    return output


def check_writable_parent(path: Path, option: str) -> None:
    """One WideError unless `path` could be created: its nearest existing ancestor a folder we can write."""
    probe = path.parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise WideError(f"cannot write to {path.parent}: permission denied or not a folder",
                        f"choose an {option} in a folder you can write to")


_FS_IOC_GETFLAGS = 0x80086601  # Linux: inode flags
_UNDELETABLE = 0x10 | 0x20  # FS_IMMUTABLE_FL | FS_APPEND_FL: not even root may unlink


def _check_removable(output: Path) -> None:
    """Refuse (before any work) an OUT that --force could not remove: a folder in it we cannot
    write, or an immutable / append-only entry (chattr +i / +a)."""
    import fcntl
    import struct

    def flags(path: str) -> int:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return 0  # a link or a socket: the ioctl cannot say
        try:
            return struct.unpack("l", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, struct.pack("l", 0)))[0]
        except OSError:
            return 0  # file system without inode flags
        finally:
            os.close(fd)

    for root, dirs, files in os.walk(output):
        if not os.access(root, os.W_OK | os.X_OK):
            bad = root
        else:
            bad = next((os.path.join(root, n) for n in [*dirs, *files]
                        if flags(os.path.join(root, n)) & _UNDELETABLE), None)
            bad = bad or (root if flags(root) & _UNDELETABLE else None)
        if bad:
            raise WideError(f"--force cannot replace {output}: {bad} cannot be removed (read-only or immutable)",
                            "fix its permissions (chmod / chattr -i), or choose another --output")


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename `src` to `dst`, atomically failing with FileExistsError if `dst` exists
    (Linux renameat2(RENAME_NOREPLACE); elsewhere a plain rename, which refuses a non-empty folder)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        renameat2 = None
    if renameat2 is not None:
        if renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL):  # those: this file system has no NOREPLACE
            raise OSError(err, os.strerror(err), str(dst))
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    try:
        os.rename(src, dst)
    except OSError as err:
        if err.errno == errno.ENOTEMPTY:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst)) from None
        raise


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _disk_full(err: BaseException) -> OSError | None:
    """The disk-full OSError in `err` or its causes (libraries wrap it), else None."""
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, OSError) and err.errno in _DISK_FULL:
            return err
        if any(s in str(err) for s in ("No space left on device", "File too large", "Disk quota exceeded")):
            return OSError(errno.ENOSPC, str(err).strip().splitlines()[-1] if str(err).strip() else "disk full")
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


_OPEN = [0]  # atomic_output_dir blocks open now (an export publishes into the temp folder of its outer one)


@contextlib.contextmanager
def atomic_output_dir(output: Path, force: bool = False) -> Iterator[Path]:
    """Yield a temp folder; on success it becomes `output`, on any error it is removed.

    Publishing never replaces an `output` that appeared while the work ran (another run writing
    the same folder) unless `force`: the rename is atomic and refuses an existing target.
    """
    output = check_output_dir(output, force)
    output.parent.mkdir(parents=True, exist_ok=True)
    with shielded():  # a signal between mkdtemp and the `try` below would leave the folder: it waits
        tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; the result should look like a mkdir
        _OPEN[0] += 1
    try:
        try:
            check_interrupted()  # a signal that arrived while the folder was being made
            yield tmp
        except Exception as err:
            full = _disk_full(err)
            if full is None:
                raise
            raise WideError(f"disk full while writing {output}: {full.strerror or full}",
                            "free some space (or raise the file-size limit), or choose an --output on "
                            "another disk; nothing was written") from None
        # The check and the renames run with SIGINT/SIGTERM held back: an interrupt before them never
        # publishes (also one swallowed on the way, in a finalizer or a native callback), one during
        # them is delivered once OUT is complete, and then reported as such (cli.common.user_errors).
        with signals_deferred():
            check_interrupted()
            _publish(tmp, output, force)
            if _OPEN[0] == 1:  # the user's OUT, not a folder inside an outer run's temp folder
                mark_published(output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        _OPEN[0] -= 1


def _publish(tmp: Path, output: Path, force: bool) -> None:
    if force and os.path.lexists(output):
        _check_removable(output)
        old = output.parent / f".{output.name}.old-{uuid.uuid4().hex[:8]}"
        try:
            rename_noreplace(output, old)
        except OSError as err:
            raise WideError(f"--force cannot replace {output}: {err.strerror or err}",
                            "fix its permissions, or choose another --output") from None
        try:
            rename_noreplace(tmp, output)
        except OSError:
            os.rename(old, output)  # someone made OUT again meanwhile: put the old one back
            raise WideError(f"output {output} appeared again while it was being replaced (another run?)",
                            "run again, one at a time, or choose another --output") from None
        problems: list[str] = []
        shutil.rmtree(old, onerror=lambda _f, path, exc: problems.append(f"{path}: {exc[1]}"))
        if problems:
            raise WideError(f"wrote {output}, but the old copy at {old} could not be removed ({problems[0]})",
                            f"remove {old} yourself")
        return
    try:
        if os.path.isdir(output) and not os.path.islink(output):
            with contextlib.suppress(OSError):
                os.rmdir(output)  # an empty folder that was allowed (or appeared) is replaced; a full one is not
        rename_noreplace(tmp, output)
    except FileExistsError:
        raise WideError(f"output {output} appeared while this run was writing it (another run to the same "
                        "--output?); it was left as it is", "pass --force to replace it, or choose another "
                        "--output") from None
