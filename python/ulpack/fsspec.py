# SPDX-License-Identifier: MIT
"""An fsspec file system over an archive, without a mount (issue 36 item 6):
protocol "ulpack", so that fsspec users (torch.distributed.checkpoint's
FsspecWriter and FsspecReader, pandas, ...) read and write archives directly.

    import fsspec, ulpack.fsspec          # the import registers "ulpack"
    fs = fsspec.filesystem("ulpack", archive="/data/ckpt-archive")
    fs.ls("run/step-100")                 # paths inside the archive
    with fsspec.open("ulpack:///data/ckpt-archive//run/step-100/.metadata") as f: ...

URLs. One instance serves one archive, named either by the storage option
archive= (a directory, or s3://BUCKET/PREFIX read-only) or by the URL itself:
ulpack://ARCHIVE//PATH, the first "//" after the protocol ending the archive's
directory (ulpack:///data/ckpt-archive//run/step-100/__0_0.distcp). With
archive= given, a URL is ulpack://PATH (ulpack://run/step-100/__0_0.distcp).
Paths inside the archive are relative to its root; those that the file
system returns (ls, find, info's name) are plain ones ("run/step-100/x")
and may be passed back. A path given to an instance always means a path of
that instance's archive: the ARCHIVE part of a URL only chooses the instance
(fsspec.filesystem, fsspec.open and url_to_fs build instances from URLs).

Invariants:
 - reads go through one read-only Archive per archive (and per process),
   shared by every instance and thread: it sees what writers commit (the
   index is read at each call), and its open files outlive any writer;
 - writes go through one Writer per archive (and per process) shared by every
   instance and thread (fsspec makes an instance per thread): taken at the
   first write, it holds the archive's single-writer lock until
   release_writer() (or ulpack.fsspec.release(archive)) or the process's
   exit (a forked child never uses nor frees its parent's); a read-write mount or
   another process's writer makes the first write raise BlockingIOError;
 - with the storage option lock_wait=SECONDS, several processes (the ranks
   of a DCP save) write one archive in turn: each write takes the lock
   (waiting up to lock_wait for it), archives, and lets it go without gc
   (release_writer() runs the gc, waiting its turn likewise); a writer this
   process holds already is used as it is;
 - a file opened for writing is spooled to a temporary file and archived
   whole by Writer.save at its close (coded per tensor like any save); until
   then nothing of it is in the archive. A with block left by an exception,
   or discard(), archives nothing. Under an fsspec transaction (autocommit
   off) the files are archived at the transaction's end.
_shared and its dicts are guarded by _shared_mu.
"""
import atexit
import contextlib
import errno
import io
import os
import shutil
import tempfile
import threading
import time

import fsspec
from fsspec.spec import AbstractFileSystem

from ._archive import Archive, Writer, BUFFER_SIZE

__all__ = ["UlpackFileSystem", "UlpackWriteFile", "register", "release"]

PROTOCOL = "ulpack"


class _Shared:
    """This process's readers and writers, by archive (see the module's
    comment)."""

    def __init__(self):
        self.readers = {}  # key -> Archive (read-only)
        self.writers = {}  # key -> Writer
        self.turns = {}    # key -> threading.Lock: lock_wait's writes of this process, one at a time


_shared_mu = threading.Lock()
_shared = _Shared()


def _key(archive):
    if "://" in archive:
        return archive
    return os.path.realpath(archive)


def _state():
    """_shared (called under _shared_mu)."""
    return _shared


def _after_fork_in_child():
    """A forked child starts with no reader and no writer: the parent's
    handles (its sqlite connection, its lock) are never used nor freed here,
    and no gc runs on the parent's behalf (their _g is dropped, so that
    their finalizers do nothing)."""
    global _shared, _shared_mu
    _shared_mu = threading.Lock()
    old, _shared = _shared, _Shared()
    for ar in list(old.readers.values()) + list(old.writers.values()):
        ar._g = None
        if isinstance(ar, Writer):
            ar._lock_fd = -1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def release(archive):
    """Closes this process's writer of archive, if any: re-bases and reclaims
    (Writer.close) and lets go of the single-writer lock. A later write
    takes it again."""
    with _shared_mu:
        w = _state().writers.pop(_key(os.fspath(archive)), None)
    if w is not None:
        w.close()


@atexit.register
def _release_all():
    with _shared_mu:
        st = _state()
        ws = list(st.writers.values())
        st.writers.clear()
    for w in ws:
        try:
            w.close()
        except Exception:  # noqa: BLE001 - exiting: the archive is consistent after every save
            pass


def _split_url(path):
    """(archive or None, path inside it) of a URL or path, the protocol
    stripped: ARCHIVE//PATH names an archive, PATH alone does not."""
    path = fsspec.utils.stringify_path(path)
    if path.startswith(PROTOCOL + "://"):
        path = path[len(PROTOCOL) + 3:]
    elif path.startswith(PROTOCOL + "::"):
        path = path[len(PROTOCOL) + 2:]
    if "//" in path:
        archive, inner = path.split("//", 1)
        return (archive or None), inner.strip("/")
    return None, path.strip("/")


def _join(d, name):
    return d + "/" + name if d else name


class UlpackFileSystem(AbstractFileSystem):
    """fsspec file system of one ulpack archive (see the module's comment for
    its URLs). Storage options: archive (the archive's directory, or
    s3://BUCKET/PREFIX read-only: required unless the URL names it),
    read_only (refuse writes with EROFS), cache_size, threads, cache_dir,
    pack_cache (as ulpack.open_archive), tmpdir (where written files are
    spooled until their close; default: tempfile's), lock_wait (seconds:
    take the single-writer lock for each write and let it go after, waiting
    up to that long for it, so that several processes write in turn; None,
    the default: hold it from the first write on)."""

    protocol = PROTOCOL
    root_marker = ""

    def __init__(self, archive=None, read_only=False, cache_size=0, threads=0, cache_dir=None, pack_cache=0,
                 tmpdir=None, lock_wait=None, **kwargs):
        super().__init__(**kwargs)
        if archive is None:
            raise ValueError("ulpack: which archive? give the storage option archive=DIR or a URL "
                             "ulpack://ARCHIVE//PATH (ulpack:///data/ckpt-archive//run/step-100)")
        self.archive = os.fspath(archive)
        self.read_only = bool(read_only)
        self.tmpdir = tmpdir
        self.lock_wait = None if lock_wait is None else float(lock_wait)
        self._ropts = dict(cache_size=cache_size, threads=threads, cache_dir=cache_dir, pack_cache=pack_cache)
        self._wopts = dict(cache_size=cache_size, threads=threads)
        self._k = _key(self.archive)

    # ---- paths
    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        return _split_url(path)[1]

    @staticmethod
    def _get_kwargs_from_urls(path):
        archive = _split_url(path)[0]
        return {"archive": archive} if archive else {}

    def unstrip_protocol(self, name):
        if name.startswith(PROTOCOL + "://"):
            return name
        return "%s://%s//%s" % (PROTOCOL, self.archive, self._strip_protocol(name))

    # ---- the shared archive handles
    def reader(self):
        """This process's read-only Archive of the archive (shared)."""
        with _shared_mu:
            st = _state()
            ar = st.readers.get(self._k)
            if ar is None or ar.closed:
                ar = st.readers[self._k] = Archive(self.archive, read_only=True, **self._ropts)
            return ar

    def writer(self):
        """This process's Writer of the archive (shared; created when the
        archive is missing): the first call takes the single-writer lock."""
        if self.read_only:
            raise OSError(errno.EROFS, "archive %s is open read-only (storage option read_only)" % self.archive,
                          self.archive)
        with _shared_mu:
            st = _state()
            w = st.writers.get(self._k)
            if w is None or w.closed:
                w = st.writers[self._k] = Writer(self.archive, **self._wopts)
            return w

    def release_writer(self):
        """Closes this process's writer of the archive (gc, then the lock goes):
        ulpack.fsspec.release(archive). With lock_wait, runs the gc in its
        turn."""
        with _shared_mu:
            held = self._k in _state().writers
        if held or self.lock_wait is None:
            release(self.archive)
        else:
            with self._writing() as w:
                w.commit()

    @contextlib.contextmanager
    def _writing(self):
        """The writer for one write operation (see lock_wait)."""
        if self.lock_wait is None:
            yield self.writer()
            return
        if self.read_only:
            self.writer()  # raises EROFS
        with _shared_mu:
            st = _state()
            held = st.writers.get(self._k)
            turn = st.turns.setdefault(self._k, threading.Lock())
        if held is not None and not held.closed:
            yield held
            return
        with turn:
            deadline = time.monotonic() + self.lock_wait
            delay = 0.005
            while True:
                try:
                    w = Writer(self.archive, **self._wopts)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(delay)
                    delay = min(delay * 2, 0.25)
            try:
                yield w
            finally:
                w._close(True, commit=False)

    # ---- metadata
    def _entry(self, path, st):
        if st.is_symlink:
            kind = "other"
        else:
            kind = "directory" if st.is_dir else "file"
        out = {"name": path, "size": 0 if st.is_dir else st.size, "type": kind, "islink": st.is_symlink,
               "mode": st.mode, "uid": st.uid, "gid": st.gid, "mtime": st.mtime_ns / 1e9,
               "stored_bytes": st.stored_bytes}
        if not st.is_dir:
            out.update(sha256=st.sha256, kind=st.kind, step=st.step, chain_depth=st.chain_depth)
        return out

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        return self._entry(path, self.reader().stat(path))

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        ar = self.reader()
        st = ar.stat(path)
        if not st.is_dir:
            entries = [self._entry(path, st)]
        else:
            entries = [self._entry(_join(path, n), s) for n, s in ar.scandir(path)]
        return entries if detail else [e["name"] for e in entries]

    def exists(self, path, **kwargs):
        try:
            self.info(path)
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False
        except ValueError:  # a NUL byte: no such path, as os.path.exists
            return False

    def modified(self, path):
        import datetime
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.timezone.utc)

    # ---- reading
    def cat_file(self, path, start=None, end=None, **kwargs):
        """The file's bytes [start, end) (negative: from its end), decoding
        only the chunks they overlap."""
        path = self._strip_protocol(path)
        with self.reader().open(path, buffering=0) as f:
            size = f.size
            s = 0 if start is None else (start if start >= 0 else max(size + start, 0))
            e = size if end is None else (end if end >= 0 else max(size + end, 0))
            e = min(e, size)
            return f.pread(e - s, s) if e > s else b""

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        path = self._strip_protocol(path)
        if mode == "rb":
            f = self.reader().open(path, buffering=block_size if block_size not in (None, "default")
                                   else BUFFER_SIZE)
            f.path, f.fs, f.size = path, self, f.raw.size
            return f
        if mode in ("wb", "xb", "ab"):
            if mode == "xb" and self.exists(path):
                raise FileExistsError(errno.EEXIST, "archive %s: %s: file exists" % (self.archive, path), path)
            self._writable_check(path)
            return UlpackWriteFile(self, path, append=(mode == "ab"), autocommit=autocommit)
        raise ValueError("ulpack: mode %r: files are read (rb) or written whole (wb, xb, ab)" % (mode,))

    def _writable_check(self, path):
        if self.read_only:
            raise OSError(errno.EROFS, "archive %s is open read-only (storage option read_only)" % self.archive,
                          path)
        if not path:
            raise IsADirectoryError(errno.EISDIR, "archive %s: the root is a directory" % self.archive, path)

    # ---- writing
    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        path = self._strip_protocol(path)
        self._writable_check(path)
        if mode == "create" and self.exists(path):
            raise FileExistsError(errno.EEXIST, "archive %s: %s: file exists" % (self.archive, path), path)
        with self._writing() as w:
            return w.save(path, value)

    def put_file(self, lpath, rpath, callback=None, mode="overwrite", **kwargs):
        """Archives local file lpath at rpath (its mode and mtime kept); a
        local directory makes a directory."""
        rpath = self._strip_protocol(rpath)
        if os.path.isdir(lpath):
            self.makedirs(rpath, exist_ok=True)
            return None
        self._writable_check(rpath)
        if mode == "create" and self.exists(rpath):
            raise FileExistsError(errno.EEXIST, "archive %s: %s: file exists" % (self.archive, rpath), rpath)
        with self._writing() as w:
            res = w.save(rpath, os.fspath(lpath))
        if callback is not None:
            callback.set_size(res["raw_bytes"])
            callback.absolute_update(res["raw_bytes"])
        return res

    def cp_file(self, path1, path2, **kwargs):
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        self._writable_check(path2)
        if self.isdir(path1):
            self.makedirs(path2, exist_ok=True)
            return
        with self.reader().open(path1, buffering=0) as f:
            with self._writing() as w:
                w.save(path2, f)

    def mkdir(self, path, create_parents=True, **kwargs):
        path = self._strip_protocol(path)
        if not create_parents and path and "/" in path and not self.isdir(path.rsplit("/", 1)[0]):
            raise FileNotFoundError(errno.ENOENT, "archive %s: %s: no parent directory" % (self.archive, path),
                                    path)
        if not path:
            with self._writing():  # the archive itself, created when missing
                pass
            return
        if self.exists(path):
            raise FileExistsError(errno.EEXIST, "archive %s: %s: exists" % (self.archive, path), path)
        with self._writing() as w:
            w.mkdir(path)

    def makedirs(self, path, exist_ok=False):
        path = self._strip_protocol(path)
        if path and self.exists(path):
            if not exist_ok or not self.isdir(path):
                raise FileExistsError(errno.EEXIST, "archive %s: %s: exists" % (self.archive, path), path)
            return
        with self._writing() as w:
            if path:
                w.mkdir(path)

    def rm_file(self, path):
        path = self._strip_protocol(path)
        self._writable_check(path)
        with self._writing() as w:
            w.remove(path)

    _rm = rm_file

    def rmdir(self, path):
        path = self._strip_protocol(path)
        if not self.isdir(path):
            raise NotADirectoryError(errno.ENOTDIR, "archive %s: %s: not a directory" % (self.archive, path), path)
        self.rm_file(path)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """Renames in the index (a file or a whole directory; nothing is
        re-coded), as rename(2): over an existing file."""
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if path1 == path2:
            return
        self._writable_check(path2)
        with self._writing() as w:
            w.rename(path1, path2)

    def rename(self, path1, path2, **kwargs):
        self.mv(path1, path2, **kwargs)


class UlpackWriteFile(io.RawIOBase):
    """A file of an archive open for writing (fs.open(path, "wb")): written
    (and seekable) in a temporary file, archived whole at close() by the
    archive's writer (result: what Writer.save returned). Nothing is archived
    when a with block ends by an exception, nor after discard()."""

    def __init__(self, fs, path, append=False, autocommit=True):
        super().__init__()
        self.fs = fs
        self.path = self.name = path
        self.autocommit = autocommit
        self.result = None
        self._tmp = tempfile.TemporaryFile(dir=fs.tmpdir, prefix="ulpack-fsspec-")
        self._done = False  # committed or discarded: the temporary file is gone
        if append and fs.exists(path):
            with fs.reader().open(path, buffering=0) as src:
                shutil.copyfileobj(src, self._tmp, 8 << 20)

    def _check_open(self):
        if self.closed:
            raise ValueError("I/O operation on closed file %s" % self.path)

    def writable(self):
        self._check_open()
        return True

    def seekable(self):
        self._check_open()
        return True

    def readable(self):
        return False

    def write(self, b):
        self._check_open()
        return self._tmp.write(b)

    def seek(self, offset, whence=io.SEEK_SET):
        self._check_open()
        return self._tmp.seek(offset, whence)

    def tell(self):
        self._check_open()
        return self._tmp.tell()

    def truncate(self, size=None):
        self._check_open()
        return self._tmp.truncate(size)

    def flush(self):
        if not self._done:
            self._tmp.flush()

    def fileno(self):
        """The temporary file's descriptor (os.fsync on it is cheap and
        harmless: the archive makes each save durable itself)."""
        self._check_open()
        return self._tmp.fileno()

    def commit(self):
        """Archives what was written (at close, or at the end of a
        transaction)."""
        if self._done:
            return
        try:
            self._tmp.flush()
            self._tmp.seek(0)
            with self.fs._writing() as w:
                self.result = w.save(self.path, self._tmp)
        finally:
            self._done = True
            self._tmp.close()

    def discard(self):
        if not self._done:
            self._done = True
            self._tmp.close()

    def close(self):
        if self.closed:
            return
        try:
            if self.autocommit:
                self.commit()
        finally:
            super().close()

    def __exit__(self, exc_type, *exc):
        if exc_type is not None:
            self.discard()
        self.close()

    def __del__(self):
        try:
            if not self._done:
                self.discard()  # never closed: an abandoned file archives nothing
        except Exception:  # noqa: BLE001
            pass


def register(clobber=True):
    """Registers the protocol "ulpack" with fsspec (what importing this
    module does; an installed package also registers it through its
    fsspec.specs entry point)."""
    fsspec.register_implementation(PROTOCOL, UlpackFileSystem, clobber=clobber)


register()
