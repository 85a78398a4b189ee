# SPDX-License-Identifier: MIT
"""Tensors of archived safetensors and torch.save files."""
import ctypes
import errno
import json
import struct

from . import _lib
from ._lib import lib

# safetensors dtype -> numpy dtype name; BF16 has no numpy type: its raw bits
# as uint16; the F8 types as uint8.
_NP = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "<u2", "I16": "<i2", "U32": "<u4", "I32": "<i4",
       "U64": "<u8", "I64": "<i8", "F16": "<f2", "BF16": "<u2", "F32": "<f4", "F64": "<f8",
       "F8_E4M3": "uint8", "F8_E5M2": "uint8"}
_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "U32": 4, "I32": 4, "U64": 8, "I64": 8,
         "F16": 2, "BF16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1}
_PT = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64",
       "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
       "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
# ulp_dtype (ulpack.h) -> safetensors name
_ULP_DT = ["UNKNOWN", "BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "BF16", "F32", "F64",
           "F8_E4M3", "F8_E5M2"]

_HEADER_MAX = 100 << 20


def _np():
    try:
        import numpy
    except ImportError as e:  # numpy is optional for the package, not for tensors
        raise ImportError("ulpack: tensors need numpy (apt-get install python3-numpy)") from e
    return numpy


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("ulpack: framework=\"pt\" and torch.save files need torch") from e
    return torch


def _damaged(ar, path, why):
    """Damaged data: what the archive returned is not what was saved."""
    return OSError(errno.EIO, "archive %s: %s: %s" % (ar.path, path, why), path)


def _format(ar, path, why):
    """A file read whole and right that is not of the format asked for."""
    return _lib.FormatError("archive %s: %s: %s" % (ar.path, path, why))


class _Header:
    def __init__(self, ar, f, path):
        head = f.pread(8, 0)
        if len(head) < 8:
            raise _format(ar, path, "not a safetensors file (shorter than 8 bytes)")
        n = struct.unpack("<Q", head)[0]
        if n > _HEADER_MAX or 8 + n > f.size:
            raise _format(ar, path, "not a safetensors file (header length %d)" % n)
        try:
            hdr = json.loads(f.pread(n, 8))
        except ValueError as e:  # UnicodeDecodeError too
            raise _format(ar, path, "not a safetensors file (header: %s)" % e) from None
        if not isinstance(hdr, dict):
            raise _format(ar, path, "not a safetensors file (its header is not a JSON object)")
        self.metadata = hdr.pop("__metadata__", None)
        self.data_offset = 8 + n
        self.tensors = hdr
        for name, t in hdr.items():
            try:
                b, e = t["data_offsets"]
                if t["dtype"] not in _SIZE or not (0 <= b <= e) or self.data_offset + e > f.size:
                    raise ValueError
            except (KeyError, TypeError, ValueError):
                raise _format(ar, path, "safetensors header: bad entry %r" % name) from None

    def names(self):
        return sorted(self.tensors, key=lambda k: self.tensors[k]["data_offsets"][0])


def _kind(ar, path):
    st = ar.stat(path)
    if st.is_dir:
        raise IsADirectoryError(errno.EISDIR, "archive %s: %s: is a directory" % (ar.path, path), path)
    return st.kind


def names(ar, path):
    with ar.open(path, buffering=0) as f:
        f.set_readahead(False)
        return _Header(ar, f, path).names()


def _array(np, buf, t):
    arr = np.frombuffer(buf, dtype=np.dtype(_NP[t["dtype"]]))
    return arr.reshape(t["shape"])


def _to_torch(arr, dt):
    torch = _torch()
    if dt == "U16":  # no such torch type before 2.3: widened, as values
        return torch.from_numpy(arr.astype("int32"))
    if dt == "U32":
        return torch.from_numpy(arr.astype("int64"))
    if dt == "U64":
        raise TypeError("U64 tensors have no torch dtype: use framework=\"np\"")
    if dt == "BF16":  # the raw bits, reinterpreted
        return torch.from_numpy(arr.view(arr.dtype.str.replace("u", "i"))).view(torch.bfloat16)
    if dt in ("F8_E4M3", "F8_E5M2"):
        return torch.from_numpy(arr).view(getattr(torch, _PT[dt]))
    return torch.from_numpy(arr)


def _st_tensor(ar, f, path, name, framework):
    np = _np()
    h = _Header(ar, f, path)
    t = h.tensors.get(name)
    if t is None:
        raise KeyError("archive %s: %s: no tensor %r" % (ar.path, path, name))
    b, e = t["data_offsets"]
    buf = bytearray(e - b)
    if f._pread_into(buf, h.data_offset + b) != len(buf):
        raise _damaged(ar, path, "tensor %r: short read" % name)
    arr = _array(np, buf, t)
    return _to_torch(arr, t["dtype"]) if framework == "pt" else arr


def _tz_storages(ar, f, path):
    """The storages of a torch.save file (ulp_tz_parse over the archived
    file: its zip directory and data.pkl only)."""
    err = ctypes.create_string_buffer(512)
    failed = []

    def rd(_arg, buf, n, off):
        try:
            got = f._pread_into((ctypes.c_char * n).from_address(buf), off)
        except Exception as e:  # noqa: BLE001 - raised again below
            failed.append(e)
            return -2  # ULP_E_IO
        if got != n:
            failed.append(_damaged(ar, path, "short read"))
            return -2
        return 0
    cb = _lib.TZ_READ_FN(rd)
    z = ctypes.c_void_p()
    rc = lib.ulp_tz_parse(cb, None, f.size, ctypes.byref(z), err, len(err))
    if rc < 0:
        if failed:  # the read's own error (damage, a closed file)
            raise failed[0]
        why = err.value.decode("utf-8", "backslashreplace") or _lib.strerror(rc)
        if -rc in (_lib.ULP_E_CORRUPT, _lib.ULP_E_VERSION, _lib.ULP_E_UNSUPPORTED, _lib.ULP_E_INVAL):
            raise _format(ar, path, "not a torch.save file the library reads (%s)" % why)
        raise _lib.error(rc, "archive %s: %s: %s" % (ar.path, path, why), path)
    try:
        out = {}
        for i in range(lib.ulp_tz_count(z)):
            s = lib.ulp_tz_at(z, i).contents
            out[s.name.decode("utf-8", "replace")] = (_ULP_DT[s.dtype], s.offset, s.length)
        return out
    finally:
        lib.ulp_tz_free(z)


def _dotted(obj, name):
    for part in name.split("."):
        if isinstance(obj, dict):
            key = part if part in obj else (int(part) if part.lstrip("-").isdigit() and int(part) in obj else part)
            obj = obj[key]
        elif isinstance(obj, (list, tuple)):
            obj = obj[int(part)]
        else:
            obj = getattr(obj, part)
    return obj


def tensor(ar, path, name, framework):
    if framework not in ("np", "pt"):
        raise ValueError("framework must be \"np\" or \"pt\", not %r" % (framework,))
    kind = _kind(ar, path)
    with ar.open(path, buffering=0) as f:
        f.set_readahead(False)  # the header, then one range: nothing else decoded
        if kind == "torch":
            if framework == "pt":
                torch = _torch()
                with ar.open(path) as bf:
                    obj = torch.load(bf, map_location="cpu")
                try:
                    return _dotted(obj, name)
                except (KeyError, IndexError, AttributeError, ValueError):
                    raise KeyError("archive %s: %s: no tensor %r" % (ar.path, path, name)) from None
            np = _np()
            st = _tz_storages(ar, f, path).get(name)
            if st is None:
                raise KeyError("archive %s: %s: no storage of a tensor %r" % (ar.path, path, name))
            dt, off, length = st
            buf = bytearray(length)
            if f._pread_into(buf, off) != length:
                raise _damaged(ar, path, "tensor %r: short read" % name)
            return np.frombuffer(buf, dtype=np.dtype(_NP[dt]))
        return _st_tensor(ar, f, path, name, framework)


def load(ar, path, framework, torch_kwargs):
    if framework not in ("np", "pt"):
        raise ValueError("framework must be \"np\" or \"pt\", not %r" % (framework,))
    kind = _kind(ar, path)
    if kind == "torch" or (kind == "opaque" and not path.endswith(".safetensors")):
        torch = _torch()
        torch_kwargs.setdefault("map_location", "cpu")
        with ar.open(path) as f:
            return torch.load(f, **torch_kwargs)
    np = _np()
    with ar.open(path, buffering=0) as f:
        h = _Header(ar, f, path)
        # one read of the data section: the library decodes its chunks on all threads
        buf = bytearray(f.size - h.data_offset)
        if f._pread_into(buf, h.data_offset) != len(buf):
            raise _damaged(ar, path, "short read")
    out = {}
    mv = memoryview(buf)
    for name in h.names():
        t = h.tensors[name]
        b, e = t["data_offsets"]
        arr = _array(np, mv[b:e], t)
        out[name] = _to_torch(arr, t["dtype"]) if framework == "pt" else arr
    return out
