#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Writes torch.save files for ulpackfs's tests and benchmarks (needs torch).

  make.py small OUTDIR        the small files committed in tests/data/torch
  make.py torch2 OUTDIR       OUTDIR/torch2.pt, by torch 2.x (tests/data/torch)
  make.py shared DATA OUTDIR  torch.save versions of ../shared/data/tiny-lm:
                              OUTDIR/optim/checkpoint-<s>/optimizer.pt (AdamW
                              state_dict shape) and
                              OUTDIR/bf16/checkpoint-<s>/pytorch_model.bin
"""
import collections
import json
import os
import struct
import sys

import torch


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    dt = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    out = collections.OrderedDict()
    for k, v in head.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:e]), dtype=dt[v["dtype"]])
        out[k] = t.reshape(v["shape"]).clone()
    return out


def adamw_state(moments, step):
    """The state_dict of torch.optim.AdamW over the parameters in order."""
    names = [k[: -len(".exp_avg")] for k in moments if k.endswith(".exp_avg")]
    state = {}
    for i, n in enumerate(names):
        state[i] = {"step": torch.tensor(float(step)),
                    "exp_avg": moments[n + ".exp_avg"],
                    "exp_avg_sq": moments[n + ".exp_avg_sq"]}
    groups = [{"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1,
               "amsgrad": False, "foreach": None, "maximize": False, "capturable": False,
               "differentiable": False, "fused": None, "params": list(range(len(names)))}]
    return {"state": state, "param_groups": groups}


def shared(data, out):
    for s in sorted(os.listdir(os.path.join(data, "optim")), key=lambda d: int(d.split("-")[1])):
        m = read_safetensors(os.path.join(data, "optim", s, "optimizer.safetensors"))
        os.makedirs(os.path.join(out, "optim", s), exist_ok=True)
        torch.save(adamw_state(m, int(s.split("-")[1])), os.path.join(out, "optim", s, "optimizer.pt"))
    for s in os.listdir(os.path.join(data, "bf16")):
        w = read_safetensors(os.path.join(data, "bf16", s, "model.safetensors"))
        os.makedirs(os.path.join(out, "bf16", s), exist_ok=True)
        torch.save(w, os.path.join(out, "bf16", s, "pytorch_model.bin"))


def small(out):
    torch.manual_seed(20261130)
    os.makedirs(out, exist_ok=True)
    # every storage type torch.save writes here, nested containers, a view
    # sharing a storage, a Parameter, scalars and non-tensor values
    base = torch.randn(64, 32)
    obj = {
        "model": collections.OrderedDict([
            ("layers.0.weight", torch.randn(48, 32)),
            ("layers.0.bias", torch.zeros(48)),
            ("emb", torch.randn(100, 16).to(torch.bfloat16)),
            ("half", torch.randn(37).to(torch.float16)),
            ("double", torch.randn(5, dtype=torch.float64)),
            ("ids", torch.arange(20, dtype=torch.int64)),
            ("i32", torch.arange(7, dtype=torch.int32)),
            ("i16", torch.arange(9, dtype=torch.int16)),
            ("i8", torch.arange(-5, 6, dtype=torch.int8)),
            ("u8", torch.arange(13, dtype=torch.uint8)),
            ("mask", torch.rand(50) > 0.5),
            ("param", torch.nn.Parameter(torch.randn(8, 8))),
            ("empty", torch.zeros(0)),
        ]),
        "base": base,
        "view": base[10:20],          # shares base's storage: named "base"
        "list": [torch.ones(3), 7, "text", (1.5, None, True)],
        "epoch": 3,
    }
    torch.save(obj, os.path.join(out, "small.pt"))
    # a tiny training run: model and AdamW state at two steps, for deltas
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64)
    for step in range(1, 31):
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step in (20, 30):
            d = os.path.join(out, "run", "checkpoint-%d" % step)
            os.makedirs(d, exist_ok=True)
            torch.save(opt.state_dict(), os.path.join(d, "optimizer.pt"))
            torch.save(model.state_dict(), os.path.join(d, "pytorch_model.bin"))


def torch2(out):
    """What torch 2.x writes beyond 1.13's records: .format_version,
    .storage_alignment, byteorder, .data/serialization_id, and tensors of the
    dtypes without a legacy <T>Storage (float8_*, uint16/32) as an
    UntypedStorage with _rebuild_tensor_v3 naming the dtype."""
    torch.manual_seed(20261206)
    w = torch.randn(24, 16)
    e4 = w.to(torch.float8_e4m3fn)
    obj = {
        "w": w,
        "bf16": w.to(torch.bfloat16),
        "e4m3": e4,
        "e4m3_view": e4[4:8],      # a second v3 tensor over e4m3's storage
        "e5m2": torch.randn(40).to(torch.float8_e5m2),
        "u16": torch.arange(9).to(torch.uint16),
        "u32": torch.arange(5).to(torch.uint32),
    }
    os.makedirs(out, exist_ok=True)
    torch.save(obj, os.path.join(out, "torch2.pt"))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "small":
        small(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "torch2":
        torch2(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "shared":
        shared(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
