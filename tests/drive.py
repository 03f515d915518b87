"""A stand-in for Google Drive in Colab: a FUSE passthrough filesystem whose files are opened with direct_io, so that
a shared mmap of them fails (ENODEV), as on Drive's and other cloud-drive mounts. Everything else passes through
to a directory on the local disk.

    python tests/drive.py ROOT MOUNTPOINT [TRASH_LOG]   (foreground; unmount with fusermount3 -u MOUNTPOINT)

TRASH_LOG: every file that Google Drive would move to its trash - one deleted, or one replaced by a rename onto its
name - is appended there as a line "deleted PATH" or "replaced PATH" (PATH below the mount).

The `drive` fixture (tests/conftest.py) mounts one per test and unmounts it after, by its own process id; where FUSE
cannot be had (no /dev/fuse, no fusermount3, no libfuse, no mfusepy, or a mount refused) the test is skipped saying
which. .ci/run installs fuse3.
"""
from __future__ import annotations

import errno
import os
import sys

import mfusepy as fuse


class Passthrough(fuse.Operations):
    use_ns = True  # utimens in nanoseconds

    def __init__(self, root: str, trash_log: str | None = None) -> None:
        self.root = os.path.realpath(root)  # absolute: FUSE's process leaves its working directory
        self.trash_log = trash_log and os.path.realpath(trash_log)
        self._hidden: dict[str, str] = {}  # .fuse_hiddenN -> the path of the file deleted while open

    def _trashed(self, how: str, path: str) -> None:
        if self.trash_log:
            with open(self.trash_log, "a") as log:
                log.write(f"{how} {path}\n")

    def _path(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def access(self, path, amode):
        if not os.access(self._path(path), amode):
            raise fuse.FuseOSError(errno.EACCES)

    def chmod(self, path, mode):
        os.chmod(self._path(path), mode)

    def chown(self, path, uid, gid):
        os.chown(self._path(path), uid, gid)

    def getattr(self, path, fh=None):
        st = os.lstat(self._path(path))
        return {key: getattr(st, key) for key in ("st_atime_ns", "st_ctime_ns", "st_mtime_ns", "st_gid", "st_mode",
                                                  "st_nlink", "st_size", "st_uid")} | {
            "st_atime": st.st_atime_ns, "st_ctime": st.st_ctime_ns, "st_mtime": st.st_mtime_ns}

    def readdir(self, path, fh):
        return [".", "..", *os.listdir(self._path(path))]

    def readlink(self, path):
        return os.readlink(self._path(path))

    def mkdir(self, path, mode):
        os.mkdir(self._path(path), mode)

    def rmdir(self, path):
        os.rmdir(self._path(path))

    def unlink(self, path):
        os.unlink(self._path(path))
        self._trashed("deleted", self._hidden.pop(path, path))

    def symlink(self, target, source):
        os.symlink(source, self._path(target))

    def rename(self, old, new):
        replaced = os.path.isfile(self._path(new))
        os.rename(self._path(old), self._path(new))
        if os.path.basename(new).startswith(".fuse_hidden"):  # libfuse hides a file deleted while a process has it
            self._hidden[new] = old  # open, and deletes it once closed: logged then, by its own name
        elif replaced:
            self._trashed("replaced", new)

    def link(self, target, source):
        os.link(self._path(source), self._path(target))

    def utimens(self, path, times=None):
        os.utime(self._path(path), ns=times)

    def statfs(self, path):
        st = os.statvfs(self._path(path))
        return {key: getattr(st, key) for key in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                                                  "f_files", "f_flag", "f_frsize", "f_namemax")}

    def open(self, path, flags):
        return os.open(self._path(path), flags)

    def create(self, path, mode, fi=None):
        return os.open(self._path(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path, size, offset, fh):
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._path(path), length)

    def flush(self, path, fh):
        return 0

    def fsync(self, path, datasync, fh):
        (os.fdatasync if datasync else os.fsync)(fh)

    def release(self, path, fh):
        os.close(fh)


if __name__ == "__main__":
    fuse.FUSE(Passthrough(*sys.argv[1:2], *sys.argv[3:4]), sys.argv[2], foreground=True, direct_io=True)
