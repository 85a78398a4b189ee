# SPDX-License-Identifier: MIT
"""Writing archives through the package: save, save_dir, the lock, gc."""
import io
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

import ulpack
from conftest import ULPACK, have_torch, ulpack as cli


def _space(a):
    return json.loads(cli("stat", a, "--json"))["space"]


def test_save_bytes_path_fileobj(tmp_path, src):
    a = tmp_path / "a"
    f1 = src / "run" / "checkpoint-100" / "model.safetensors"
    f2 = src / "run" / "checkpoint-200" / "model.safetensors"
    with ulpack.open_archive(a, mode="w") as w:
        r = w.save("r/checkpoint-100/model.safetensors", f1.read_bytes())
        assert r["raw_bytes"] == f1.stat().st_size and r["tensors"] > 0
        w.save("r/checkpoint-200/model.safetensors", str(f2))
        with open(f2, "rb") as fo:
            w.save("copy/b.safetensors", fo)
        w.save("copy/c.bin", io.BytesIO(b"hello" * 1000))
        w.save("copy/empty", b"")
    with ulpack.open_archive(a) as ar:
        assert ar.read_bytes("r/checkpoint-100/model.safetensors") == f1.read_bytes()
        assert ar.read_bytes("r/checkpoint-200/model.safetensors") == f2.read_bytes()
        assert ar.read_bytes("copy/b.safetensors") == f2.read_bytes()
        assert ar.read_bytes("copy/c.bin") == b"hello" * 1000
        assert ar.read_bytes("copy/empty") == b""
        assert ar.stat("r/checkpoint-200/model.safetensors").mtime_ns == f2.stat().st_mtime_ns
    assert "DAMAGED" not in cli("verify", a).decode()
    sp = _space(a)
    assert sp["pending_recodes"] == 0 and sp["dead_packs"] == 0


def test_save_dir_as_import(tmp_path, src):
    """save_dir stores what `ulpack import` stores: the same steps, bytes
    and stored sizes, and leaves no garbage."""
    a, b = tmp_path / "a", tmp_path / "b"
    with ulpack.writer(a) as w:
        assert w.save_dir(src / "run", "run") == 4
        assert w.save_dir(src / "run", "run") == 0  # unchanged: skipped
    cli("init", b)
    cli("import", b, src / "run", "--prefix", "run")
    assert json.loads(cli("steps", a, "--json")) == json.loads(cli("steps", b, "--json"))
    with ulpack.open_archive(a) as ar:
        for s in (100, 200, 300, 400):
            p = "run/checkpoint-%d/model.safetensors" % s
            assert ar.read_bytes(p) == (src / "run" / ("checkpoint-%d" % s) / "model.safetensors").read_bytes()
    sp = _space(a)
    assert sp["pending_recodes"] == 0 and sp["dead_packs"] == 0 and sp["sparse_packs"] == 0


def test_steps_out_of_order_leave_no_garbage(tmp_path, src):
    a = tmp_path / "a"
    with ulpack.writer(a) as w:
        for s in (300, 100, 400, 200):
            w.save("run/checkpoint-%d/model.safetensors" % s,
                   src / "run" / ("checkpoint-%d" % s) / "model.safetensors")
    sp = _space(a)
    assert sp["pending_recodes"] == 0 and sp["dead_packs"] == 0 and sp["sparse_packs"] == 0, sp
    assert "DAMAGED" not in cli("verify", a).decode()


def test_one_writer(tmp_path):
    a = tmp_path / "a"
    with ulpack.writer(a) as w:
        w.save("x", b"1")
        with pytest.raises(BlockingIOError) as e:
            ulpack.writer(a)
        assert str(a) in str(e.value)
        with ulpack.open_archive(a) as r:  # readers are welcome
            assert r.read_bytes("x") == b"1"
    with ulpack.writer(a) as w:  # the lock went with the first
        w.save("y", b"2")


def _can_mount():
    return (os.path.exists("/dev/fuse") and shutil.which("fusermount3")
            and os.path.exists(os.environ.get("ULPACKFS", "")))


@pytest.mark.skipif(not _can_mount(), reason="no /dev/fuse, fusermount3 or ULPACKFS")
def test_refused_while_mounted(tmp_path):
    a, m = tmp_path / "a", tmp_path / "m"
    cli("init", a)
    m.mkdir()
    subprocess.run([os.environ["ULPACKFS"], str(a), str(m)], check=True)
    try:
        for _ in range(50):
            if os.path.ismount(m):
                break
            time.sleep(0.1)
        with pytest.raises(BlockingIOError) as e:
            ulpack.open_archive(a, mode="w")
        assert str(m) in str(e.value) and "mounted read-write" in str(e.value)
    finally:
        subprocess.run(["fusermount3", "-u", str(m)], check=False)
    for _ in range(100):  # the daemon lets go when it exits
        try:
            with ulpack.writer(a) as w:
                w.save("z", b"3")
            break
        except BlockingIOError:
            time.sleep(0.1)
    else:
        pytest.fail("writer still refused after the unmount")


def test_save_errors(tmp_path):
    with ulpack.writer(tmp_path / "a") as w:
        with pytest.raises(FileNotFoundError):
            w.save("x", str(tmp_path / "missing"))
        with pytest.raises(TypeError):
            w.save("x", 12)
        with pytest.raises(OSError):
            w.save("../escape", b"x")


def test_rename(tmp_path, src):
    """Writer.rename moves in the index (a file over another, a directory
    with what is under it), nothing re-coded; the step follows the name."""
    a = tmp_path / "a"
    f1 = src / "run" / "checkpoint-100" / "model.safetensors"
    with ulpack.writer(a) as w:
        w.save("r/checkpoint-100/model.safetensors.tmp", str(f1))
        stored = w.stat("r/checkpoint-100/model.safetensors.tmp").stored_bytes
        w.save("r/checkpoint-100/model.safetensors", b"old")
        w.rename("r/checkpoint-100/model.safetensors.tmp", "r/checkpoint-100/model.safetensors")
        assert not w.exists("r/checkpoint-100/model.safetensors.tmp")
        w.rename("r/checkpoint-100", "r/checkpoint-300")
        st = w.stat("r/checkpoint-300/model.safetensors")
        assert st.stored_bytes == stored and st.step == 300 and st.kind == "safetensors"
        with pytest.raises(FileNotFoundError):
            w.rename("r/nope", "r/x")
    with ulpack.open_archive(a) as ar:
        assert ar.listdir("r") == ["checkpoint-300"]
        assert ar.read_bytes("r/checkpoint-300/model.safetensors") == f1.read_bytes()
    assert "DAMAGED" not in cli("verify", a).decode()


@pytest.mark.skipif(not have_torch(), reason="torch does not import")
def test_torch_save_roundtrip(tmp_path):
    import torch
    sd = {"w": torch.randn(64, 32), "b": torch.zeros(32, dtype=torch.bfloat16), "step": 3}
    buf = io.BytesIO()
    torch.save(sd, buf)
    with ulpack.writer(tmp_path / "a") as w:
        w.save("run/checkpoint-1/state.pt", buf.getvalue())
    with ulpack.open_archive(tmp_path / "a") as ar:
        got = ar.load("run/checkpoint-1/state.pt")
        assert got["step"] == 3 and torch.equal(got["w"], sd["w"]) and torch.equal(got["b"], sd["b"])
        assert ar.stat("run/checkpoint-1/state.pt").kind == "torch"


@pytest.mark.skipif(not have_torch(), reason="torch does not import")
def test_example_train_save(tmp_path):
    ex = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "train_save.py")
    out = subprocess.run([sys.executable, ex, str(tmp_path / "a"), "--steps", "10", "--every", "5"],
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    assert "parameters identical: True" in out
    with ulpack.open_archive(tmp_path / "a") as ar:
        assert [s["step"] for s in ar.steps("mlp")] == [5, 10, 15]
