# SPDX-License-Identifier: MIT
"""ctypes bindings of libulpack.so: the structures and functions of ulpack.h
that the package uses, and the mapping of ULP_E_* codes to Python errors.

ctypes rather than cffi: it ships with Python (nothing to install or
compile, so `pip install` works offline and the package is pure Python), and
every CDLL call releases the GIL, so that threads read one archive in
parallel. The structures below mirror ulpack.h field for field.
"""
import ctypes
import ctypes.util
import errno
import os

from . import _libpath

c_u8, c_u32, c_u64, c_i64 = ctypes.c_uint8, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64
c_int, c_uint, c_char_p, c_void_p, c_size_t = ctypes.c_int, ctypes.c_uint, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t

ULP_E_CORRUPT = 4
ULP_E_VERSION = 6
ULP_E_INVAL = 7
ULP_E_NOENT = 8
ULP_E_EXIST = 9
ULP_E_BUSY = 10
ULP_E_OVERFLOW = 11
ULP_E_UNSUPPORTED = 12
ULP_PATH_MAX = 4095


class Time(ctypes.Structure):
    _fields_ = [("sec", c_i64), ("nsec", c_u32)]


class Stat(ctypes.Structure):
    _fields_ = [("is_dir", c_int), ("is_symlink", c_int), ("size", c_u64), ("mode", c_u32),
                ("uid", c_u32), ("gid", c_u32), ("mtime", Time), ("sha256", c_u8 * 32),
                ("stored_bytes", c_u64), ("step", c_i64), ("chain_depth", c_uint),
                ("anchor", c_int), ("kind", c_int)]


class ArchiveOpts(ctypes.Structure):
    _fields_ = [("cache_size", c_u64), ("max_chain", c_uint), ("threads", c_int), ("read_only", c_int),
                ("poll_ms", c_uint), ("lease_ms", c_uint), ("grace_s", c_uint), ("contribute", c_int),
                ("cache_dir", ctypes.c_char_p), ("pack_cache", c_u64), ("file_table", c_int)]


class Counters(ctypes.Structure):
    _fields_ = [(n, c_u64) for n in ("chunks_decoded", "deltas_decoded", "cache_hits", "cache_misses",
                                     "cache_bytes", "cache_recycled", "max_walk")]


class StepInfo(ctypes.Structure):
    _fields_ = [("run", c_char_p), ("dir", c_char_p), ("step", c_i64), ("files", c_u64),
                ("raw_bytes", c_u64), ("stored_bytes", c_u64), ("chain_depth", c_uint), ("is_file", c_int)]


class Meta(ctypes.Structure):
    _fields_ = [("mode", c_u32), ("uid", c_u32), ("gid", c_u32), ("mtime", Time)]


class PutResult(ctypes.Structure):
    _fields_ = [("raw_bytes", c_u64), ("stored_bytes", c_u64), ("tensors", c_uint), ("deltas", c_uint),
                ("anchors", c_uint), ("reused", c_uint), ("skipped", c_int), ("ref_path", ctypes.c_char * 512)]


class GcResult(ctypes.Structure):
    _fields_ = [(n, c_u64) for n in ("blobs_removed", "packs_removed", "packs_rewritten", "bytes_reclaimed",
                                     "blobs_rebased")]


class MountOwner(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_long), ("mountpoint", ctypes.c_char * (ULP_PATH_MAX + 1)),
                ("alive", c_int), ("mounted", c_int)]


class TzStorage(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_int), ("offset", c_u64), ("length", c_u64)]


READDIR_CB = ctypes.CFUNCTYPE(c_int, c_void_p, c_char_p, ctypes.POINTER(Stat))
STEPS_CB = ctypes.CFUNCTYPE(c_int, c_void_p, ctypes.POINTER(StepInfo))
TZ_READ_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t, c_u64)

_P = ctypes.POINTER
_PROTOS = {
    "ulp_strerror": (c_char_p, [c_int]),
    "ulp_to_errno": (c_int, [c_int]),
    "ulp_archive_open": (c_int, [c_char_p, _P(ArchiveOpts), _P(c_void_p), ctypes.c_char_p, c_size_t]),
    "ulp_archive_init": (c_int, [c_char_p, ctypes.c_char_p, c_size_t]),
    "ulp_archive_close": (None, [c_void_p]),
    "ulp_archive_errmsg": (c_char_p, [c_void_p]),
    "ulp_archive_dir": (c_char_p, [c_void_p]),
    "ulp_archive_stat": (c_int, [c_void_p, c_char_p, _P(Stat)]),
    "ulp_archive_readdir": (c_int, [c_void_p, c_char_p, READDIR_CB, c_void_p]),
    "ulp_archive_readlink": (c_int, [c_void_p, c_char_p, ctypes.c_char_p, c_size_t]),
    "ulp_archive_steps": (c_int, [c_void_p, c_char_p, STEPS_CB, c_void_p]),
    "ulp_archive_latest": (c_int, [c_void_p, c_char_p, ctypes.c_char_p, c_size_t]),
    "ulp_archive_counters": (None, [c_void_p, _P(Counters)]),
    "ulp_file_open": (c_int, [c_void_p, c_char_p, _P(c_void_p)]),
    "ulp_file_pread": (c_i64, [c_void_p, c_void_p, c_size_t, c_u64]),
    "ulp_file_get_stat": (_P(Stat), [c_void_p]),
    "ulp_file_set_readahead": (None, [c_void_p, c_int]),
    "ulp_file_close": (None, [c_void_p]),
    "ulp_archive_put": (c_int, [c_void_p, c_char_p, c_int, _P(Meta), _P(PutResult)]),
    "ulp_archive_publish": (c_int, [c_void_p]),
    "ulp_archive_expect": (c_int, [c_void_p, _P(c_char_p), c_size_t, _P(c_u32)]),
    "ulp_putq_new": (c_int, [c_void_p, _P(c_void_p)]),
    "ulp_putq_put": (c_int, [c_void_p, c_char_p, c_int, _P(Meta), _P(PutResult)]),
    "ulp_putq_flush": (c_int, [c_void_p]),
    "ulp_putq_free": (c_int, [c_void_p]),
    "ulp_archive_mkdir": (c_int, [c_void_p, c_char_p, _P(Meta)]),
    "ulp_archive_symlink": (c_int, [c_void_p, c_char_p, c_char_p, _P(Meta)]),
    "ulp_archive_remove": (c_int, [c_void_p, c_char_p]),
    "ulp_archive_rename": (c_int, [c_void_p, c_char_p, c_char_p]),
    "ulp_archive_gc": (c_int, [c_void_p, _P(GcResult)]),
    # progress callbacks and results passed as NULL (c_void_p)
    "ulp_archive_rebase_pending": (c_int, [c_void_p, c_void_p, c_void_p, c_void_p]),
    "ulp_archive_rebase_orphans": (c_int, [c_void_p, c_void_p, c_void_p, c_void_p]),
    "ulp_archive_reclaim": (c_int, [c_void_p, c_void_p, _P(GcResult)]),
    "ulp_mount_lock": (c_int, [c_char_p, _P(c_int), _P(MountOwner), ctypes.c_char_p, c_size_t]),
    "ulp_name_step": (c_i64, [c_char_p]),
    "ulp_name_step_file": (c_i64, [c_char_p]),
    "ulp_parse_step": (c_i64, [c_char_p, _P(c_void_p)]),
    "ulp_tz_parse": (c_int, [TZ_READ_FN, c_void_p, c_u64, _P(c_void_p), ctypes.c_char_p, c_size_t]),
    "ulp_tz_count": (c_size_t, [c_void_p]),
    "ulp_tz_at": (_P(TzStorage), [c_void_p, c_size_t]),
    "ulp_tz_free": (None, [c_void_p]),
    "ulp_dtype_name": (c_char_p, [c_int]),
    "ulp_archive_dynamics": (c_int, [c_void_p, c_char_p, c_char_p, _P(c_void_p)]),
    "ulp_dynamics_norms": (c_int, [c_void_p, c_void_p, c_void_p, c_void_p]),
    "ulp_dynamics_json": (c_int, [c_void_p, c_int, _P(c_void_p), _P(c_size_t)]),
    "ulp_dynamics_free": (None, [c_void_p]),
}


def _candidates():
    env = os.environ.get("ULPACK_LIB")
    if env:
        return [env]  # explicit: no fallback that could hide a wrong setting
    c = []
    if _libpath.LIBPATH:
        c.append(_libpath.LIBPATH)
    found = ctypes.util.find_library("ulpack")
    if found:
        c.append(found)
    c.append("libulpack.so.0")
    return c


def _load():
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append("%s: %s" % (path, e))
            continue
        for name, (res, args) in _PROTOS.items():
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        lib.path = path
        return lib
    raise ImportError("ulpack: cannot load libulpack.so (set ULPACK_LIB to its path): " + "; ".join(errors))


lib = _load()


class FormatError(ValueError):
    """A file that is not of the format the call reads: tensor_names(),
    tensor() or load() of a file that is not safetensors (or torch.save),
    or whose header is malformed. The archive returned the file's bytes as
    they were saved: nothing is damaged (damage is OSError EIO)."""


def enc(path):
    """A path inside an archive, or a file system path, as bytes. A NUL byte
    in it raises ValueError, as os.open does: the C string would end there
    and name another file."""
    b = os.fsencode(path)
    if b"\0" in b:
        raise ValueError("embedded null byte")
    return b


def strerror(rc):
    return lib.ulp_strerror(rc).decode("utf-8", "replace")


def error(rc, msg, filename=None):
    """The Python exception for a negative ULP_E_* code: OSError with the
    code's errno, which Python turns into FileNotFoundError (ENOENT),
    PermissionError (EACCES, EPERM), IsADirectoryError (EISDIR), ...;
    damaged data (CORRUPT, CHECKSUM) is EIO."""
    err = lib.ulp_to_errno(rc)
    if err == errno.EIO and os.strerror(errno.EACCES) in msg:  # IO from a refused open(2)
        err = errno.EACCES
    if filename is None:
        return OSError(err, msg)
    return OSError(err, msg, filename)
