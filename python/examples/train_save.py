#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Trains a tiny MLP for a few steps with torch, saving a checkpoint into an
ulpack archive every few steps (archive.save: no mount, no /dev/fuse),
reloads the newest with archive.load and resumes from it.

    python3 train_save.py ARCHIVE [--steps N] [--every K]

Needs torch and the ulpack package (PYTHONPATH=python, ULPACK_LIB=the
library where it is not installed)."""
import argparse
import io
import sys

import torch

import ulpack


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def batch(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(64, 32, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def train(model, opt, first, last, every, ar, run):
    for step in range(first, last + 1):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0:
            buf = io.BytesIO()
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, buf)
            r = ar.save("%s/checkpoint-%d/state.pt" % (run, step), buf.getvalue())
            print("step %d: loss %.4f, saved %d bytes as %d" % (step, loss.item(), r["raw_bytes"],
                                                                 r["stored_bytes"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archive")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--run", default="mlp")
    a = ap.parse_args()
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with ulpack.open_archive(a.archive, mode="w") as ar:
        train(model, opt, 1, a.steps, a.every, ar, a.run)
    # resume: a fresh process would start here
    with ulpack.open_archive(a.archive) as ar:
        latest = ar.latest(a.run)
        print("steps:", [s["step"] for s in ar.steps(a.run)], "latest:", latest)
        state = ar.load(latest + "/state.pt")
    model2 = make_model()
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-2)
    model2.load_state_dict(state["model"])
    opt2.load_state_dict(state["optimizer"])
    same = all(torch.equal(p, q) for p, q in zip(model.parameters(), model2.parameters()))
    print("resumed from step %d: parameters identical: %s" % (state["step"], same))
    with ulpack.open_archive(a.archive, mode="w") as ar:
        train(model2, opt2, state["step"] + 1, state["step"] + a.every, a.every, ar, a.run)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
