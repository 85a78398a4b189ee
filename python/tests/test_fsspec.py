# SPDX-License-Identifier: MIT
"""The fsspec file system (ulpack/fsspec.py, issue 36 item 6): fsspec's API
on an archive the test writes, its URLs, the shared writer and its lock, and
torch.distributed.checkpoint's FsspecWriter/FsspecReader saving into and
loading from an archive with no mount."""
import errno
import json
import threading

import pytest

fsspec = pytest.importorskip("fsspec")

import ulpack  # noqa: E402
import ulpack.fsspec as ufs  # noqa: E402
from conftest import ulpack as cli  # noqa: E402


@pytest.fixture
def arch(tmp_path):
    """An archive path; this process's writer of it is let go at the end."""
    a = str(tmp_path / "a")
    yield a
    ufs.release(a)


@pytest.fixture
def fs(arch, src):
    """An archive with a safetensors file of several chunks, small files and
    a nested directory, and the fsspec file system over it."""
    with ulpack.writer(arch) as w:
        w.save("run/checkpoint-100/model.safetensors", str(src / "run" / "checkpoint-100" / "model.safetensors"))
        w.save("run/notes.txt", b"hello world\n")
        w.save("run/sub/deep/x.bin", bytes(range(256)) * 40)
        w.save("empty", b"")
    return fsspec.filesystem("ulpack", archive=arch)


def test_registered_and_urls(arch, fs):
    assert fsspec.get_filesystem_class("ulpack") is ufs.UlpackFileSystem
    # the archive in the URL: ulpack://ARCHIVE//PATH
    f2, p = fsspec.core.url_to_fs("ulpack://%s//run/notes.txt" % arch)
    assert isinstance(f2, ufs.UlpackFileSystem) and f2.archive == arch and p == "run/notes.txt"
    assert f2.cat_file(p) == b"hello world\n"
    # the archive as a storage option: ulpack://PATH
    f3, p = fsspec.core.url_to_fs("ulpack://run/notes.txt", archive=arch)
    assert f3.archive == arch and p == "run/notes.txt"
    with fsspec.open("ulpack://%s//run/notes.txt" % arch, "rt") as f:
        assert f.read() == "hello world\n"
    assert fs.unstrip_protocol("run/notes.txt") == "ulpack://%s//run/notes.txt" % arch
    for u in ("ulpack://run/x", "ulpack:///run/x", "run/x/", "/run/x"):
        assert ufs.UlpackFileSystem._strip_protocol(u) == "run/x"
    with pytest.raises(ValueError, match="which archive"):
        fsspec.core.url_to_fs("ulpack://run/notes.txt")


def test_ls_info_exists(fs, src):
    assert fs.ls("", detail=False) == ["empty", "run"]
    assert fs.ls("run", detail=False) == ["run/checkpoint-100", "run/notes.txt", "run/sub"]
    d = {e["name"]: e for e in fs.ls("run/checkpoint-100")}
    e = d["run/checkpoint-100/model.safetensors"]
    raw = (src / "run" / "checkpoint-100" / "model.safetensors").read_bytes()
    assert e["type"] == "file" and e["size"] == len(raw) and e["kind"] == "safetensors" and e["step"] == 100
    assert 0 < e["stored_bytes"] < e["size"]
    assert fs.info("run/sub")["type"] == "directory" and fs.info("")["type"] == "directory"
    assert fs.ls("run/notes.txt", detail=False) == ["run/notes.txt"]
    assert fs.info("ulpack://run/notes.txt")["size"] == 12
    assert fs.isdir("run/sub/deep") and not fs.isfile("run/sub/deep")
    assert fs.isfile("run/sub/deep/x.bin") and fs.exists("empty") and fs.size("empty") == 0
    assert not fs.exists("run/nope") and not fs.exists("run/notes.txt/x") and not fs.exists("a\0b")
    with pytest.raises(FileNotFoundError):
        fs.info("run/nope")
    with pytest.raises(FileNotFoundError):
        fs.ls("nope")
    assert fs.find("run") == ["run/checkpoint-100/model.safetensors", "run/notes.txt", "run/sub/deep/x.bin"]
    assert fs.glob("run/**/*.bin") == ["run/sub/deep/x.bin"]
    assert fs.du("run/sub") == 256 * 40
    assert fs.modified("run/notes.txt").year >= 2024
    assert fs.checksum("run/notes.txt") != fs.checksum("empty")


def test_cat_file_ranges_and_open(fs, src):
    raw = (src / "run" / "checkpoint-100" / "model.safetensors").read_bytes()
    p = "run/checkpoint-100/model.safetensors"
    n = len(raw)
    assert fs.cat_file(p) == raw and fs.cat(p) == raw
    for s, e in ((0, 10), (100, n // 2), (n // 3, None), (None, 1000), (-100, None), (-n - 5, 7), (5, -5),
                 (n - 3, n + 100), (n + 10, n + 20), (50, 40), (0, 0)):
        assert fs.cat_file(p, start=s, end=e) == raw[s:e], (s, e)
    assert fs.cat_ranges([p, p], [0, n - 10], [10, n]) == [raw[:10], raw[n - 10:]]
    assert fs.read_block(p, 1000, 500) == raw[1000:1500]
    assert fs.head(p, 20) == raw[:20] and fs.tail(p, 20) == raw[-20:]
    with fs.open(p, "rb") as f:
        assert f.seekable() and f.read(8) == raw[:8]
        f.seek(n - 100)
        assert f.read() == raw[n - 100:] and f.tell() == n
        f.seek(12345)
        assert f.read(7) == raw[12345:12352]
    assert fs.cat_file("empty") == b"" and fs.cat_file("empty", 3, 9) == b""
    with pytest.raises(IsADirectoryError):
        fs.open("run", "rb")
    with pytest.raises(FileNotFoundError):
        fs.cat_file("run/nope")
    with pytest.raises(ValueError):
        fs.open("run/notes.txt", "r+b")


def test_write_through_the_writer(arch, fs, tmp_path):
    with fs.open("run/new/a.bin", "wb") as f:
        assert f.write(b"abc") == 3
        f.write(b"def" * 1000)
        assert f.tell() == 3003
        f.seek(0)
        f.write(b"A")
        assert not fs.exists("run/new/a.bin")  # archived whole at close
    assert f.result["raw_bytes"] == 3003
    assert fs.cat_file("run/new/a.bin") == b"Abc" + b"def" * 1000
    # an exception in the with block: nothing archived
    with pytest.raises(RuntimeError):
        with fs.open("run/new/broken.bin", "wb") as f:
            f.write(b"half")
            raise RuntimeError("x")
    assert not fs.exists("run/new/broken.bin")
    with pytest.raises(FileExistsError):
        fs.open("run/new/a.bin", "xb")
    with fs.open("run/new/a.bin", "ab") as f:
        f.write(b"!")
    assert fs.cat_file("run/new/a.bin", -2) == b"f!"
    with fsspec.open("ulpack://%s//run/new/t.txt" % arch, "wt") as f:
        f.write("text\n")
    assert fs.cat_file("run/new/t.txt") == b"text\n"
    fs.pipe_file("run/p.bin", b"piped")
    fs.pipe({"run/q1": b"1", "run/q2": b"22"})
    assert fs.cat(["run/p.bin", "run/q1", "run/q2"]) == {"run/p.bin": b"piped", "run/q1": b"1", "run/q2": b"22"}
    with pytest.raises(FileExistsError):
        fs.pipe_file("run/p.bin", b"x", mode="create")
    local = tmp_path / "local.bin"
    local.write_bytes(b"L" * 5000)
    fs.put_file(str(local), "run/put/local.bin")
    assert fs.cat_file("run/put/local.bin") == b"L" * 5000
    assert fs.info("run/put/local.bin")["mtime"] == pytest.approx(local.stat().st_mtime, abs=1e-6)
    fs.get_file("run/put/local.bin", str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == b"L" * 5000
    fs.cp_file("run/notes.txt", "run/notes2.txt")
    assert fs.cat_file("run/notes2.txt") == b"hello world\n"
    # directories
    fs.makedirs("d1/d2/d3")
    assert fs.isdir("d1/d2/d3")
    fs.makedirs("d1/d2", exist_ok=True)
    with pytest.raises(FileExistsError):
        fs.makedirs("d1/d2")
    with pytest.raises(FileExistsError):
        fs.mkdir("d1")
    with pytest.raises(FileNotFoundError):
        fs.mkdir("nope/x", create_parents=False)
    fs.mkdir("d1/d2/e", create_parents=False)
    fs.rmdir("d1/d2/e")
    assert not fs.exists("d1/d2/e")
    # rename: in the index, over an existing file; a whole directory
    fs.mv("run/q1", "run/q2")
    assert not fs.exists("run/q1") and fs.cat_file("run/q2") == b"1"
    fs.rename("run/new", "moved/new")
    assert fs.find("moved") == ["moved/new/a.bin", "moved/new/t.txt"] and not fs.exists("run/new")
    # removal
    fs.rm_file("run/q2")
    assert not fs.exists("run/q2")
    fs.rm("moved", recursive=True)
    assert not fs.exists("moved")
    with pytest.raises(FileNotFoundError):
        fs.rm_file("run/q2")
    fs.release_writer()
    assert "DAMAGED" not in cli("verify", arch).decode()
    sp = json.loads(cli("stat", arch, "--json"))["space"]
    assert sp["pending_recodes"] == 0 and sp["dead_packs"] == 0


def test_transaction(fs):
    with fs.transaction:
        with fs.open("tx/a", "wb") as f:
            f.write(b"in a transaction")
        assert not fs.exists("tx/a")
    assert fs.cat_file("tx/a") == b"in a transaction"


def test_one_writer_per_archive(arch, fs):
    """The fs's writer is this process's, shared by the instances fsspec
    makes per thread; another writer is refused while it is held."""
    fs.pipe_file("w/0", b"0")
    errs = []

    def put(i):
        try:
            fsspec.filesystem("ulpack", archive=arch).pipe_file("w/%d" % i, b"%d" % i)
        except Exception as e:  # noqa: BLE001
            errs.append(e)
    ts = [threading.Thread(target=put, args=(i,)) for i in range(1, 5)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs
    assert fs.ls("w", detail=False) == ["w/%d" % i for i in range(5)]
    with pytest.raises(BlockingIOError):
        ulpack.writer(arch)
    ufs.release(arch)
    with ulpack.writer(arch) as w:  # the lock went with the release
        w.save("w/5", b"5")
        # and the fs waits its turn: its next write is refused while w holds it
        with pytest.raises(BlockingIOError):
            fs.pipe_file("w/6", b"6")
    fs.pipe_file("w/6", b"6")
    assert fs.cat_file("w/6") == b"6" and fs.cat_file("w/5") == b"5"


def test_read_only(arch, fs):
    ro = fsspec.filesystem("ulpack", archive=arch, read_only=True)
    assert ro.cat_file("run/notes.txt") == b"hello world\n"
    for call in (lambda: ro.open("x", "wb"), lambda: ro.pipe_file("x", b"1"), lambda: ro.rm_file("run/notes.txt"),
                 lambda: ro.makedirs("d"), lambda: ro.mv("run/notes.txt", "y")):
        with pytest.raises(OSError) as e:
            call()
        assert e.value.errno == errno.EROFS
    assert ro.exists("run/notes.txt") and not ro.exists("x")


# ---- torch.distributed.checkpoint through FsspecWriter / FsspecReader

def _dcp():
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
    return torch, dcp, FsspecReader, FsspecWriter


def _state(torch, step):
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 16))
    for p in model.parameters():
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(step):
        opt.zero_grad()
        model(torch.randn(8, 64, generator=g)).square().mean().backward()
        opt.step()
    sd = {"model": model.state_dict(), "extra": {"step": step, "name": "run"}}
    # AdamW's moments, as FSDP's optimizer state dicts name them
    for i, (k, p) in enumerate(model.named_parameters()):
        st = opt.state[p]
        sd["optim." + k + ".exp_avg"] = st["exp_avg"]
        sd["optim." + k + ".exp_avg_sq"] = st["exp_avg_sq"]
    return sd


def _zeros_like(torch, sd):
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out[k] = _zeros_like(torch, v)
        elif isinstance(v, torch.Tensor):
            out[k] = torch.zeros_like(v)
        else:
            out[k] = None
    return out


def _equal(torch, a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            _equal(torch, a[k], b[k])
        elif isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.filterwarnings("ignore:Detected an existing checkpoint")
def test_dcp_save_load(arch):
    """dcp.save through FsspecWriter into an archive (no mount, no process
    group), two steps, one of them with two writer threads; dcp.load through
    FsspecReader gives equal tensors; the rank files are stored per tensor."""
    torch, dcp, FsspecReader, FsspecWriter = _dcp()
    states = {}
    for step, threads in ((100, 1), (200, 2)):
        sd = states[step] = _state(torch, step // 100)
        dcp.save(sd, storage_writer=FsspecWriter("ulpack://run/step-%d" % step, archive=arch,
                                                 thread_count=threads))
    # the archive in the URL, as a checkpoint_id that DCP resolves itself
    sd = states[300] = _state(torch, 3)
    dcp.save(sd, checkpoint_id="ulpack://%s//run/step-300" % arch)
    # saved again over itself: DCP removes the old .metadata (fs.rm), then
    # renames .metadata.tmp over it
    dcp.save(states[100], storage_writer=FsspecWriter("ulpack://run/step-100", archive=arch))
    fs = fsspec.filesystem("ulpack", archive=arch)
    assert fs.exists("run/step-300/.metadata") and not fs.exists("run/step-300/.metadata.tmp")
    names = fs.ls("run/step-200", detail=False)
    assert "run/step-200/.metadata" in names and sum(n.endswith(".distcp") for n in names) == 2
    for step in (100, 200, 300):
        out = _zeros_like(torch, states[step])
        if step == 300:
            dcp.load(out, checkpoint_id="ulpack://%s//run/step-300" % arch)
        else:
            dcp.load(out, storage_reader=FsspecReader("ulpack://run/step-%d" % step, archive=arch))
        _equal(torch, out, states[step])
    # stored per tensor, not opaque: the rank files are torch.save records
    for name in fs.find("run"):
        if name.endswith(".distcp"):
            assert fs.info(name)["kind"] == "torch", name
    fs.release_writer()
    st = json.loads(cli("stat", arch, "--json"))
    assert st["by_dtype"]["F32"]["tensors"] > 0
    assert [s["step"] for s in json.loads(cli("steps", arch, "--json"))] == [100, 200, 300]
    assert "DAMAGED" not in cli("verify", arch).decode()
    # and read back after the writer went: a read-only instance
    ro = fsspec.filesystem("ulpack", archive=arch, read_only=True)
    out = _zeros_like(torch, states[100])
    dcp.load(out, storage_reader=FsspecReader("ulpack://run/step-100", archive=arch, read_only=True))
    _equal(torch, out, states[100])
    assert ro.cat_file("run/step-100/.metadata", 0, 2) == fs.cat_file("run/step-100/.metadata")[:2]


def test_fork(arch, fs):
    """A forked child neither uses nor frees its parent's writer: it reads
    through its own handle, its writes are refused while the parent holds
    the lock, and the parent's writer goes on."""
    import os
    fs.pipe_file("f/parent", b"p")
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            ok = fs.cat_file("f/parent") == b"p"
            try:
                fs.pipe_file("f/child", b"c")
                ok = False
            except BlockingIOError:
                pass
            os.write(wfd, b"ok" if ok else b"no")
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    got = os.read(r, 2)
    os.close(r)
    assert os.waitpid(pid, 0)[1] == 0 and got == b"ok"
    fs.pipe_file("f/parent2", b"q")
    assert fs.ls("f", detail=False) == ["f/parent", "f/parent2"]


_CHILD = r"""
import sys, fsspec, ulpack.fsspec
arch, rank = sys.argv[1], int(sys.argv[2])
fs = fsspec.filesystem("ulpack", archive=arch, lock_wait=120)
for i in range(6):
    with fs.open("r%d/f%d.bin" % (rank, i), "wb") as f:
        f.write(bytes([rank, i]) * 20000)
fs.makedirs("r%d/done" % rank, exist_ok=True)
"""


def test_lock_wait_processes_in_turn(arch, tmp_path):
    """lock_wait: several processes (as the ranks of a DCP save) write one
    archive in turn, each write taking the lock and letting it go; one that
    holds it for a while (a writer of this process) is waited for."""
    import subprocess
    import sys
    import time
    with ulpack.writer(arch) as w:
        w.save("held", b"x")
        procs = [subprocess.Popen([sys.executable, "-c", _CHILD, arch, str(r)]) for r in range(3)]
        time.sleep(0.5)  # the children wait for this writer
    for p in procs:
        assert p.wait(timeout=120) == 0
    fs = fsspec.filesystem("ulpack", archive=arch, lock_wait=10)
    for r in range(3):
        assert fs.isdir("r%d/done" % r)
        for i in range(6):
            assert fs.cat_file("r%d/f%d.bin" % (r, i)) == bytes([r, i]) * 20000
    fs.release_writer()  # the gc, in its turn
    ulpack.writer(arch).close()  # and no lock left behind
    assert "DAMAGED" not in cli("verify", arch).decode()
    # without lock_wait the fs holds the lock from its first write on; a
    # lock_wait instance of the same process then uses that writer
    fs2 = fsspec.filesystem("ulpack", archive=arch)
    fs2.pipe_file("held2", b"y")
    with pytest.raises(BlockingIOError):
        ulpack.writer(arch)
    fs.pipe_file("x", b"z")
    assert fs2.cat_file("x") == b"z"


_RANK = r"""
import sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
import ulpack.fsspec
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
arch, rank, store = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
g = torch.Generator().manual_seed(rank)
sd = {"shared": torch.arange(4096, dtype=torch.float32), "own%d" % rank: torch.randn(256, 64, generator=g)}
dcp.save(sd, storage_writer=FsspecWriter("ulpack://run/step-1", archive=arch, lock_wait=120))
out = {k: torch.zeros_like(v) for k, v in sd.items()}
dcp.load(out, storage_reader=FsspecReader("ulpack://run/step-1", archive=arch))
assert all(torch.equal(out[k], sd[k]) for k in sd)
dist.destroy_process_group()
"""


def test_dcp_two_ranks(arch, tmp_path):
    """Two ranks (processes, gloo) of one dcp.save through FsspecWriter with
    lock_wait: each writes its rank file in turn; each loads its tensors
    back through FsspecReader."""
    import subprocess
    import sys
    _dcp()
    ulpack.writer(arch).close()  # made first: the ranks then only open it
    store = str(tmp_path / "store")
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, arch, str(r), store]) for r in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    fs = fsspec.filesystem("ulpack", archive=arch)
    assert fs.ls("run/step-1", detail=False) == ["run/step-1/.metadata", "run/step-1/__0_0.distcp",
                                                 "run/step-1/__1_0.distcp"]
    assert fs.info("run/step-1/__1_0.distcp")["kind"] == "torch"
    assert json.loads(cli("stat", arch, "--json"))["by_dtype"]["F32"]["tensors"] >= 3
