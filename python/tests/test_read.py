# SPDX-License-Identifier: MIT
"""Reading archives through the package: files, steps, tensors, errors,
threads, leaks."""
import errno
import gc
import json
import os
import random
import shutil
import struct
import threading
import tracemalloc

import pytest

import ulpack
from conftest import have_torch, ulpack as cli

SYN = "run/checkpoint-%d/model.safetensors"


def test_library_found():
    assert os.path.exists(ulpack.library_path) or ulpack.library_path.startswith("libulpack")


def test_steps_match_cli(ar, archive_dir, src):
    assert ar.steps() == json.loads(cli("steps", archive_dir, "--json"))
    assert ar.steps("run") == json.loads(cli("steps", archive_dir, "run", "--json"))
    assert ar.runs() == ["run", "trun"]
    assert [s["step"] for s in ar.steps("run")] == [100, 200, 300, 400]
    assert ar.latest("run") == "run/checkpoint-400"
    assert ar.latest("trun") == "trun/checkpoint-30"
    assert ar.listdir("run") == ["checkpoint-100", "checkpoint-200", "checkpoint-300", "checkpoint-400"]
    assert ar.files("trun") == ["trun/checkpoint-20/optimizer.pt", "trun/checkpoint-20/pytorch_model.bin",
                                "trun/checkpoint-30/optimizer.pt", "trun/checkpoint-30/pytorch_model.bin"]
    st = ar.stat(SYN % 200)
    assert st.kind == "safetensors" and st.step == 200 and not st.is_dir
    assert st.size == os.path.getsize(src / "run" / "checkpoint-200" / "model.safetensors")


def test_open_matches_cat_random_ranges(ar, archive_dir, src):
    rnd = random.Random(27)
    for path in (SYN % 100, SYN % 400, "trun/checkpoint-30/optimizer.pt"):
        ref = cli("cat", archive_dir, path)
        assert ar.read_bytes(path) == ref
        with ar.open(path) as f:
            assert f.read() == ref
            for _ in range(200):
                off = rnd.randrange(0, len(ref) + 10)
                n = rnd.choice([0, 1, 7, 4096, 65536, 1 << 20, rnd.randrange(1, 3 << 20)])
                assert f.seek(off) == off and f.tell() == off
                got = f.read(n)
                assert got == ref[off:off + n], (path, off, n)
                assert f.tell() == off + len(got)
            f.seek(-10, os.SEEK_END)
            assert f.read() == ref[-10:]
        raw = ar.open(path, buffering=0)
        buf = bytearray(1000)
        raw.seek(123)
        assert raw.readinto(buf) == 1000 and bytes(buf) == ref[123:1123]
        assert raw.pread(50, len(ref) - 20) == ref[-20:]
        raw.close()
        with pytest.raises(ValueError):
            raw.read(1)


def _header(ar, path):
    with ar.open(path, buffering=0) as f:
        f.set_readahead(False)  # decodes nothing past the header
        n = struct.unpack("<Q", f.pread(8, 0))[0]
        return json.loads(f.pread(n, 8)), 8 + n


def test_tensor_numpy(ar, src):
    import numpy as np
    path = SYN % 300
    hdr, base = _header(ar, path)
    hdr.pop("__metadata__", None)
    raw = open(src / "run" / "checkpoint-300" / "model.safetensors", "rb").read()
    assert ar.tensor_names(path) == sorted(hdr, key=lambda k: hdr[k]["data_offsets"][0])
    for name, t in hdr.items():
        x = ar.tensor(path, name)
        b, e = t["data_offsets"]
        assert list(x.shape) == t["shape"]
        assert x.tobytes() == raw[base + b:base + e]
        if t["dtype"] == "BF16":
            assert x.dtype == np.uint16
    d = ar.load(path)
    assert list(d) == ar.tensor_names(path)
    for name, t in hdr.items():
        b, e = t["data_offsets"]
        assert d[name].tobytes() == raw[base + b:base + e]
    with pytest.raises(KeyError):
        ar.tensor(path, "no.such.tensor")


def test_tensor_decodes_only_its_chunks(archive_dir):
    """A tensor's read decodes about its share of the file's chunks (the
    counters), never the whole file."""
    for step in (400, 100):  # an anchor, and the deepest delta
        path = SYN % step
        with ulpack.open_archive(archive_dir) as a:
            size = a.stat(path).size
            a.read_bytes(path)
            whole = a.counters()["chunks_decoded"]
        with ulpack.open_archive(archive_dir) as a:
            hdr, _ = _header(a, path)
            hdr.pop("__metadata__", None)
            by_size = sorted(hdr, key=lambda k: hdr[k]["data_offsets"][1] - hdr[k]["data_offsets"][0])
            for name in (by_size[-1], by_size[len(by_size) // 2]):
                c0 = a.counters()["chunks_decoded"]
                a.tensor(path, name)
                n = a.counters()["chunks_decoded"] - c0
                b, e = hdr[name]["data_offsets"]
                share = whole * (e - b) / size
                assert n <= 2 * share + 2 * (1 + a.stat(path).chain_depth), (step, name, n, share, whole)
                assert n < whole / 2, (step, name, n, whole)


@pytest.mark.skipif(not have_torch(), reason="torch does not import")
def test_torch_load_optimizer(ar, src):
    import torch
    for step in (20, 30):
        path = "trun/checkpoint-%d/optimizer.pt" % step
        ref = torch.load(src / "trun" / ("checkpoint-%d" % step) / "optimizer.pt")
        with ar.open(path) as f:
            got = torch.load(f)
        assert got["param_groups"] == ref["param_groups"]
        assert got["state"].keys() == ref["state"].keys()
        for k, v in ref["state"].items():
            for kk, vv in v.items():
                assert torch.equal(got["state"][k][kk], vv) if torch.is_tensor(vv) else got["state"][k][kk] == vv
        assert ar.load(path)["param_groups"] == ref["param_groups"]
        x = ar.tensor(path, "state.0.exp_avg", framework="pt")
        assert torch.equal(x, ref["state"][0]["exp_avg"])
    model = ar.load("trun/checkpoint-30/pytorch_model.bin")
    ref = torch.load(src / "trun" / "checkpoint-30" / "pytorch_model.bin")
    assert model.keys() == ref.keys() and all(torch.equal(model[k], ref[k]) for k in ref)
    sd = ar.load(SYN % 200, framework="pt")
    import numpy as np
    for k, v in ar.load(SYN % 200).items():
        assert np.array_equal(sd[k].view(torch.int16).numpy().view(np.uint16) if sd[k].dtype == torch.bfloat16
                              else sd[k].numpy(), v)


def test_torch_file_without_torch(ar, src):
    """The bytes read, and a tensor's flat storage through the library's view
    of the zip (no torch needed)."""
    import numpy as np
    path = "trun/checkpoint-30/optimizer.pt"
    raw = open(src / "trun" / "checkpoint-30" / "optimizer.pt", "rb").read()
    assert ar.read_bytes(path) == raw
    x = ar.tensor(path, "state.0.exp_avg")
    assert x.dtype == np.float32 and x.tobytes() in raw


def test_threads(ar, archive_dir):
    paths = [SYN % s for s in (100, 200, 300, 400)] + ["trun/checkpoint-30/optimizer.pt"]
    refs = {p: cli("cat", archive_dir, p) for p in paths}
    shared = {p: ar.open(p, buffering=0) for p in paths}
    errors = []

    def work(seed):
        rnd = random.Random(seed)
        try:
            for i in range(60):
                p = rnd.choice(paths)
                ref = refs[p]
                off = rnd.randrange(len(ref))
                n = rnd.randrange(1, 2 << 20)
                if i % 2:
                    got = shared[p].pread(n, off)
                else:
                    with ar.open(p) as f:
                        f.seek(off)
                        got = f.read(n)
                if got != ref[off:off + n]:
                    errors.append((p, off, n))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
    ts = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for f in shared.values():
        f.close()
    assert not errors


def test_missing_and_directory(ar):
    with pytest.raises(FileNotFoundError) as e:
        ar.open("run/checkpoint-100/nope.safetensors")
    assert "nope.safetensors" in str(e.value) and ar.path in str(e.value)
    with pytest.raises(FileNotFoundError):
        ar.stat("nope")
    with pytest.raises(FileNotFoundError):
        ar.steps("nope")
    with pytest.raises(IsADirectoryError):
        ar.open("run")
    with pytest.raises(FileNotFoundError):
        ulpack.open_archive("/nonexistent/archive")


def test_permission_denied(tmp_path, archive_dir):
    a = tmp_path / "locked"
    shutil.copytree(archive_dir, a)
    os.chmod(a, 0)
    try:
        if os.geteuid() != 0:
            with pytest.raises(PermissionError):
                ulpack.open_archive(a)
            return
        pid = os.fork()
        if pid == 0:  # root reads anything: a child as nobody
            code = 3
            try:
                os.setgid(65534)
                os.setuid(65534)
                ulpack.open_archive(a)
                code = 1
            except PermissionError as e:
                code = 0 if str(a) in str(e) else 2
            except BaseException:
                code = 4
            os._exit(code)
        assert os.waitpid(pid, 0)[1] >> 8 == 0
    finally:
        os.chmod(a, 0o755)


def test_damaged_pack(tmp_path, src):
    a = tmp_path / "a"
    cli("init", a)
    cli("import", a, src / "run" / "checkpoint-400", "--prefix", "run/checkpoint-400")
    pack = [p for p in os.listdir(a / "packs") if p.endswith(".pack")]
    assert len(pack) == 1
    p = a / "packs" / pack[0]
    n = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.seek(n // 2)
        b = f.read(1)
        f.seek(n // 2)
        f.write(bytes([b[0] ^ 0x40]))
    with ulpack.open_archive(a) as ar, pytest.raises(OSError) as e:
        ar.read_bytes(SYN % 400)
    assert e.value.errno == errno.EIO
    assert "checkpoint-400/model.safetensors" in str(e.value)


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_no_leak_over_10000_opens(ar):
    path = SYN % 200
    for _ in range(200):  # warm: caches, the first allocations
        with ar.open(path) as f:
            f.read(16)
    gc.collect()
    fds, rss = _fds(), _rss_kb()
    tracemalloc.start()
    snap0 = tracemalloc.take_snapshot()
    for i in range(10000):
        with ar.open(path) as f:
            f.seek(i * 997)
            f.read(64)
    gc.collect()
    snap1 = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
    assert grown < 256 << 10, grown
    assert _fds() == fds
    assert _rss_kb() - rss < 16 << 10, (rss, _rss_kb())


def test_dynamics(ar):
    """archive.dynamics: the index-only view as numpy arrays, consistent with
    `ulpack dynamics --json`; norms=True adds the decoded change, checked
    against the tensors read here; torch.save files too."""
    import json
    import numpy as np
    from conftest import ulpack
    d = ar.dynamics("run")
    assert list(d.steps) == [100, 200, 300, 400]
    S, T, L = len(d.steps), len(d.tensors), len(d.layers)
    assert d.bits_per_weight.shape == (S, T) and d.layer_update_bits_per_weight.shape == (S, L)
    assert d.role.shape == (S, T) and set(np.unique(d.role)) <= set("ads")
    assert np.isnan(d.update_bits_per_weight[0]).all()
    assert np.isfinite(d.step_update_bits_per_weight[1:]).all()
    assert "model.layers.0" in d.layers and d.layers[d.tensor_layer[d.tensors.index("lm_head.weight")]] == "lm_head"
    js = json.loads(ulpack("dynamics", ar.path, "run", "--json"))
    assert js["summary"] == d.summary and js["jump"] == d.jump
    assert (np.array(js["stored_bytes"]) == d.stored_bytes).all()
    np.testing.assert_allclose(d.bits_per_weight, 8 * d.stored_bytes / d.elements[None, :], rtol=1e-6)
    # with norms: the decoded change of one tensor, from the arrays read here
    n = ar.dynamics("run", tensors="model.layers.1.*", norms=True)
    assert all(t.startswith("model.layers.1.") for t in n.tensors) and n.layers == ["model.layers.1"]
    t = n.tensors.index("model.layers.1.mlp.down_proj.weight")
    a = ar.tensor("run/checkpoint-200/model.safetensors", n.tensors[t])
    b = ar.tensor("run/checkpoint-300/model.safetensors", n.tensors[t])
    va = (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    vb = (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    assert n.changed[2, t] == np.count_nonzero(a != b)
    np.testing.assert_allclose(n.rel_change[2, t], np.linalg.norm(vb - va) / np.linalg.norm(va), rtol=1e-6)
    assert np.isnan(n.rel_change[0]).all() and (n.step_rel_change[1:] > 0).all()
    # torch.save files: coded per tensor, the same view
    tr = ar.dynamics("trun")
    assert list(tr.steps) == [20, 30] and len(tr.tensors) > 0
    assert (tr.stored_bytes[tr.role != "s"] > 0).all()
    # and their decoded change (read through the decode cache), each float
    # tensor against numpy on the tensors read here
    tn = ar.dynamics("trun", norms=True)
    seen = 0
    for t, name in enumerate(tn.tensors):
        a = ar.tensor("trun/" + tn.files[t].replace("{S}", "20"), name)
        b = ar.tensor("trun/" + tn.files[t].replace("{S}", "30"), name)
        assert tn.changed[1, t] == np.count_nonzero(a != b), name
        if a.dtype == np.float32 and np.linalg.norm(a) > 0:
            va, vb = a.astype(np.float64), b.astype(np.float64)
            np.testing.assert_allclose(tn.rel_change[1, t], np.linalg.norm(vb - va) / np.linalg.norm(va), rtol=1e-6)
            seen += 1
    assert seen > 0
    with pytest.raises(FileNotFoundError):
        ar.dynamics("nope")
