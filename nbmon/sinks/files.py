"""Files nbmon writes for the user (CSV, JSON Lines, HTML pages, summaries),
made so that a name planted in a shared directory changes nothing.

A symlink or hard link at the output's name is never written through: a
new file is made with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (which fails on any
existing name, a dangling link included), and replacing one
(``overwrite=True``) unlinks the name first, so only the link goes, never
what it points to. A whole file (:func:`write_text`) is written to a
temporary file beside it and renamed into place: a reader sees the old
file or the new one, never half of one.
"""
from __future__ import annotations

import os
import tempfile

NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _exists_error(path: str) -> FileExistsError:
    return FileExistsError(f"{path} already exists; pass overwrite=True "
                           f"(or --force on the command line) to replace it")


def create(path, *, overwrite: bool = False, append: bool = False) -> int:
    """A descriptor of a new, empty regular file at ``path`` (the user's
    umask applies). An existing name is FileExistsError unless
    ``overwrite``, which removes the name (a link, not its target) first;
    a directory there stays an error."""
    path = os.fspath(path)
    flags = NEW | (os.O_APPEND if append else 0)
    try:
        return os.open(path, flags, 0o666)
    except FileExistsError:
        if not overwrite:
            raise _exists_error(path) from None
    if os.path.isdir(path) and not os.path.islink(path):
        raise IsADirectoryError(f"{path} is a directory")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    try:
        return os.open(path, flags, 0o666)
    except FileExistsError:  # made again between our unlink and open: not ours to remove twice
        raise _exists_error(path) from None


def write_text(path, text: str, *, overwrite: bool = False) -> str:
    """Write ``text`` as the whole file ``path``: through a temporary file in
    the same directory, renamed into place (rename replaces a link at the
    name, never its target); without ``overwrite`` an existing name is
    FileExistsError, checked again at the rename. Returns ``path``."""
    path = os.fspath(path)
    if not overwrite and os.path.lexists(path):
        raise _exists_error(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=".nbmon-", dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with open(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if overwrite:
            os.replace(temp, path)
        else:
            _link_new(temp, path)
    except FileExistsError:
        _remove(temp)
        raise _exists_error(path) from None
    except BaseException:
        _remove(temp)
        raise
    return path


def _link_new(temp: str, path: str) -> None:
    """Give ``temp`` the name ``path`` only if no file has it (link() is
    create-if-absent, atomically); where the file system has no hard links,
    the name is made with O_EXCL and the text copied."""
    try:
        os.link(temp, path)
    except FileExistsError:
        raise
    except OSError:  # EPERM / ENOTSUP: no hard links here (FAT, some network shares)
        with open(temp, "rb") as src, open(create(path), "wb") as dst:
            dst.write(src.read())
    os.unlink(temp)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _umask() -> int:
    # os.umask() can only be read by setting it, which races with other threads' files.
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022
