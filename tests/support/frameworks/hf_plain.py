"""A Hugging Face `Trainer` script: a tiny GPT-2 from a config, random tokens.

torchrun --nproc-per-node=2 hf_plain.py --max_steps 40 [--resume latest|PATH]
"""

import argparse
import os
import time
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("--max_steps", type=int, default=40)
parser.add_argument("--logging_steps", type=int, default=5)
parser.add_argument("--save_steps", type=int, default=20)
parser.add_argument("--output_dir", default="out")
parser.add_argument("--step_s", type=float, default=0.0, help="the least time a step takes")
parser.add_argument("--resume", default=None, help="latest, or a checkpoint dir")
args = parser.parse_args()
if args.resume == "latest":
    args.resume = True


class RandomTokens(torch.utils.data.Dataset[dict[str, Any]]):
    def __init__(self, n: int, seq_len: int, vocab: int) -> None:
        seeded = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, vocab, (n, seq_len), generator=seeded)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if args.step_s:
            time.sleep(args.step_s / 4)  # four samples a step on each rank
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=64, vocab_size=256)
model = GPT2LMHeadModel(config)
training_args = TrainingArguments(
    output_dir=args.output_dir,
    max_steps=args.max_steps,
    per_device_train_batch_size=4,
    learning_rate=1e-3,
    logging_steps=args.logging_steps,
    save_steps=args.save_steps,
    report_to=[],
    use_cpu=not torch.cuda.is_available(),
    dataloader_num_workers=0,
    seed=0,
)
callbacks: list[Any] = []  # the Trainer's callbacks
resume = args.resume or None  # what training starts from
data = RandomTokens(4096, 32, 256)
trainer = Trainer(model=model, args=training_args, train_dataset=data, callbacks=callbacks)
trainer.train(resume_from_checkpoint=resume)
print(f"rank {os.environ.get('RANK', '0')}: trained to step {trainer.state.global_step}")
