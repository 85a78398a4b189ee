#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""make-subset.py SRC DST - writes the committed subset of tiny-lm (see README.md):
the tensors named by KEEP, in their original order, bytes unchanged, with the
original __metadata__; step and dtype folders as listed in PICK."""
import json, os, struct, sys

# the weights of the second transformer block (12 of 29 tensors, 197,376 of
# 478,720 parameters); of the optimizer, that block's attention moments
KEEP = {"bf16": ("blocks.1.",), "fp16": ("blocks.1.",), "fp32": ("blocks.1.",), "optim": ("blocks.1.attn.",)}
PICK = {"bf16": (300, 350, 400), "fp16": (300, 350, 400), "fp32": (350, 400), "optim": (400,)}

def subset(src, dst, keep):
    b = open(src, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", None)
    names = sorted((k for k in h if k.startswith(keep)), key=lambda k: h[k]["data_offsets"][0])
    out, body, off = {}, [], 0
    if meta is not None:
        out["__metadata__"] = meta
    for k in names:
        s, e = h[k]["data_offsets"]
        out[k] = {"dtype": h[k]["dtype"], "shape": h[k]["shape"], "data_offsets": [off, off + e - s]}
        body.append(b[8 + n + s:8 + n + e])
        off += e - s
    hdr = json.dumps(out, separators=(",", ":")).encode()
    hdr += b" " * (-len(hdr) % 8)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + b"".join(body))

src, dst = sys.argv[1], sys.argv[2]
for sub, steps in PICK.items():
    name = "optimizer.safetensors" if sub == "optim" else "model.safetensors"
    for s in steps:
        subset(f"{src}/{sub}/checkpoint-{s}/{name}", f"{dst}/{sub}/checkpoint-{s}/{name}", KEEP[sub])
