# SPDX-License-Identifier: MIT
"""dcp_run.py - the real-torch side of tests/integration/dcp.sh: a small
model trained for real (fp32, AdamW) by WORLD processes (gloo on CPU, one
process per rank, MASTER_ADDR=127.0.0.1), its state saved each step with
torch.distributed.checkpoint, and loaded back.

  save WORLD PORT STEP0 STEPS OUT [PLAIN] [SAFE]
      trains STEPS steps; after step s (STEP0 + s) saves the state with
      dcp.save to OUT/step-<s> and, if given, PLAIN/step-<s> (the reference
      copy) and (rank 0) the same tensors as SAFE/step-<s>/state.safetensors.
  load WORLD PORT CKPT REF [CKPT REF ...]
      loads CKPT and REF (two copies of one checkpoint, ".../step-<s>") into
      WORLD ranks and checks that every tensor is equal, and that the sharded
      tensor holds the values it was saved with at step s.

The state dict: the model, the optimizer's state (exp_avg, exp_avg_sq,
step) and "shard", a DTensor sharded by rows over the ranks (so that a load
into another world size reshards it). Replicated tensors are written once,
by one rank (DCP's deduplication).
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

ROWS, COLS = 64, 256


class Tiny(torch.nn.Module):
    """A small transformer (ULP_DCP_MODEL=transformer, make bench section D):
    4 encoder layers of width 256 between an input and an output projection."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(128, 256)
        layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        self.out = torch.nn.Linear(256, 128)

    def forward(self, x):
        return self.out(self.body(self.inp(x).unsqueeze(1)).squeeze(1))


def model():
    torch.manual_seed(0)
    if os.environ.get("ULP_DCP_MODEL") == "transformer":
        return Tiny()
    return torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 512),
                               torch.nn.GELU(), torch.nn.Linear(512, 128))


def shard_value(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(ROWS, COLS, generator=g)


def state(m, opt, mesh, step):
    return {"model": m.state_dict(), "optim": opt.state_dict(),
            "shard": distribute_tensor(shard_value(step), mesh, [Shard(0)])}


def flat(sd, prefix=""):
    out = {}
    for k, v in sd.items():
        name = prefix + str(k)
        if isinstance(v, dict):
            out.update(flat(v, name + "."))
        elif isinstance(v, torch.Tensor):
            v = v.full_tensor() if hasattr(v, "full_tensor") else v
            out[name] = v.detach().clone().contiguous()
    return out


def init(rank, world, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return init_device_mesh("cpu", (world,))


def save(rank, world, port, step0, steps, out, plain, safe):
    mesh = init(rank, world, port)
    torch.set_num_threads(1)
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(7)
    times = [0.0, 0.0]
    for s in range(step0 + 1, step0 + steps + 1):
        for _ in range(2):
            x = torch.randn(32, 128, generator=g)
            loss = (m(x) - x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        sd = state(m, opt, mesh, s)
        t0 = time.perf_counter()
        dcp.save(sd, checkpoint_id="%s/step-%d" % (out, s))
        t1 = time.perf_counter()
        if plain:
            dcp.save(sd, checkpoint_id="%s/step-%d" % (plain, s))
        times[0] += t1 - t0
        times[1] += time.perf_counter() - t1
        full = flat(sd)  # collective (full_tensor): every rank
        if safe and rank == 0:
            from safetensors.torch import save_file
            os.makedirs("%s/step-%d" % (safe, s), exist_ok=True)
            save_file(full, "%s/step-%d/state.safetensors" % (safe, s))
    if rank == 0:  # what dcp.save took (a collective: every rank returns together)
        print("dcp.save: %.3f s into OUT, %.3f s into PLAIN" % tuple(times), flush=True)
    dist.destroy_process_group()


def template(mesh):
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    # the optimizer's state exists once it stepped: one step of zero grads
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    return state(m, opt, mesh, 0)


def load(rank, world, port, pairs):
    mesh = init(rank, world, port)
    for ckpt, ref in pairs:
        step = int(ckpt.rstrip("/").rsplit("-", 1)[1])
        a, b = template(mesh), template(mesh)
        dcp.load(a, checkpoint_id=ckpt)
        dcp.load(b, checkpoint_id=ref)
        fa, fb = flat(a), flat(b)
        assert fa.keys() == fb.keys(), (sorted(fa), sorted(fb))
        for k in fa:
            assert torch.equal(fa[k], fb[k]), "rank %d: %s: %s differs" % (rank, ckpt, k)
        assert torch.equal(fa["shard"], shard_value(step)), "rank %d: %s: shard has other values" % (rank, ckpt)
        # the local chunk of the (maybe resharded) DTensor is this world size's
        assert a["shard"].to_local().shape[0] == ROWS // world
    dist.destroy_process_group()


def main():
    cmd, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if cmd == "save":
        step0, steps, out = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
        plain = sys.argv[7] if len(sys.argv) > 7 else ""
        safe = sys.argv[8] if len(sys.argv) > 8 else ""
        mp.spawn(save, args=(world, port, step0, steps, out, plain, safe), nprocs=world)
    elif cmd == "load":
        rest = sys.argv[4:]
        pairs = list(zip(rest[0::2], rest[1::2]))
        mp.spawn(load, args=(world, port, pairs), nprocs=world)
    else:
        raise SystemExit("usage: dcp_run.py save|load ...")


if __name__ == "__main__":
    main()
