# SPDX-License-Identifier: MIT
"""Issue 34 (items 8, 9, 14): files outliving their archive, NUL bytes in
paths, and the errors of bad arguments and of files in the wrong format.
Whatever may crash runs in a child interpreter, so that a crash fails its
test instead of killing the test runner."""
import errno
import os
import subprocess
import sys
import textwrap

import pytest

import ulpack
from conftest import ulpack as cli

SYN = "run/checkpoint-%d/model.safetensors"
OPT = "trun/checkpoint-30/optimizer.pt"


def _child(code, archive_dir, tmp_path=None, timeout=120):
    """Runs code in a fresh interpreter with ar_dir, SYN, OPT (and tmp)
    defined; returns its stdout. Fails on a signal (a crash) or an error."""
    head = "import gc, io, os, sys, threading\nimport ulpack\nar_dir = %r\nSYN = %r\nOPT = %r\ntmp = %r\n" % (
        str(archive_dir), SYN, OPT, str(tmp_path) if tmp_path else None)
    p = subprocess.run([sys.executable, "-c", head + textwrap.dedent(code)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout, env=os.environ.copy())
    out, err = p.stdout.decode(), p.stderr.decode()
    assert p.returncode >= 0, "child killed by signal %d\nstdout:\n%s\nstderr:\n%s" % (-p.returncode, out, err)
    assert p.returncode == 0, "child exited %d\nstdout:\n%s\nstderr:\n%s" % (p.returncode, out, err)
    assert "Exception ignored" not in err and "Traceback" not in err, err
    return out


# ---- item 8: an open file keeps its archive alive, or raises ValueError

def test_read_after_archive_close_raises(archive_dir):
    out = _child("""
        ar = ulpack.open_archive(ar_dir)
        raw = ar.open(SYN % 100, buffering=0)
        buf = ar.open(SYN % 200)
        ref = ar.read_bytes(SYN % 100)
        assert raw.pread(16, 0) == ref[:16]
        ar.close()
        for what, fn in (("read", lambda: raw.read(4096)), ("pread", lambda: raw.pread(4096, 8)),
                         ("readinto", lambda: raw.readinto(bytearray(64))), ("readall", raw.readall),
                         ("buffered", lambda: buf.read(1 << 20)), ("seek", lambda: raw.seek(0)),
                         ("tell", raw.tell), ("readahead", lambda: raw.set_readahead(False))):
            for _ in range(3):
                try:
                    fn()
                except ValueError:
                    pass
                else:
                    print("no ValueError from", what)
        assert raw.closed and buf.closed
        raw.close()
        buf.close()
        print("done")
    """, archive_dir)
    assert out == "done\n", out


def test_writer_file_after_close_raises(archive_dir, tmp_path):
    out = _child("""
        w = ulpack.writer(os.path.join(tmp, "w"))
        w.save("x/a.bin", os.urandom(3 << 20))
        f = w.open("x/a.bin", buffering=0)
        assert len(f.pread(100, 0)) == 100
        w.close()
        try:
            f.pread(100, 1 << 20)
            print("no ValueError")
        except ValueError:
            pass
        print("done")
    """, archive_dir, tmp_path)
    assert out == "done\n", out


def test_file_keeps_collected_archive_alive(archive_dir):
    """Without a close, an archive no longer referenced stays open while a
    file of it is: its reads go on."""
    out = _child("""
        ar = ulpack.open_archive(ar_dir)
        ref = ar.read_bytes(SYN % 300)
        f = ar.open(SYN % 300)
        del ar
        gc.collect()
        assert f.read() == ref
        f.seek(1000)
        assert f.read(10) == ref[1000:1010]
        print("done")
    """, archive_dir)
    assert out == "done\n", out


def test_interpreter_exit_with_files_of_closed_archives(archive_dir):
    """Files left open at exit whose archive was closed, or collected in a
    cycle with them: the interpreter exits cleanly."""
    for variant in range(4):
        _child("""
            variant = %d
            keep = []
            for i in range(8):
                ar = ulpack.open_archive(ar_dir)
                raw = ar.open(SYN %% 100, buffering=0)
                raw.pread(8, 0)
                buf = ar.open(OPT)
                buf.read(100)
                if variant == 0:     # closed archive, its files left open at exit
                    ar.close()
                    keep += [raw, buf]
                elif variant == 1:   # archive and files in a cycle, collected now
                    cyc = [ar, raw, buf]
                    cyc.append(cyc)
                    if i %% 2:
                        cyc.reverse()
                elif variant == 2:   # the same cycle, left to the interpreter's exit
                    cyc = [buf, raw, ar]
                    cyc.append(cyc)
                    keep.append(cyc)
                else:                # files left open at exit, archive only referenced by them
                    keep += [buf, raw]
                del ar, raw, buf
                gc.collect()
            print("done")
        """ % variant, archive_dir)


def test_interpreter_exit_while_daemon_threads_read(archive_dir):
    """Daemon threads still reading at exit: the exit neither crashes nor
    waits for them."""
    _child("""
        import time
        ar = ulpack.open_archive(ar_dir)
        raws = [ar.open(SYN % s, buffering=0) for s in (100, 400)]
        bufs = [io.BufferedReader(r) for r in raws]  # closed at exit, their raw file in use

        def work(f):
            while True:
                f.pread(1 << 20, 0)
        for f in raws:
            threading.Thread(target=work, args=(f,), daemon=True).start()
        time.sleep(0.2)
    """, archive_dir, timeout=60)


def test_close_while_reading_in_threads(archive_dir):
    """Archive.close() from one thread while others read its files: reads
    either succeed or raise ValueError; nothing crashes."""
    out = _child("""
        for rnd in range(6):
            ar = ulpack.open_archive(ar_dir)
            files = [ar.open(SYN % s, buffering=0) for s in (100, 200, 300, 400)]
            size = files[0].size
            bad = []
            start = threading.Barrier(5)

            def work(f):
                start.wait()
                off = 0
                for _ in range(100000):
                    try:
                        f.pread(64 << 10, off)
                    except ValueError:
                        return
                    except Exception as e:
                        bad.append(repr(e))
                        return
                    off = (off + 123457) %% size
                bad.append("never closed")
            ts = [threading.Thread(target=work, args=(f,)) for f in files]
            for t in ts:
                t.start()
            start.wait()
            import time
            time.sleep(0.02 * rnd)
            ar.close()
            for t in ts:
                t.join()
            assert not bad, bad
        print("done")
    """.replace("%%", "%"), archive_dir)
    assert out == "done\n", out


# ---- item 9: a NUL byte in a path is refused, as os.open refuses it

def test_nul_in_paths_read(ar, archive_dir):
    p = SYN % 100 + "\0.safetensors"
    calls = [lambda: ar.open(p), lambda: ar.open(p, buffering=0), lambda: ar.read_bytes(p),
             lambda: ar.stat(p), lambda: ar.listdir("run\0/checkpoint-100"), lambda: ar.scandir("run\0x"),
             lambda: ar.files("run\0x"), lambda: ar.steps("run\0x"), lambda: ar.latest("run\0x"),
             lambda: ar.tensor_names(p), lambda: ar.tensor(p, "x"), lambda: ar.load(p),
             lambda: ar.open(os.fsencode(p)),
             lambda: ulpack.open_archive(str(archive_dir) + "\0/x"),
             lambda: ulpack.open_archive(archive_dir, cache_dir="/tmp\0x"),
             lambda: ulpack.open_archive("s3://bucket/pre\0fix")]
    for fn in calls:
        with pytest.raises(ValueError, match="null"):
            fn()
    assert not ar.exists(p)  # as os.path.exists: no such file
    assert ar.exists(SYN % 100)


def test_nul_in_paths_write(tmp_path, src):
    a = tmp_path / "a"
    with ulpack.writer(a) as w:
        w.save("keep/a.bin", b"a")
        for fn in (lambda: w.save("new/b.bin\0x", b"b"), lambda: w.save("ne\0w/b.bin", b"b"),
                   lambda: w.save("keep/a.bin\0.x", b"b"), lambda: w.remove("keep/a.bin\0.x"),
                   lambda: w.mkdir("d\0x"), lambda: w.save_dir(str(src / "run") + "\0x", "r"),
                   lambda: w.save_dir(src / "run" / "checkpoint-100", "r\0x"),
                   lambda: w.save("y", str(tmp_path / "f\0x"))):
            with pytest.raises(ValueError, match="null"):
                fn()
        assert w.listdir("") == ["keep"]
        assert w.read_bytes("keep/a.bin") == b"a"
    with pytest.raises(ValueError, match="null"):
        ulpack.writer(str(tmp_path / "b") + "\0x")
    assert not os.path.exists(tmp_path / "b")


# ---- item 14: bad offsets, closed files, files of the wrong format

def test_pread_offsets_as_os_pread(ar):
    with ar.open(SYN % 100, buffering=0) as f:
        for off in (-1, -(1 << 63)):
            with pytest.raises(OSError) as e:
                f.pread(10, off)
            assert e.value.errno == errno.EINVAL
        for off in (1 << 63, 1 << 64, (1 << 64) + 5):
            with pytest.raises(OverflowError):
                f.pread(10, off)
        with pytest.raises(OSError) as e:
            f.pread(-1, 0)
        assert e.value.errno == errno.EINVAL
        with pytest.raises(TypeError):
            f.pread(10, 1.5)
        assert f.pread(10, f.size) == b""
        assert f.pread(0, 0) == b""
        with pytest.raises(OverflowError):
            f.seek(1 << 64)
        with pytest.raises(OSError):
            f.seek(-1)


def test_closed_file_raises_like_io(ar):
    for buffering in (0, 4096):
        f = ar.open(SYN % 100, buffering=buffering)
        f.close()
        assert f.closed
        for fn in (lambda: f.seek(0), lambda: f.seek(10, os.SEEK_END), f.tell, lambda: f.read(1), f.readable,
                   f.seekable):
            with pytest.raises(ValueError):
                fn()
        f.close()  # again: nothing
    raw = ar.open(SYN % 100, buffering=0)
    raw.close()
    with pytest.raises(ValueError):
        raw.pread(1, 0)


def test_not_safetensors_is_format_error(ar, tmp_path):
    a = tmp_path / "a"
    with ulpack.writer(a) as w:
        w.save("notes.txt", b"just some notes, not a checkpoint\n" * 10)
        w.save("short.safetensors", b"abc")
        w.save("bad.safetensors", (20).to_bytes(8, "little") + b"{not json at all!!!}" + b"\0" * 8)
        w.save("list.safetensors", (2).to_bytes(8, "little") + b"[]")
        w.save("huge.safetensors", (1 << 40).to_bytes(8, "little") + b"{}")
        w.save("entry.safetensors", b'\x2b\0\0\0\0\0\0\0{"x":{"dtype":"F32","data_offsets":[0,99]}}')
    with ulpack.open_archive(a) as r:
        for p in ("notes.txt", "short.safetensors", "bad.safetensors", "list.safetensors", "huge.safetensors",
                  "entry.safetensors"):
            for fn in (lambda: r.tensor_names(p), lambda: r.tensor(p, "x"), lambda: r.load(p) if p.endswith(
                    ".safetensors") else r.tensor(p, "x", framework="np")):
                with pytest.raises(ulpack.FormatError) as e:
                    fn()
                assert isinstance(e.value, ValueError) and not isinstance(e.value, OSError)
                assert p in str(e.value) and str(a) in str(e.value)
    # a torch.save file has no safetensors header either
    with pytest.raises(ulpack.FormatError):
        ar.tensor_names(OPT)


def test_damaged_still_eio(tmp_path, src):
    """Damaged data stays OSError EIO (the reserved meaning)."""
    a = tmp_path / "a"
    cli("init", a)
    cli("import", a, src / "run" / "checkpoint-400", "--prefix", "run/checkpoint-400")
    pack = [p for p in os.listdir(a / "packs") if p.endswith(".pack")][0]
    p = a / "packs" / pack
    n = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.seek(n // 2)
        b = f.read(1)
        f.seek(n // 2)
        f.write(bytes([b[0] ^ 0x40]))
    with ulpack.open_archive(a) as r, pytest.raises(OSError) as e:
        r.load(SYN % 400)
    assert e.value.errno == errno.EIO
