"""A small GPT trained with torch.distributed DDP, its attention through weft's
flash_attention and, from the same seed and data, through SDPA (the cuDNN backend on a
GPU): per-step losses of both, the largest relative gradient difference after the first
step, and the average step time (forward, backward and optimizer) of each. Exits 1 when
the two disagree beyond bf16 tolerance. docs/training.md.

    torchrun --nproc_per_node=2 -m benchmarks.train_gpt                   # 2 GPUs, NCCL
    torchrun --nproc_per_node=2 -m benchmarks.train_gpt --attention sdpa  # CPU smoke test, gloo

from the repository's parent with weft importable (or from the root of an install). The
model: token and position embeddings, `--layers` pre-norm blocks (causal multi-head
attention, a GELU MLP), a final norm and the LM head tied to the embedding; bf16
parameters and activations, AdamW. Each rank draws its own batches from one seed, so the
runs see the same data. NVLink multicast (NCCL_NVLS_ENABLE) stays off.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

LOSS_RTOL = 2e-2  # per step, relative: bf16 rounding, compounded over the steps
GRAD_RTOL = 5e-2  # after step 1: max |g_weft - g_sdpa| / max |g_sdpa| of every parameter


class Block(torch.nn.Module):
    def __init__(self, width: int, heads: int, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.out = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x):
        batch, seq, width = x.shape
        # [batch, seq, heads, head_dim] views of one projection: weft reads them in place.
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, width // self.heads).unbind(2)
        x = x + self.out(self.attention(q, k, v).reshape(batch, seq, width))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab: int, seq: int, width: int, heads: int, layers: int, attention):
        super().__init__()
        self.embed, self.position = torch.nn.Embedding(vocab, width), torch.nn.Embedding(seq, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads, attention) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width)
        for module in self.modules():  # GPT-2's initialization: the first loss near log(vocab)
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, torch.nn.Linear):
                torch.nn.init.zeros_(module.bias)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = self.norm(x) @ self.embed.weight.t()
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


def weft_attention(q, k, v):
    from weft.kernels.attention import flash_attention

    return flash_attention(q, k, v, causal=True, layout="bshd")


def sdpa_attention(q, k, v):
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    if q.is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2)


def batches(args, device):
    """The same `args.steps` batches in every run: a rank's own stream of sequences, each
    token the previous one plus a per-sequence stride (mod vocab), a pattern the model
    can learn, so the loss moves."""
    g = torch.Generator().manual_seed(args.seed * 1000 + dist.get_rank())
    for _ in range(args.steps):
        start = torch.randint(0, args.vocab, (args.batch, 1), generator=g)
        stride = torch.randint(1, 8, (args.batch, 1), generator=g)
        yield ((start + stride * torch.arange(args.seq)) % args.vocab).to(device)


def train(args, attention, device):
    """(average loss over ranks per step, every parameter's gradient after step 1, mean
    seconds per step after the first)."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(args.seed)
    model = GPT(args.vocab, args.seq, args.width, args.heads, args.layers, attention).to(device, torch.bfloat16)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses, first_grads, times = [], None, []
    for step, tokens in enumerate(batches(args, device)):
        synchronize(device)
        start = time.perf_counter()
        loss = ddp(tokens)
        loss.backward()
        if step == 0:
            first_grads = [p.grad.detach().float().clone() for p in model.parameters()]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        times.append(time.perf_counter() - start)
        reported = loss.detach().float().clone()
        dist.all_reduce(reported)
        losses.append(reported.item() / dist.get_world_size())
    return losses, first_grads, sum(times[1:]) / max(1, len(times) - 1)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compare(runs: dict, args) -> list[str]:
    """What disagrees between the weft and SDPA runs beyond the tolerances, in words."""
    (weft_losses, weft_grads, _), (sdpa_losses, sdpa_grads, _) = runs["weft"], runs["sdpa"]
    problems = []
    for step, (a, b) in enumerate(zip(weft_losses, sdpa_losses)):
        if not math.isfinite(a) or abs(a - b) > args.loss_rtol * abs(b):
            problems.append(f"step {step + 1}: loss {a:.5f} with weft, {b:.5f} with SDPA")
    worst = max_relative_difference(weft_grads, sdpa_grads)
    if not worst <= args.grad_rtol:
        problems.append(f"gradients after step 1 differ by {worst:.3g} (relative), more than {args.grad_rtol}")
    return problems


def max_relative_difference(grads, reference) -> float:
    return max(float((g - r).abs().max() / r.abs().max().clamp_min(1e-12)) for g, r in zip(grads, reference))


def report(runs: dict, args) -> None:
    names = list(runs)
    print(f"{dist.get_world_size()} ranks ({dist.get_backend()}), {args.layers} layers, width {args.width}, "
          f"{args.heads} heads, batch {args.batch} x seq {args.seq} per rank, vocab {args.vocab}, bf16")
    print("step  " + "  ".join(f"{name:>10}" for name in names))
    for step in range(args.steps):
        print(f"{step + 1:4d}  " + "  ".join(f"{runs[name][0][step]:10.5f}" for name in names))
    if len(names) == 2:
        print(f"max relative gradient difference after step 1: "
              f"{max_relative_difference(runs['weft'][1], runs['sdpa'][1]):.3g}")
    for name in names:
        print(f"{name}: {runs[name][2] * 1e3:.2f} ms per step (forward + backward + optimizer, steps 2..)")


def parse(argv=None):
    gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attention", choices=("both", "weft", "sdpa"), default="both")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=1024 if gpu else 128)
    parser.add_argument("--heads", type=int, default=8 if gpu else 2)
    parser.add_argument("--seq", type=int, default=2048 if gpu else 64)
    parser.add_argument("--batch", type=int, default=8 if gpu else 2)
    parser.add_argument("--vocab", type=int, default=8192 if gpu else 256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loss-rtol", type=float, default=LOSS_RTOL)
    parser.add_argument("--grad-rtol", type=float, default=GRAD_RTOL)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast off, before NCCL starts
    args = parse(argv)
    gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if gpu else "gloo")
    try:
        if gpu:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        chosen = {"both": ("weft", "sdpa"), "weft": ("weft",), "sdpa": ("sdpa",)}[args.attention]
        attention = {"weft": weft_attention, "sdpa": sdpa_attention}
        runs = {name: train(args, attention[name], device) for name in chosen}
        problems = compare(runs, args) if len(runs) == 2 else []
        if dist.get_rank() == 0:
            report(runs, args)
            for problem in problems:
                print("MISMATCH:", problem)
            if len(runs) == 2:
                print("weft and SDPA agree" if not problems else "weft and SDPA disagree")
        return 1 if problems else 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
