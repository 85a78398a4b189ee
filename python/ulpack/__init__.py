# SPDX-License-Identifier: MIT
"""ulpack: read and write ulpack checkpoint archives from Python, without a
mount (no FUSE needed), over libulpack.so.

    import ulpack
    ar = ulpack.open_archive("/data/ckpt.ulp")
    ar.steps("run1")                       # as `ulpack steps --json`
    with ar.open("run1/checkpoint-100/optimizer.pt") as f:
        state = torch.load(f)              # decodes only what torch reads
    w = ar.tensor("run1/checkpoint-100/model.safetensors", "lm_head.weight")
    sd = ar.load("run1/checkpoint-100/model.safetensors", framework="pt")

    with ulpack.open_archive("/data/ckpt.ulp", mode="w") as w:
        w.save("run1/checkpoint-200/model.safetensors", data)  # bytes, path, file
        w.save_dir("out/checkpoint-300", prefix="run1/checkpoint-300")

    import ulpack.fsspec                   # fsspec's protocol "ulpack" (needs fsspec)
    fsspec.open("ulpack:///data/ckpt.ulp//run1/checkpoint-100/optimizer.pt")

Errors are OSError subclasses: FileNotFoundError, PermissionError,
IsADirectoryError, and OSError with errno EIO for damaged data; messages
name the archive and the file. tensor_names(), tensor() and load() of a
file that is not safetensors (or torch.save) raise ulpack.FormatError, a
ValueError. A path with a NUL byte raises ValueError, as os.open. An archive
object is thread-safe; a file open on it keeps it open, and after
archive.close() reading the file raises ValueError.

The shared library is found through the environment variable ULPACK_LIB,
then where `make install` put it, then ctypes.util.find_library("ulpack").
"""
from ._archive import Archive, ArchiveFile, StatResult, Writer
from . import _lib
from ._lib import FormatError

__all__ = ["open_archive", "writer", "Archive", "ArchiveFile", "StatResult", "Writer", "FormatError",
           "library_path"]
__version__ = "0.1.0"

library_path = _lib.lib.path


def open_archive(path, mode="r", cache_size=0, threads=0, max_chain=0, cache_dir=None, pack_cache=0):
    """Opens the archive in directory path, or read-only in an S3 bucket
    ("s3://BUCKET/PREFIX": credentials from the AWS environment and files;
    cache_dir: this host's local home, pack_cache: its bound in bytes, as
    ulpackfs -o cache_dir,pack_cache). mode "r" (read-only, the
    default) returns an Archive; "w" returns a Writer (the archive is created
    when missing): it takes the archive's single-writer lock, refused with
    BlockingIOError (EBUSY) while a read-write mount or another writer holds
    it. cache_size: decode cache bytes (0: the library's default); threads:
    decode threads (0: one per CPU)."""
    if mode == "r":
        return Archive(path, read_only=True, cache_size=cache_size, threads=threads, max_chain=max_chain,
                       cache_dir=cache_dir, pack_cache=pack_cache)
    if mode in ("w", "a", "r+"):
        return Writer(path, cache_size=cache_size, threads=threads, max_chain=max_chain)
    raise ValueError("mode must be \"r\" or \"w\", not %r" % (mode,))


def writer(path, **opts):
    """open_archive(path, mode="w")."""
    return open_archive(path, mode="w", **opts)
