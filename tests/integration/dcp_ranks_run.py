# SPDX-License-Identifier: MIT
"""dcp_ranks_run.py - the real-torch side of tests/integration/dcp_ranks.sh:
WORLD processes (gloo on CPU, one process per rank, forked so that torch is
imported once) save and load a state sharded like FSDP's: every parameter
and its two AdamW-like moments a DTensor sharded by rows over the ranks
(each rank writes its own rows), plus a replicated tensor and a step count.

  save WORLD PORT OUT PLAIN STEPS [SCALE]
      steps 1..STEPS; step s is saved with torch.distributed.checkpoint.save
      (odd s) or async_save (even s, its future waited for) through a
      FileSystemWriter(sync_files=True, thread_count=2), into OUT/step-<s>
      and then PLAIN/step-<s> (the reference copy). SCALE (default 1)
      multiplies the rows of every parameter.
  load WORLD PORT CKPT STEP [SCALE]
      loads CKPT (saved at step STEP by any world size) into WORLD ranks
      and checks every tensor against the values of that step.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

SHAPES = {"embed": (512, 256), "layers.0.w": (256, 256), "layers.1.w": (256, 256), "head": (256, 512)}


def values(step, scale):
    """The full tensors of a step: a drifting trajectory (deltas between
    steps), the same on every rank."""
    out = {}
    for i, (name, (r, c)) in enumerate(SHAPES.items()):
        g = torch.Generator().manual_seed(100 + i)
        base = torch.randn(r * scale, c, generator=g) * 0.02
        drift = torch.randn(r * scale, c, generator=torch.Generator().manual_seed(1000 * step + i))
        out["model." + name] = base + 1e-4 * step * drift
        out["optim." + name + ".exp_avg"] = 1e-3 * drift
        out["optim." + name + ".exp_avg_sq"] = 1e-6 * drift * drift
    return out


def state(mesh, step, scale):
    sd = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in values(step, scale).items()}
    sd["norm"] = torch.full((256,), 1.0 + step / 100)  # replicated: one rank writes it
    sd["step"] = torch.tensor(step)
    return sd


def init(rank, world, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return init_device_mesh("cpu", (world,))


def save(rank, world, port, out, plain, steps, scale):
    mesh = init(rank, world, port)
    for s in range(1, steps + 1):
        sd = state(mesh, s, scale)
        for d in (out, plain):
            w = FileSystemWriter("%s/step-%d" % (d, s), sync_files=True, thread_count=2)
            if s % 2:
                dcp.save(sd, storage_writer=w)
            else:
                dcp.async_save(sd, storage_writer=w).result()
    dist.barrier()
    dist.destroy_process_group()


def load(rank, world, port, ckpt, step, scale):
    mesh = init(rank, world, port)
    sd = state(mesh, 0, scale)
    dcp.load(sd, storage_reader=FileSystemReader(ckpt))
    want = values(step, scale)
    for k, v in want.items():
        got = sd[k]
        assert got.to_local().shape[0] == v.shape[0] // world, (k, got.to_local().shape)
        assert torch.equal(got.full_tensor(), v), "rank %d: %s: %s differs" % (rank, ckpt, k)
    assert torch.equal(sd["norm"], torch.full((256,), 1.0 + step / 100)) and int(sd["step"]) == step
    dist.destroy_process_group()


def main():
    cmd, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if cmd == "save":
        out, plain, steps = sys.argv[4], sys.argv[5], int(sys.argv[6])
        scale = int(sys.argv[7]) if len(sys.argv) > 7 else 1
        mp.start_processes(save, args=(world, port, out, plain, steps, scale), nprocs=world, start_method="fork")
    elif cmd == "load":
        ckpt, step = sys.argv[4], int(sys.argv[5])
        scale = int(sys.argv[6]) if len(sys.argv) > 6 else 1
        mp.start_processes(load, args=(world, port, ckpt, step, scale), nprocs=world, start_method="fork")
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
