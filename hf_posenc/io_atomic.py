"""Writing a checkpoint directory all at once: never over its input, never half-written, never with stale files.

:func:`check_output_dir` refuses an output that is an input, lies inside one or contains one, and a non-empty
directory unless ``overwrite``. :func:`atomic_dir` hands out a fresh directory beside the target; only when
everything has been written into it does it take the target's place (on Linux by one ``renameat2`` exchange, so
the target is always either the complete old or the complete new output), and the old contents are then deleted.
An exception leaves the target as it was; a process killed mid-write leaves the target as it was plus a hidden
``.NAME.partial-PID-…`` directory, removed by the next write to the same target once that process is gone.
:func:`atomic_write_text` does the same for one file replaced inside a directory another writer owns.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno as errno_codes
import os
import secrets
import shutil
from pathlib import Path
from typing import Iterator, Sequence

PARTIAL = ".partial-"


def _resolved(path: str | os.PathLike) -> Path:
    return Path(os.path.abspath(os.path.expanduser(path))).resolve()


def check_output_dir(
    output: str | os.PathLike, inputs: Sequence[str | os.PathLike] = (), overwrite: bool = False
) -> Path:
    """Refuse ``output`` (with a ``ValueError`` naming the fix) when it is one of the local ``inputs``, lies inside
    one, contains one, is a file, or is a non-empty directory and ``overwrite`` is false. Inputs that are not
    local paths (Hub ids) are ignored. Returns the resolved output path."""
    target = _resolved(output)
    for source in inputs:
        if not os.path.exists(os.path.expanduser(source)):
            continue
        source_path = _resolved(source)
        if target == source_path:
            raise ValueError(f"the output {output} is the input {source}; write to another directory.")
        if target.is_relative_to(source_path):
            raise ValueError(f"the output {output} lies inside the input {source}; write to a directory outside it.")
        if source_path.is_relative_to(target):
            raise ValueError(f"the output {output} contains the input {source} (replacing it would delete the "
                             "input); write to another directory.")
    if target.exists() and not target.is_dir():
        raise ValueError(f"the output {output} is a file, not a directory; choose a directory path.")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise ValueError(f"the output directory {output} exists and is not empty; pass --overwrite (overwrite=True "
                         "in Python) to replace it (its current contents are deleted), or choose another directory.")
    return target


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _remove_stale_partials(target: Path) -> None:
    """Delete ``.NAME.partial-PID-…`` directories left beside ``target`` by processes that no longer run."""
    for path in target.parent.glob(f".{target.name}{PARTIAL}*"):
        pid = path.name[len(f".{target.name}{PARTIAL}"):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(path)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); ``False`` where the
    system offers no such call (then the caller falls back to two renames)."""
    libc_name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(libc_name, use_errno=True) if libc_name else None
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    errno = ctypes.get_errno()
    if errno in (errno_codes.ENOSYS, errno_codes.EINVAL, errno_codes.EOPNOTSUPP):  # kernel or file system cannot
        return False
    raise OSError(errno, f"cannot exchange {a} and {b}: {os.strerror(errno)}")


def _publish(partial: Path, target: Path) -> None:
    """Put the finished ``partial`` directory at ``target`` and delete what was there."""
    if not target.exists():
        os.rename(partial, target)
        return
    if _exchange(partial, target):
        shutil.rmtree(partial)  # now the old output
        return
    old = target.with_name(f".{target.name}{PARTIAL}{os.getpid()}-old-{secrets.token_hex(4)}")
    os.rename(target, old)
    os.rename(partial, target)
    shutil.rmtree(old)


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """``with atomic_dir(path) as tmp: write into tmp`` — ``path`` becomes exactly what was written, at once.

    ``path`` may be missing or an empty directory; a non-empty one is refused unless ``overwrite`` (then it is
    replaced as a whole, so no file of the old output survives). On an exception nothing changes at ``path``."""
    path = check_output_dir(target, overwrite=overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(path)
    partial = path.with_name(f".{path.name}{PARTIAL}{os.getpid()}-{secrets.token_hex(4)}")
    partial.mkdir()
    try:
        yield partial
        _publish(partial, path)
    finally:
        if partial.exists():
            shutil.rmtree(partial)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to the file ``path`` at once: into a hidden ``.NAME.partial-PID-…`` file beside it, then
    renamed over it, so a reader (or a process killed meanwhile) finds the old file or the new one, never half of
    one. For a file replaced inside a directory written by someone else (a Trainer's ``checkpoint-N``)."""
    path = Path(path)
    partial = path.with_name(f".{path.name}{PARTIAL}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        partial.write_text(text)
        os.replace(partial, path)
    finally:
        if partial.exists():
            partial.unlink()
    return path
