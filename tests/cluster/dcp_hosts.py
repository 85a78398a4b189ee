# SPDX-License-Identifier: MIT
"""dcp_hosts.py - the real-torch side of tests/cluster/gluster_contrib.sh: a
multi-node save, each "host" a directory its ranks save into (ranks
HOST*PER .. HOST*PER+PER-1 on host HOST), one torch.distributed.checkpoint
step of one run from every host (gloo on CPU, one process per rank; the
model, optimizer and sharded tensor of tests/integration/dcp_run.py).

  save PER PORT STEP0 STEPS PLAIN DIR0 DIR1 ...
      trains STEPS steps; after step s (STEP0 + s) every rank saves with
      dcp.save into PLAIN/step-<s> (the reference, straight onto the shared
      file system) and into DIR<host>/step-<s> (its host's mount); prints
      the seconds each took (a collective: every rank returns together).
Loading is dcp_run.py's "load".
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import dcp_run  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def save(rank, world, per, port, step0, steps, plain, dirs):
    mesh = dcp_run.init(rank, world, port)
    torch.set_num_threads(1)
    m = dcp_run.model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(7)
    times = [0.0, 0.0]
    mine = dirs[rank // per]
    for s in range(step0 + 1, step0 + steps + 1):
        os.makedirs("%s/step-%d" % (mine, s), exist_ok=True)
        os.makedirs("%s/step-%d" % (plain, s), exist_ok=True)
    for s in range(step0 + 1, step0 + steps + 1):
        for _ in range(2):
            x = torch.randn(32, 128, generator=g)
            loss = (m(x) - x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        sd = dcp_run.state(m, opt, mesh, s)
        # the order alternates, so that neither copy always goes first
        order = [(0, plain), (1, mine)] if s % 2 else [(1, mine), (0, plain)]
        for which, d in order:
            dist.barrier()
            t0 = time.perf_counter()
            dcp.save(sd, checkpoint_id="%s/step-%d" % (d, s))
            times[which] += time.perf_counter() - t0
    if rank == 0:
        print("dcp.save: %.3f s onto the shared file system, %.3f s into the mounts" % tuple(times), flush=True)
    dist.destroy_process_group()


def main():
    if len(sys.argv) < 8 or sys.argv[1] != "save":
        raise SystemExit("usage: dcp_hosts.py save PER PORT STEP0 STEPS PLAIN DIR0 DIR1 ...")
    per, port, step0, steps, plain = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    dirs = sys.argv[7:]
    world = per * len(dirs)
    mp.spawn(save, args=(world, per, port, step0, steps, plain, dirs), nprocs=world)


if __name__ == "__main__":
    main()
