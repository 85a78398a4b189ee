# SPDX-License-Identifier: MIT
"""make.py - writes tests/data/dcp: a DCP run of 3 steps of one process
(dcp.save with no_dist=True, torch 2.13): run/step-<s>/__0_0.distcp and
.metadata of a 2-layer MLP (64-64-64, fp32) trained for real with AdamW,
plus resharded/step-4, the same state saved with one more tensor first (the
rank file's items move: another plan, as after a re-sharding).
Usage: python make.py OUT   (deterministic: seeded, CPU only)"""
import sys

import torch
import torch.distributed.checkpoint as dcp

out = sys.argv[1]
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64))
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
for s in range(1, 5):
    for _ in range(3):
        x = torch.randn(16, 64)
        (m(x) - x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    sd = {"model": m.state_dict(), "optim": opt.state_dict()}
    if s < 4:
        dcp.save(sd, checkpoint_id="%s/run/step-%d" % (out, s), no_dist=True)
    else:
        sd["extra"] = torch.randn(128, 64)
        dcp.save(sd, checkpoint_id="%s/resharded/step-4" % out, no_dist=True)

# shift/step-{1,2,3}: a smaller MLP (32-32-32) and its AdamW state; step 2
# has a new entry first, "adapter.v" (16x32: a shape no other tensor has),
# step 3 one more, "adapter.w" (32x32, the shape of the weights and their
# moments): the items of a step sit one or two places later than in the
# step before (names and chunks unchanged).
# st/step-{1,2}: the MLP saved with serialization_format=SAFETENSORS
# (BYTE_IO items as torch.save records, then one safetensors file of the
# tensors, named by their fully qualified names).
from torch.distributed.checkpoint.filesystem import FileSystemWriter, SerializationFormat

torch.manual_seed(1)
m = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32))
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
adapter = {"w": torch.randn(32, 32), "v": torch.randn(16, 32)}
for s in range(1, 4):
    for _ in range(3):
        x = torch.randn(16, 32)
        (m(x) - x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    sd = {"model": m.state_dict(), "optim": opt.state_dict()}
    if s > 1:
        sd = {"adapter": {"w": adapter["w"], "v": adapter["v"]} if s == 3 else {"v": adapter["v"]}, **sd}
    dcp.save(sd, checkpoint_id="%s/shift/step-%d" % (out, s), no_dist=True)
    if s < 3:
        sd = {"model": m.state_dict(), "optim": opt.state_dict()}
        w = FileSystemWriter("%s/st/step-%d" % (out, s), serialization_format=SerializationFormat.SAFETENSORS)
        dcp.save(sd, storage_writer=w, no_dist=True)
