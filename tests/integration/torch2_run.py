# SPDX-License-Identifier: MIT
"""torch2_run.py - the real-torch side of tests/integration/torch2.sh: what
torch 2.x and transformers write, saved with their own calls.

  save DIR PLAIN [HF [LIGHTNING]]
      a small MLP trained with AdamW; after each of 3 steps, into every
      DIR/run/checkpoint-<s>: torch.save of its state_dict (model.pt), of the
      optimizer's state_dict (optimizer.pt), of the state_dict as bf16
      (bf16.pt) and as float8_e4m3fn and float8_e5m2 (fp8.pt); then, with
      HF, "hf HF 6" and, with LIGHTNING, "lightning LIGHTNING" (one process:
      transformers and lightning take seconds to import).
  lightning OUT
      a small LightningModule fitted for 8 steps (3 batches an epoch) by a
      Lightning Trainer whose ModelCheckpoint writes OUT/epoch=E-step=N.ckpt
      every 2 steps (E from 0 to 2).
  ckpts DIR
      torch.load(weights_only=True) of DIR's Lightning checkpoints: each
      holds the global step of its name and the model's state_dict.
  load DIR REF
      torch.load(weights_only=True) of every .pt under DIR and REF: equal.
  hf OUT STEPS [RESUME]
      a tiny GPT-2 built from a config (no download) trained by transformers'
      Trainer for STEPS steps, saving checkpoint-N every 2 steps into OUT;
      with RESUME, train(resume_from_checkpoint=RESUME) first.
  resume OUT CKPT REF
      "hf OUT 6 CKPT", then the tensors of OUT/checkpoint-6/model.safetensors
      and REF are equal.
"""
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
import torch  # noqa: E402


def save(dirs):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for s in range(1, 4):
        for _ in range(3):
            x = torch.randn(16, 64, generator=g)
            (m(x) - x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        sd = m.state_dict()
        for d in dirs:
            c = "%s/run/checkpoint-%d" % (d, s)
            os.makedirs(c, exist_ok=True)
            torch.save(sd, c + "/model.pt")
            torch.save(opt.state_dict(), c + "/optimizer.pt")
            torch.save({k: v.to(torch.bfloat16) for k, v in sd.items()}, c + "/bf16.pt")
            torch.save({"e4m3": {k: v.to(torch.float8_e4m3fn) for k, v in sd.items()},
                        "e5m2": {k: v.to(torch.float8_e5m2) for k, v in sd.items()}}, c + "/fp8.pt")


def equal(a, b, where):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for k in a:
            equal(a[k], b[k], "%s.%s" % (where, k))
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            equal(x, y, "%s.%d" % (where, i))
    else:
        assert a == b, where


def load(d, ref):
    n = 0
    for root, _, files in os.walk(ref):
        for f in sorted(files):
            if f.endswith(".pt"):
                r = os.path.join(root, f)
                p = os.path.join(d, os.path.relpath(r, ref))
                equal(torch.load(p, weights_only=True), torch.load(r, weights_only=True), p)
                n += 1
    assert n == 12, n
    print("%d torch files equal through weights_only=True loads" % n)


def hf(out, steps, resume):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.set_num_threads(1)

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            x = torch.randint(0, 256, (32,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": x, "labels": x}

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=256, n_positions=32, n_embd=64, n_layer=2, n_head=2)
    args = TrainingArguments(output_dir=out, max_steps=steps, save_steps=2, per_device_train_batch_size=4,
                             logging_steps=1, report_to=[], use_cpu=True, seed=0, dataloader_num_workers=0,
                             disable_tqdm=True)
    tr = Trainer(model=GPT2LMHeadModel(cfg), args=args, train_dataset=Tokens())
    tr.train(resume_from_checkpoint=resume or None)
    assert tr.state.global_step == steps, tr.state.global_step
    print("trained to step %d%s" % (tr.state.global_step, " (resumed from %s)" % resume if resume else ""))


def lightning(out):
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    torch.set_num_threads(1)

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))

        def training_step(self, batch, i):
            return (self.net(batch) - batch).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.randn(24, 32), batch_size=8)
    ck = ModelCheckpoint(dirpath=out, every_n_train_steps=2, save_top_k=-1)
    tr = L.Trainer(max_steps=8, accelerator="cpu", devices=1, callbacks=[ck], logger=False,
                   enable_progress_bar=False, enable_model_summary=False)
    tr.fit(Net(), data)
    print("lightning:", sorted(os.listdir(out)))


def ckpts(d):
    names = sorted(os.listdir(d))
    assert names == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt", "epoch=1-step=6.ckpt", "epoch=2-step=8.ckpt"], names
    for n in names:
        c = torch.load(os.path.join(d, n), weights_only=True)
        assert c["global_step"] == int(n.split("step=")[1].split(".")[0]), (n, c["global_step"])
        assert c["state_dict"]["net.0.weight"].shape == (128, 32), n
    print("%d Lightning checkpoints loaded" % len(names))


def same(a, b):  # the tensors of two safetensors files
    from safetensors.torch import load_file
    ta, tb = load_file(a), load_file(b)
    assert ta.keys() == tb.keys()
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k
    print("%d tensors equal" % len(ta))


def main():
    cmd = sys.argv[1]
    if cmd == "save":
        save(sys.argv[2:4])
        if len(sys.argv) > 4:
            hf(sys.argv[4], 6, "")
        if len(sys.argv) > 5:
            lightning(sys.argv[5])
    elif cmd == "load":
        load(sys.argv[2], sys.argv[3])
    elif cmd == "hf":
        hf(sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "")
    elif cmd == "lightning":
        lightning(sys.argv[2])
    elif cmd == "ckpts":
        ckpts(sys.argv[2])
    elif cmd == "resume":
        hf(sys.argv[2], 6, sys.argv[3])
        same(sys.argv[2] + "/checkpoint-6/model.safetensors", sys.argv[4])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
