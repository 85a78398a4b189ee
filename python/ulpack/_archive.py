# SPDX-License-Identifier: MIT
"""Archives, their files, and the writer."""
import ctypes
import errno
import io
import operator
import os
import stat as _stat
import sys
import tempfile
import threading

from . import _lib
from ._lib import lib, enc

_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]
_libc.free.restype = None


def _libc_free(p):
    """Frees what libulpack malloc'd for the caller (its JSON strings)."""
    _libc.free(p)

# A BufferedReader's buffer over an archived file: small reads (a zip
# directory, a pickle) come from it; reads of at least this size go straight
# to the library.
BUFFER_SIZE = 256 << 10


class StatResult:
    """What an archive knows of a path (ulp_stat): is_dir, is_symlink, size,
    mode, uid, gid, mtime_ns, sha256 (hex, files), stored_bytes, step (-1:
    none), chain_depth, kind ("safetensors", "torch" or "opaque")."""

    __slots__ = ("is_dir", "is_symlink", "size", "mode", "uid", "gid", "mtime_ns", "sha256", "stored_bytes",
                 "step", "chain_depth", "kind")

    def __init__(self, st):
        self.is_dir = bool(st.is_dir)
        self.is_symlink = bool(st.is_symlink)
        self.size = st.size
        self.mode = st.mode
        self.uid = st.uid
        self.gid = st.gid
        self.mtime_ns = st.mtime.sec * 1000000000 + st.mtime.nsec
        self.sha256 = bytes(st.sha256).hex()
        self.stored_bytes = st.stored_bytes
        self.step = st.step
        self.chain_depth = st.chain_depth
        self.kind = {1: "safetensors", 2: "torch"}.get(st.kind, "opaque")

    def __repr__(self):
        return "StatResult(%s)" % ", ".join("%s=%r" % (k, getattr(self, k)) for k in self.__slots__)


# The C handles behind the objects below (issue 34 item 8). An archive's
# handle and the handles of its files live in a _Handles, which the Archive
# and each of its ArchiveFiles hold; no C handle is reachable from Python but
# through it, and none is used or freed but under its lock's rules:
#  - a call into the library on a handle holds a "use" (enter() ... leave(),
#    through Archive._use() and ArchiveFile._Use): taken only while the handle
#    is open, it keeps the handle from being freed until the call returns; a
#    file's use is also a use of its archive;
#  - closing a file or an archive first stops new uses, then frees the handle
#    once the uses in flight have returned: close() waits for them, a
#    finalizer (__del__), or a close during the interpreter's exit (when a
#    daemon thread may hold a use for ever), leaves the freeing to the last
#    of them;
#  - the archive is freed after every file still open on it (their reads then
#    raise ValueError), so a file's handle never outlives its archive's,
#    whatever order the garbage collector or the interpreter's exit finalizes
#    them in; an ArchiveFile holds its Archive, so an archive no longer
#    referenced but by its open files stays open.
# Every field of _Handles and _FileHandle is guarded by _Handles.cv; the C
# calls that free run under it (they call back into no Python).

class _FileHandle:
    __slots__ = ("h", "open", "users", "free_on_leave")

    def __init__(self, h):
        self.h = h          # ulp_file *, None once freed
        self.open = True    # new uses allowed
        self.users = 0
        self.free_on_leave = False


class _Handles:
    _lib = lib  # held here: module globals may be gone when a finalizer runs at exit
    _finalizing = sys.is_finalizing

    def __init__(self, h):
        self.h = h          # ulp_archive *, None once freed
        self.open = True
        self.users = 0
        self.free_on_leave = False
        self.files = set()  # the _FileHandles not freed yet
        self.cv = threading.Condition(threading.Lock())

    def live(self):
        return self.open

    def enter(self, fh=None):
        """A use of the archive (and of file fh): its handles, or None where
        either is closed."""
        with self.cv:
            if not self.open or (fh is not None and not fh.open):
                return None
            self.users += 1
            if fh is not None:
                fh.users += 1
            return self.h, (fh.h if fh is not None else None)

    def leave(self, fh=None):
        with self.cv:
            self.users -= 1
            if fh is not None:
                fh.users -= 1
                if fh.users == 0 and fh.free_on_leave:
                    self._free_file(fh)
            if self.users == 0:
                if self.free_on_leave:
                    self._free()
                self.cv.notify_all()

    def add_file(self, h):
        """Registers a new ulp_file (opened under a use of the archive)."""
        fh = _FileHandle(h)
        with self.cv:
            fh.open = self.open
            self.files.add(fh)
        return fh

    def _free_file(self, fh):
        if fh.h is not None:
            self._lib.ulp_file_close(fh.h)
            fh.h = None
        fh.open = fh.free_on_leave = False
        self.files.discard(fh)

    def _free(self):
        for fh in list(self.files):
            self._free_file(fh)
        if self.h is not None:
            self._lib.ulp_archive_close(self.h)
            self.h = None
        self.free_on_leave = False

    def close_file(self, fh, wait=True):
        with self.cv:
            if fh.h is None or not fh.open:
                return
            fh.open = False
            wait = wait and not self._finalizing()
            while wait and fh.users:
                self.cv.wait()
            if fh.users:
                fh.free_on_leave = True
            else:
                self._free_file(fh)

    def close(self, wait=True):
        with self.cv:
            if not self.open:
                return
            self.open = False
            for fh in self.files:
                fh.open = False
            wait = wait and not self._finalizing()
            while wait and self.users:
                self.cv.wait()
            if self.users:
                self.free_on_leave = True
            else:
                self._free()


_OFF_MAX = (1 << 63) - 1  # off_t


class ArchiveFile(io.RawIOBase):
    """An archived file, read-only and seekable (a handle of ulp_file_open).
    Each read decodes only the chunks it overlaps, through the archive's
    shared decode cache. pread(size, offset) reads without moving the
    position and may be called from several threads at once.

    archive.open() returns one of these wrapped in an io.BufferedReader.
    The file keeps its archive open while the archive is only referenced by
    it; after archive.close() its reads raise ValueError, as a closed file's."""

    def __init__(self, archive, path):
        super().__init__()
        self._archive = archive
        self._path = path
        self.name = path
        self._fh = None
        bpath = enc(path)
        h = ctypes.c_void_p()
        with archive._use() as a:
            archive._check(lib.ulp_file_open(a, bpath, ctypes.byref(h)), path)
            self._size = lib.ulp_file_get_stat(h).contents.size
            self._fh = archive._g.add_file(h)
        self._pos = 0

    @property
    def size(self):
        return self._size

    @property
    def closed(self):
        fh = self._fh
        return fh is None or not fh.open

    def _closed_error(self):
        return ValueError("I/O operation on closed file %s" % self._path)

    def _check_open(self):
        if self.closed:
            raise self._closed_error()

    class _Use:
        __slots__ = ("f", "g", "h")

        def __init__(self, f):
            self.f = f
            self.g = f._archive._g

        def __enter__(self):
            u = self.g.enter(self.f._fh) if self.f._fh is not None else None
            if u is None:
                raise self.f._closed_error()
            return u[1]

        def __exit__(self, *exc):
            self.g.leave(self.f._fh)

    def set_readahead(self, on):
        """Read-ahead (on by default) decodes the chunks after a read in
        order in the background; off, only what is read is decoded (a reader
        of single tensors)."""
        with self._Use(self) as h:
            lib.ulp_file_set_readahead(h, 1 if on else 0)

    def readable(self):
        self._check_open()
        return True

    def seekable(self):
        self._check_open()
        return True

    def _pread_into(self, buf, off):
        """Reads into the writable buffer buf at file offset off until it is
        full or the file ends; returns the bytes read."""
        mv = memoryview(buf).cast("B")
        n = len(mv)
        if n == 0:
            self._check_open()
            return 0
        addr = ctypes.addressof((ctypes.c_char * n).from_buffer(mv))
        done = 0
        with self._Use(self) as h:
            while done < n:
                r = lib.ulp_file_pread(h, addr + done, n - done, off + done)
                if r < 0:
                    self._archive._check(r, self._path)
                if r == 0:
                    break
                done += r
        return done

    def readinto(self, b):
        n = self._pread_into(b, self._pos)
        self._pos += n
        return n

    def pread(self, size, offset):
        """size bytes at offset (fewer at the end of the file), as os.pread:
        a negative size or offset raises OSError EINVAL, an offset past
        off_t's range OverflowError."""
        size, offset = operator.index(size), operator.index(offset)
        self._check_open()
        if offset > _OFF_MAX or size > _OFF_MAX:
            raise OverflowError("Python int too large to convert to C long")
        if offset < 0 or size < 0:
            raise OSError(errno.EINVAL, "negative %s" % ("offset" if offset < 0 else "size"), self._path)
        if offset >= self._size or size == 0:
            return b""
        buf = bytearray(min(size, self._size - offset))
        n = self._pread_into(buf, offset)
        return bytes(buf) if n == len(buf) else bytes(buf[:n])

    def readall(self):
        self._check_open()
        buf = bytearray(max(self._size - self._pos, 0))
        n = self._pread_into(buf, self._pos)
        self._pos += n
        return bytes(buf)

    def seek(self, offset, whence=io.SEEK_SET):
        offset = operator.index(offset)
        self._check_open()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError("invalid whence (%r)" % whence)
        if pos > _OFF_MAX:
            raise OverflowError("seek position %d past the largest file offset" % pos)
        if pos < 0:
            raise OSError(errno.EINVAL, "negative seek position %d" % pos, self._path)
        self._pos = pos
        return pos

    def tell(self):
        self._check_open()
        return self._pos

    def close(self):
        fh = self._fh
        if fh is not None:
            self._archive._g.close_file(fh)
        super().close()

    def __del__(self):
        try:
            fh = self._fh
            if fh is not None:
                self._archive._g.close_file(fh, wait=False)
        except Exception:
            pass


class _ArchiveUse:
    __slots__ = ("ar",)

    def __init__(self, ar):
        self.ar = ar

    def __enter__(self):
        g = getattr(self.ar, "_g", None)
        u = g.enter() if g is not None else None
        if u is None:
            raise ValueError("archive %s is closed" % self.ar.path)
        return u[0]

    def __exit__(self, *exc):
        self.ar._g.leave()


class Archive:
    """An archive opened with ulpack.open_archive(). Thread-safe: several
    threads may read it at once (the library releases the GIL)."""

    def __init__(self, path, read_only=True, cache_size=0, threads=0, max_chain=0, cache_dir=None, pack_cache=0):
        self.path = os.fspath(path)
        bpath = enc(self.path)
        # path may be s3://BUCKET/PREFIX: cache_dir is then the local home
        # (ulpackfs(1), OBJECT STORES) and pack_cache its bound in bytes
        self._cache_dir = enc(os.fspath(cache_dir)) if cache_dir is not None else None
        opts = _lib.ArchiveOpts(cache_size=cache_size, max_chain=max_chain, threads=threads,
                                read_only=1 if read_only else 0, cache_dir=self._cache_dir,
                                pack_cache=pack_cache)
        h = ctypes.c_void_p()
        err = ctypes.create_string_buffer(1024)
        rc = lib.ulp_archive_open(bpath, ctypes.byref(opts), ctypes.byref(h), err, len(err))
        if rc < 0:
            raise _lib.error(rc, err.value.decode("utf-8", "replace") or _lib.strerror(rc), self.path)
        self._g = _Handles(h)

    # ---- the handle
    def _use(self):
        """with self._use() as a: a is the ulp_archive *, open until the block
        ends (_Handles); ValueError if the archive is closed."""
        return _ArchiveUse(self)

    # ---- errors
    def _check(self, rc, path=None):
        """Raises the error of a negative return code rc: its message names
        the archive and the file (ulp_archive_errmsg of this thread). Called
        inside a use of the archive (the call that failed held it)."""
        if rc >= 0:
            return rc
        g = getattr(self, "_g", None)
        m = lib.ulp_archive_errmsg(g.h) if g is not None and g.h else None
        msg = m.decode("utf-8", "replace") if m else _lib.strerror(rc)
        if path is not None and path not in msg:
            msg = "%s: %s" % (path, msg)
        if self.path not in msg:
            msg = "archive %s: %s" % (self.path, msg)
        raise _lib.error(rc, msg, path)

    @property
    def closed(self):
        g = getattr(self, "_g", None)
        return g is None or not g.live()

    def _close(self, wait):
        g = getattr(self, "_g", None)
        if g is not None:
            g.close(wait)

    def close(self):
        """Closes the archive, and every file still open on it (their reads
        then raise ValueError); waits for the reads in flight in other
        threads. A file open on an archive that is not closed keeps it open."""
        self._close(True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self._close(False)
        except Exception:
            pass

    def __repr__(self):
        return "<ulpack.Archive %r%s>" % (self.path, " closed" if self.closed else "")

    # ---- metadata
    def stat(self, path):
        """StatResult of path ("" is the root), without decoding anything."""
        st = _lib.Stat()
        bpath = enc(path)
        with self._use() as a:
            self._check(lib.ulp_archive_stat(a, bpath, ctypes.byref(st)), path)
        return StatResult(st)

    def exists(self, path):
        """Whether path is in the archive; False for a path that cannot be
        one (a NUL byte in it), as os.path.exists."""
        try:
            self.stat(path)
            return True
        except FileNotFoundError:
            return False
        except ValueError:
            if self.closed:
                raise
            return False

    def listdir(self, path=""):
        """Names in directory path, in numeric order (checkpoint-200 before
        checkpoint-1000) as `ulpack ls` shows them."""
        return [n for n, _ in self.scandir(path)]

    def scandir(self, path=""):
        """(name, StatResult) for each entry of directory path."""
        out = []

        def cb(_arg, name, st):
            out.append((os.fsdecode(name), StatResult(st.contents)))
            return 0
        bpath = enc(path)
        with self._use() as a:
            self._check(lib.ulp_archive_readdir(a, bpath, _lib.READDIR_CB(cb), None), path)
        return out

    def files(self, prefix=""):
        """Paths of every file (and symlink) under prefix, depth first in
        name order."""
        out = []
        st = self.stat(prefix)
        if not st.is_dir:
            return [prefix]
        stack = [prefix]
        while stack:
            d = stack.pop()
            subdirs = []
            for name, s in self.scandir(d):
                p = d + "/" + name if d else name
                if s.is_dir:
                    subdirs.append(p)
                else:
                    out.append(p)
            stack.extend(reversed(subdirs))
        return out

    def steps(self, run=None):
        """The steps of every run (or of run, a path prefix), by run and then
        in numeric step order: dicts with the figures of `ulpack steps
        --json` (run, step, dir, type "dir" or "file", files, raw_bytes,
        stored_bytes, ratio, chain_depth)."""
        out = []
        prefix = run or ""

        def cb(_arg, si):
            s = si.contents
            out.append({"run": os.fsdecode(s.run), "step": s.step, "dir": os.fsdecode(s.dir),
                        "type": "file" if s.is_file else "dir", "files": s.files, "raw_bytes": s.raw_bytes,
                        "stored_bytes": s.stored_bytes,
                        "ratio": round(s.stored_bytes / s.raw_bytes, 6) if s.raw_bytes else 0.0,
                        "chain_depth": s.chain_depth})
            return 0
        self.stat(prefix)  # NOENT names the prefix
        with self._use() as a:
            self._check(lib.ulp_archive_steps(a, enc(prefix), _lib.STEPS_CB(cb), None), prefix)
        return out

    def dynamics(self, run, tensors=None, norms=False):
        """A run's training dynamics (ulp_archive_dynamics: `ulpack dynamics
        --json`, ulpack(1) DYNAMICS) as numpy arrays: a namespace with steps
        (int64), layers, tensors and files (lists of names), tensor_layer,
        elements; steps x tensors: role ('a' anchor, 'd' delta, 's' same as
        the step before, '-' absent), stored_bytes, ref_step, chain_depth,
        codec, bits_per_weight, update_bits_per_weight (NaN: no delta links
        the step to the one before), update_bound; steps x layers:
        layer_bits_per_weight, layer_update_bits_per_weight, layer_excess_bits;
        per step: step_stored_bytes, step_bits_per_weight,
        step_update_bits_per_weight, step_excess_bits; jump (a dict, or None)
        and summary (the line `ulpack dynamics` prints first). From the index
        alone, unless norms: then the run is decoded and rel_change,
        frac_changed, changed, median_ulps, p99_ulps, max_ulps,
        exponent_moves (steps x tensors), layer_rel_change,
        layer_frac_changed, step_rel_change, step_frac_changed are added.
        tensors: a glob of the tensor names to keep."""
        import json
        import types
        import numpy as np
        with self._use() as a:
            d = ctypes.c_void_p()
            self._check(lib.ulp_archive_dynamics(a, enc(run), enc(tensors) if tensors else None,
                                                 ctypes.byref(d)), run)
            try:
                if norms:
                    self._check(lib.ulp_dynamics_norms(a, d, None, None), run)
                buf, n = ctypes.c_void_p(), ctypes.c_size_t()
                self._check(lib.ulp_dynamics_json(d, 0, ctypes.byref(buf), ctypes.byref(n)), run)
                try:
                    js = json.loads(ctypes.string_at(buf, n.value).decode("utf-8"))
                finally:
                    _libc_free(buf)
            finally:
                lib.ulp_dynamics_free(d)
        out = types.SimpleNamespace(run=js["run"], summary=js["summary"], jump=js["jump"], layers=js["layers"])
        out.steps = np.array(js["steps"], dtype=np.int64)
        out.tensors = [t["name"] for t in js["tensors"]]
        out.files = [t["file"] for t in js["tensors"]]
        out.tensor_layer = np.array([t["layer"] for t in js["tensors"]], dtype=np.int64)
        out.elements = np.array([t["elements"] for t in js["tensors"]], dtype=np.int64)
        out.role = np.array([list(r) for r in js["role"]], dtype="<U1")

        def floats(v):
            return np.array([[np.nan if x is None else x for x in r] for r in v], dtype=np.float64)
        for k in ("stored_bytes", "ref_step", "chain_depth", "codec"):
            setattr(out, k, np.array(js[k], dtype=np.int64))
        out.update_bound = np.array(js["update_bound"], dtype=bool)
        for k in ("bits_per_weight", "update_bits_per_weight", "layer_bits_per_weight",
                  "layer_update_bits_per_weight", "layer_excess_bits"):
            setattr(out, k, floats(js[k]))
        out.step_stored_bytes = np.array(js["step_stored_bytes"], dtype=np.int64)
        for k in ("step_bits_per_weight", "step_update_bits_per_weight", "step_excess_bits"):
            setattr(out, k, floats(js[k])[0])
        if norms:
            for k in ("rel_change", "frac_changed", "layer_rel_change", "layer_frac_changed"):
                setattr(out, k, floats(js[k]))
            for k in ("step_rel_change", "step_frac_changed"):
                setattr(out, k, floats(js[k])[0])
            for k in ("changed", "median_ulps", "p99_ulps", "max_ulps", "exponent_moves"):
                setattr(out, k, np.array([[-1 if x is None else x for x in r] for r in js[k]], dtype=np.int64))
        return out

    def runs(self):
        """The run directories (paths; "" for steps at the archive's root),
        in path order."""
        seen = []
        for s in self.steps():
            if not seen or seen[-1] != s["run"]:
                seen.append(s["run"])
        return seen

    def latest(self, run=""):
        """Path of run's newest step (the child `latest` names on a mount)."""
        buf = ctypes.create_string_buffer(_lib.ULP_PATH_MAX + 1)
        brun = enc(run)
        with self._use() as a:
            self._check(lib.ulp_archive_latest(a, brun, buf, len(buf)), run)
        name = os.fsdecode(buf.value)
        return run + "/" + name if run else name

    def counters(self):
        """The decode cache's counters (ulp_archive_counters): a dict of
        chunks_decoded, deltas_decoded, cache_hits, cache_misses, cache_bytes,
        cache_recycled, max_walk."""
        c = _lib.Counters()
        with self._use() as a:
            lib.ulp_archive_counters(a, ctypes.byref(c))
        return {n: getattr(c, n) for n, _ in c._fields_}

    # ---- reading
    def open(self, path, buffering=BUFFER_SIZE):
        """A seekable binary file object over an archived file (read, readinto,
        seek, tell, a context manager) that decodes only what is read:
        torch.load(archive.open(p)) works. buffering=0 returns the raw
        ArchiveFile (its pread is thread-safe)."""
        enc(path)
        if self.closed:
            raise ValueError("archive %s is closed" % self.path)
        if path and self.stat(path).is_dir:
            raise IsADirectoryError(errno.EISDIR, "archive %s: %s: is a directory" % (self.path, path), path)
        raw = ArchiveFile(self, path)
        if buffering == 0:
            return raw
        return io.BufferedReader(raw, buffer_size=buffering)

    def read_bytes(self, path):
        """The whole file as bytes."""
        with self.open(path, buffering=0) as f:
            return f.readall()

    def tensor_names(self, path):
        """The tensor names of a safetensors file (data order)."""
        from . import _tensors
        return _tensors.names(self, path)

    def tensor(self, path, name, framework="np"):
        """One tensor of a safetensors file as a numpy array (framework="pt":
        a torch tensor), decoding only the chunks that hold its bytes. bf16
        comes as uint16 (the raw bits) in numpy, as torch.bfloat16 in torch;
        F8 types as uint8. Of a torch.save file: with framework="pt" the
        tensor at dotted path name ("state.0.exp_avg") of torch.load's result;
        with numpy, the flat storage that the first tensor called name uses
        (its bytes only are decoded)."""
        from . import _tensors
        return _tensors.tensor(self, path, name, framework)

    def load(self, path, framework="np", **torch_kwargs):
        """Every tensor of a file: for safetensors a dict name -> numpy array
        (framework="pt": torch tensors) as safetensors' load_file; for a
        torch.save file what torch.load returns (needs torch; torch_kwargs go
        to torch.load, map_location defaults to "cpu")."""
        from . import _tensors
        return _tensors.load(self, path, framework, torch_kwargs)


def _meta_of(st):
    return _lib.Meta(mode=st.st_mode & 0o7777, uid=st.st_uid, gid=st.st_gid,
                     mtime=_lib.Time(sec=st.st_mtime_ns // 1000000000, nsec=st.st_mtime_ns % 1000000000))


def _default_meta(mode=0o644):
    import time
    ns = time.time_ns()
    return _lib.Meta(mode=mode, uid=os.getuid(), gid=os.getgid(),
                     mtime=_lib.Time(sec=ns // 1000000000, nsec=ns % 1000000000))


class Writer(Archive):
    """An archive open for writing (ulpack.open_archive(path, mode="w") or
    ulpack.writer(path)): holds the archive's single-writer lock (the mount
    lock a read-write ulpackfs takes; a mount holding it refuses the writer
    with BlockingIOError, EBUSY... see open_archive). Each save commits one file
    atomically, then re-bases what it queued and gives back the space that
    frees (as a mount does when idle), so that a writer kept open for a whole
    training run stays near the archive's final size; close() re-bases and
    reclaims everything (ulp_archive_gc), then lets go of the lock."""

    def __init__(self, path, create=True, **opts):
        path = os.fspath(path)
        bpath = enc(path)
        # an archive in an object store (s3://BUCKET/PREFIX): its lock lies
        # in its local home (cache_dir), known once it is open, as ulpackfs
        # takes it; a directory's is taken before opening (recovery needs it)
        remote = "://" in path
        if create and (remote or not os.path.exists(os.path.join(path, "ulpack.db"))):
            err = ctypes.create_string_buffer(1024)
            rc = lib.ulp_archive_init(bpath, err, len(err))
            if rc < 0 and rc != -_lib.ULP_E_EXIST:
                raise _lib.error(rc, err.value.decode("utf-8", "replace"), path)
        self._lock_fd = -1
        self._wmu = threading.Lock()
        if not remote:
            self._lock(path, path)
        try:
            super().__init__(path, read_only=False, **opts)
            if remote:
                with self._use() as a:
                    home = lib.ulp_archive_dir(a).decode("utf-8", "surrogateescape")
                self._lock(home, path)
        except BaseException:
            if getattr(self, "_g", None) is not None:
                Archive._close(self, True)
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1
            raise

    def _lock(self, lockdir, path):
        """Takes the single-writer lock (mount.lock) in lockdir."""
        fd = ctypes.c_int(-1)
        owner = _lib.MountOwner()
        err = ctypes.create_string_buffer(1024)
        rc = lib.ulp_mount_lock(enc(lockdir), ctypes.byref(fd), ctypes.byref(owner), err, len(err))
        if rc == -_lib.ULP_E_BUSY:
            where = owner.mountpoint.decode("utf-8", "replace")
            if owner.mounted:
                msg = ("archive %s is mounted read-write on %s by ulpackfs pid %d: unmount it first "
                       "(fusermount3 -u %s) or write through the mount" % (path, where, owner.pid, where))
            elif owner.pid:
                msg = "archive %s is held by pid %d (a writer, or an unmounted ulpackfs finishing its queue)" % (
                    path, owner.pid)
            else:
                msg = "archive %s is held by another writer" % path
            raise BlockingIOError(errno.EBUSY, msg, path)
        if rc < 0:
            raise _lib.error(rc, err.value.decode("utf-8", "replace"), path)
        self._lock_fd = fd.value

    def save(self, path, data, mode=0o644):
        """Archives data (bytes-like, a file system path (str or os.PathLike)
        of a file to copy, or a binary file object) at path, replacing what
        was there atomically; safetensors and torch.save files are coded per
        tensor against the previous step of their series. Returns a dict of
        raw_bytes, stored_bytes, tensors, deltas, anchors, reused, ref_path."""
        bpath = enc(path)
        res = _lib.PutResult()
        with self._wmu, self._use() as a, _Source(data) as (fd, meta):
            m = meta if meta is not None else _default_meta(mode)
            self._mkparents(a, path)
            self._check(lib.ulp_archive_put(a, bpath, fd, ctypes.byref(m), ctypes.byref(res)), path)
            # a shared archive: on every host, and safe from a kill of this
            # process, once published (its next writer starts from the newest
            # generation); a no-op for an archive that is not shared
            self._check(lib.ulp_archive_publish(a), path)
            self._tidy(a, False)
        return {"raw_bytes": res.raw_bytes, "stored_bytes": res.stored_bytes, "tensors": res.tensors,
                "deltas": res.deltas, "anchors": res.anchors, "reused": res.reused,
                "ref_path": res.ref_path.decode("utf-8", "replace")}

    def _mkparents(self, a, path):
        """The parent directories of path, made where missing (a: the
        archive, in use)."""
        parts = path.split("/")[:-1]
        cur = ""
        for p in parts:
            cur = cur + "/" + p if cur else p
            st = _lib.Stat()
            if lib.ulp_archive_stat(a, enc(cur), ctypes.byref(st)) < 0:
                self._check(lib.ulp_archive_mkdir(a, enc(cur), ctypes.byref(_default_meta(0o755))), cur)

    def mkdir(self, path, mode=0o755):
        enc(path)
        with self._wmu, self._use() as a:
            self._mkparents(a, path + "/x")

    def _tidy(self, a, removed):
        """After a save or a removal (a: the archive, in use; _wmu held):
        re-codes what the index queued for re-basing (the step before a new
        one; with removed, steps coded against removed ones) and gives back
        the space nothing needs any more (ulp_archive_reclaim: dead packs
        removed, packs under half live rewritten), as a mount's idle pass
        does, rather than only at close."""
        self._check(lib.ulp_archive_rebase_pending(a, None, None, None))
        if removed:
            self._check(lib.ulp_archive_rebase_orphans(a, None, None, None))
        self._check(lib.ulp_archive_reclaim(a, None, None))

    def remove(self, path, recursive=False):
        """Removes a file, symlink or empty directory; with recursive=True a
        directory and everything under it too (as `ulpack rm -r`). The space
        it frees comes back at once (re-basing what was coded against it)."""
        bpath = enc(path)
        with self._wmu, self._use() as a:
            try:
                st = _lib.Stat()
                if recursive and lib.ulp_archive_stat(a, bpath, ctypes.byref(st)) == 0 and st.is_dir:
                    self._remove_tree(a, path.strip("/"))
                else:
                    self._check(lib.ulp_archive_remove(a, bpath), path)
            finally:
                self._tidy(a, True)

    def _remove_tree(self, a, path):
        names = []
        cb = _lib.READDIR_CB(lambda arg, name, st: names.append(name) or 0)
        self._check(lib.ulp_archive_readdir(a, enc(path), cb, None), path)
        for n in names:
            child = (path + "/" if path else "") + n.decode("utf-8", "surrogateescape")
            st = _lib.Stat()
            self._check(lib.ulp_archive_stat(a, enc(child), ctypes.byref(st)), child)
            if st.is_dir:
                self._remove_tree(a, child)
            else:
                self._check(lib.ulp_archive_remove(a, enc(child)), child)
        if path:
            self._check(lib.ulp_archive_remove(a, enc(path)), path)

    def rename(self, src, dst):
        """Renames a file, symlink or directory as rename(2) does (over an
        existing file, or a directory over an empty one; the parents of dst
        are made), without re-coding anything: the index changes, not the
        packs."""
        bsrc, bdst = enc(src), enc(dst)
        with self._wmu, self._use() as a:
            self._check(lib.ulp_archive_rename(a, bsrc, bdst), src)
            self._check(lib.ulp_archive_publish(a), dst)

    def save_dir(self, src_dir, prefix=""):
        """Archives every file under src_dir at prefix/... as `ulpack import`
        does: in the order that codes each step where the final layout of its
        series puts it (ulp_archive_expect: no re-coding afterwards), files
        pipelined (ulp_putq). Files already archived with the same size and
        mtime are skipped. Returns the number of files archived."""
        src_dir = os.fspath(src_dir)
        enc(src_dir)
        enc(prefix)
        prefix = prefix.strip("/")
        if not os.path.isdir(src_dir):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", src_dir)
        dirs, files, links = [], [], []
        for root, dnames, fnames in os.walk(src_dir):
            rel = os.path.relpath(root, src_dir)
            rel = "" if rel == "." else rel.replace(os.sep, "/")
            for n in dnames:
                full = os.path.join(root, n)
                dst = "/".join(x for x in (prefix, rel, n) if x)
                (links if os.path.islink(full) else dirs).append((dst, full))
            for n in fnames:
                full = os.path.join(root, n)
                dst = "/".join(x for x in (prefix, rel, n) if x)
                (links if os.path.islink(full) else files).append((dst, full))
        with self._wmu, self._use() as a:
            if prefix:
                self._mkparents(a, prefix + "/x")
            for dst, full in sorted(dirs):
                st = _lib.Stat()
                if lib.ulp_archive_stat(a, enc(dst), ctypes.byref(st)) < 0:
                    self._check(lib.ulp_archive_mkdir(a, enc(dst), ctypes.byref(_meta_of(os.lstat(full)))), dst)
            for dst, full in links:
                st = _lib.Stat()
                if lib.ulp_archive_stat(a, enc(dst), ctypes.byref(st)) == 0:
                    self._check(lib.ulp_archive_remove(a, enc(dst)), dst)
                self._check(lib.ulp_archive_symlink(a, enc(dst), enc(os.readlink(full)),
                                                    ctypes.byref(_meta_of(os.lstat(full)))), dst)
            n = len(files)
            paths = (ctypes.c_char_p * max(n, 1))(*[enc(d) for d, _ in files])
            rank = (ctypes.c_uint32 * max(n, 1))()
            self._check(lib.ulp_archive_expect(a, paths, n, rank), src_dir)
            order = sorted(range(n), key=lambda i: (rank[i], lib.ulp_parse_step(paths[i], None), files[i][0]))
            q = ctypes.c_void_p()
            self._check(lib.ulp_putq_new(a, ctypes.byref(q)))
            put = 0
            try:
                for i in order:
                    dst, full = files[i]
                    sb = os.stat(full)
                    st = _lib.Stat()
                    if (lib.ulp_archive_stat(a, enc(dst), ctypes.byref(st)) == 0 and not st.is_dir
                            and st.size == sb.st_size
                            and st.mtime.sec * 1000000000 + st.mtime.nsec == sb.st_mtime_ns):
                        continue
                    fd = os.open(full, os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        res = _lib.PutResult()
                        self._check(lib.ulp_putq_put(q, enc(dst), fd, ctypes.byref(_meta_of(sb)),
                                                     ctypes.byref(res)), dst)
                    finally:
                        os.close(fd)
                    put += 1
            finally:
                rc = lib.ulp_putq_free(q)
            self._check(rc, src_dir)
            self._check(lib.ulp_archive_expect(a, None, 0, None))
        return put

    def commit(self):
        """Re-bases and reclaims (ulp_archive_gc): what earlier saves left
        behind (steps put beside archived ones, replaced files) is re-coded
        and given back. close() calls it."""
        with self._wmu, self._use() as a:
            res = _lib.GcResult()
            self._check(lib.ulp_archive_gc(a, ctypes.byref(res)))
        return {n: getattr(res, n) for n, _ in res._fields_}

    def _close(self, wait, commit=True):
        try:
            if commit and not self.closed:
                self.commit()
        finally:
            super()._close(wait)
            if getattr(self, "_lock_fd", -1) >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1

    def __exit__(self, exc_type, *exc):
        # an error: nothing half-written is in the index; skip the gc
        self._close(True, commit=exc_type is None)


class _Source:
    """A file descriptor readable from offset 0 to EOF holding data (what
    ulp_archive_put takes), and the metadata of a source file (or None)."""

    def __init__(self, data):
        self.data = data
        self.fd = -1
        self.own = False

    def __enter__(self):
        d = self.data
        meta = None
        if isinstance(d, (str, os.PathLike)):
            self.fd = os.open(d, os.O_RDONLY | os.O_CLOEXEC)
            self.own = True
            sb = os.fstat(self.fd)
            if not _stat.S_ISREG(sb.st_mode):
                raise IsADirectoryError(errno.EISDIR, "not a regular file", os.fspath(d)) \
                    if _stat.S_ISDIR(sb.st_mode) else OSError(errno.EINVAL, "not a regular file", os.fspath(d))
            meta = _meta_of(sb)
            return self.fd, meta
        if isinstance(d, (bytes, bytearray, memoryview)):
            self.fd = _memfd()
            self.own = True
            mv = memoryview(d).cast("B")
            off = 0
            while off < len(mv):
                off += os.write(self.fd, mv[off:off + (64 << 20)])
            return self.fd, None
        if hasattr(d, "read"):
            # a file object is archived from its start, wherever its
            # position is (torch.save(obj, buf) leaves buf at its end), and
            # left at that position; one that cannot seek (a pipe) gives
            # what is left of it
            pos = None
            try:
                if d.seekable():
                    pos = d.tell()
            except (OSError, AttributeError, io.UnsupportedOperation, ValueError):
                pos = None
            fd = -1
            try:
                fd = d.fileno()
                sb = os.fstat(fd)
                if not _stat.S_ISREG(sb.st_mode) or pos is None:
                    fd = -1
            except (OSError, AttributeError, io.UnsupportedOperation, ValueError):
                fd = -1
            if fd >= 0:  # the library reads a regular file from offset 0
                if hasattr(d, "flush"):
                    d.flush()
                self.fd = fd
                return fd, None
            self.fd = _memfd()
            self.own = True
            try:
                if pos is not None:
                    d.seek(0)
                while True:
                    chunk = d.read(8 << 20)
                    if chunk is None:
                        raise BlockingIOError(errno.EAGAIN, "save: a non-blocking file object had no data")
                    if not chunk:
                        break
                    mv = memoryview(chunk)
                    off = 0
                    while off < len(mv):
                        off += os.write(self.fd, mv[off:])
            finally:
                if pos is not None:
                    d.seek(pos)
            return self.fd, None
        raise TypeError("save: data must be bytes, a path or a binary file object, not %s" % type(d).__name__)

    def __exit__(self, *exc):
        if self.own and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1


def _memfd():
    try:
        return os.memfd_create("ulpack-save", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        f = tempfile.TemporaryFile()
        fd = os.dup(f.fileno())
        f.close()
        return fd
