"""A Lightning script: a tiny language model from a config, random tokens.

torchrun --nproc-per-node=2 lightning_plain.py --max_steps 40 [--resume PATH]
"""

import argparse
import os
import time
from typing import Any

import lightning as L  # noqa: N812 - as Lightning's users write it
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--max_steps", type=int, default=40)
parser.add_argument("--log_every_n_steps", type=int, default=5)
parser.add_argument("--save_steps", type=int, default=20)
parser.add_argument("--output_dir", default="out")
parser.add_argument("--step_s", type=float, default=0.0, help="the least time a step takes")
parser.add_argument("--resume", default=None, help="a checkpoint file")
args = parser.parse_args()
CONFIG = {"vocab": 256, "seq_len": 32, "dim": 64, "layers": 2}


class TinyLM(L.LightningModule):
    def __init__(self, vocab: int, seq_len: int, dim: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        block = nn.TransformerEncoderLayer(dim, nhead=2, dim_feedforward=4 * dim, batch_first=True)
        self.blocks = nn.TransformerEncoder(block, layers)
        self.head = nn.Linear(dim, vocab)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if args.step_s:
            time.sleep(args.step_s)
        logits = self.head(self.blocks(self.embed(batch[:, :-1])))
        targets = batch[:, 1:].reshape(-1)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


L.seed_everything(0)
tokens = torch.randint(0, CONFIG["vocab"], (4096, CONFIG["seq_len"] + 1))
data: torch.utils.data.DataLoader[Any] = torch.utils.data.DataLoader(
    tokens,  # type: ignore[arg-type]  # a tensor indexes as a dataset does
    batch_size=4,
    shuffle=True,
)
callbacks: list[Any] = []  # the Trainer's callbacks
resume = args.resume or None  # what training starts from
trainer = L.Trainer(
    accelerator="gpu" if torch.cuda.is_available() else "cpu",
    devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
    num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")),  # torchrun's node count
    strategy="ddp" if "WORLD_SIZE" in os.environ else "auto",
    max_steps=args.max_steps,
    log_every_n_steps=args.log_every_n_steps,
    default_root_dir=args.output_dir,
    callbacks=[ModelCheckpoint(every_n_train_steps=args.save_steps, save_top_k=-1), *callbacks],
    logger=False,
    enable_model_summary=False,
)
trainer.fit(TinyLM(**CONFIG), data, ckpt_path=resume)
print(f"rank {os.environ.get('RANK', '0')}: trained to step {trainer.global_step}")
