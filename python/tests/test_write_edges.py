# SPDX-License-Identifier: MIT
"""The writer's sharp edges (issue 40 item 3): a file object not at its
start, remove(recursive=True), space given back while the writer stays
open."""
import errno
import io
import os

import pytest

import ulpack
from conftest import ulpack as cli


def _disk(a):
    n = 0
    for root, _, files in os.walk(a):
        for f in files:
            try:
                n += os.lstat(os.path.join(root, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return n


def test_save_fileobj_not_at_start(tmp_path, src):
    """torch.save(obj, buf) leaves buf at its end: save(path, buf) archives
    the whole buffer, not the 0 bytes after the position; a real file read
    halfway is archived whole too, and the position is left as it was."""
    a = tmp_path / "a"
    f = src / "run" / "checkpoint-100" / "model.safetensors"
    data = f.read_bytes()
    buf = io.BytesIO()
    buf.write(data)  # at the end now
    with ulpack.writer(a) as w:
        r = w.save("r/buf.safetensors", buf)
        assert r["raw_bytes"] == len(data)
        assert buf.tell() == len(data)
        with open(f, "rb") as fo:
            fo.read(1000)
            w.save("r/half.safetensors", fo)
            assert fo.tell() == 1000
        # a stream that cannot seek gives what is left of it
        rfd, wfd = os.pipe()
        os.write(wfd, b"abcdef")
        os.close(wfd)
        with os.fdopen(rfd, "rb", buffering=0) as pipe:
            assert pipe.read(2) == b"ab"
            w.save("r/pipe", pipe)
    with ulpack.open_archive(a) as ar:
        assert ar.read_bytes("r/buf.safetensors") == data
        assert ar.read_bytes("r/half.safetensors") == data
        assert ar.read_bytes("r/pipe") == b"cdef"


def test_remove_recursive(tmp_path):
    a = tmp_path / "a"
    with ulpack.writer(a) as w:
        w.save("d/x", b"x")
        w.save("d/sub/y", b"y" * 100)
        w.save("keep", b"k")
        with pytest.raises(OSError) as e:
            w.remove("d")
        assert e.value.errno == errno.ENOTEMPTY
        w.remove("d", recursive=True)
        with pytest.raises(FileNotFoundError):
            w.remove("d", recursive=True)
        w.remove("keep", recursive=True)  # a file: removed as without it
    with ulpack.open_archive(a) as ar:
        assert ar.listdir("") == []


def test_space_given_back_while_open(tmp_path):
    """Ten steps saved one by one (each re-codes the one before), then one
    path saved over ten times: the archive stays near the size it has
    after close(), not several times it (space given back as it goes)."""
    run = tmp_path / "run"
    cli("synth", run, "--steps", "10", "--dim", "256")
    steps = sorted(os.listdir(run), key=lambda n: int(n.split("-")[1]))
    for name, dst in (("steps", "r/%s/model.safetensors"), ("overwrite", "latest/model.safetensors")):
        a = tmp_path / name
        w = ulpack.writer(a)
        try:
            for s in steps:
                w.save(dst.replace("%s", s), str(run / s / "model.safetensors"))
            open_bytes = _disk(a)
        finally:
            w.close()
        closed_bytes = _disk(a)
        assert open_bytes <= 1.2 * closed_bytes, (name, open_bytes, closed_bytes)


def test_writer_s3(tmp_path, src, monkeypatch):
    """A writer on an s3:// archive (the emulator, tests/unit/s3mock_serve):
    its lock lies in the local home, not at the URL (once 'OSError EIO
    .../mount.lock'); what it saves reads back, from a reader too, and a
    second writer on the same home is refused."""
    import subprocess
    from conftest import ULPACK
    mock = os.path.join(os.path.dirname(ULPACK), "tests", "unit", "s3mock_serve")
    if not os.access(mock, os.X_OK):
        pytest.skip("no %s (make check builds it; configure --disable-s3 has none)" % mock)
    p = subprocess.Popen([mock], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        ep = p.stdout.readline().decode().strip()
        assert ep.startswith("http://127.0.0.1:"), ep
        for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE",
                  "AWS_DEFAULT_REGION"):
            monkeypatch.delenv(k, raising=False)
        for k, v in (("AWS_ENDPOINT_URL", ep), ("AWS_ACCESS_KEY_ID", "testkey"),
                     ("AWS_SECRET_ACCESS_KEY", "SECRETSECRET"), ("AWS_REGION", "us-east-1"),
                     ("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none")),
                     ("AWS_CONFIG_FILE", str(tmp_path / "none")), ("ULPACK_CACHE_DIR", str(tmp_path / "cache"))):
            monkeypatch.setenv(k, v)
        url = "s3://ckpt/run"
        f1 = src / "run" / "checkpoint-100" / "model.safetensors"
        f2 = src / "run" / "checkpoint-200" / "model.safetensors"
        with ulpack.writer(url) as w:
            w.save("r/checkpoint-100/model.safetensors", str(f1))
            with pytest.raises(OSError) as e:  # the archive's lease
                ulpack.writer(url)
            assert e.value.errno == errno.EBUSY
            w.save("r/checkpoint-200/model.safetensors", f2.read_bytes())
        with ulpack.open_archive(url, cache_dir=tmp_path / "rcache") as ar:
            assert ar.read_bytes("r/checkpoint-100/model.safetensors") == f1.read_bytes()
            assert ar.read_bytes("r/checkpoint-200/model.safetensors") == f2.read_bytes()
        with ulpack.writer(url) as w:  # the lock was let go
            w.remove("r", recursive=True)
    finally:
        p.stdin.close()
        p.kill()
        p.wait()
