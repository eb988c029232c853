#!/usr/bin/env python3
"""PyTorch reference for Tandem's throughput benchmark: the same four classifiers at the same
reference shapes (sequence 64, vocabulary 20,000, embedding 128; CNN 100 filters x widths 3/4/5;
LSTM / GRU hidden 128; Transformer 2 pre-norm layers, 4 heads, feed-forward 256, GELU), trained
as PyTorch users train them: eager mode, cuDNN's LSTM and GRU, AdamW, cross-entropy; dropout
off, as in Tandem's benchmark. Needs a stock PyTorch (CUDA for GPU figures).

    python3 benches/pytorch_reference.py [--device cuda] [--batches 64,256] [--seconds 4]

Prints one JSON line per architecture and batch size: samples/s over timed training steps
(forward + backward + AdamW, timed after warm-up, synchronised; a step reads nothing back, as
Tandem's does not), the float32 precision of its matmuls and cuDNN's kernels, and with --launches
the CUDA kernels one training step launches (PyTorch's profiler over three steps, averaged).
"""

import argparse
import json
import time

import torch
from torch import nn

SEQ = 64
VOCAB = 20_000
EMBEDDING = 128
CLASSES = 4


def masked_mean(x, keep):
    """Mean over the real positions of [batch, seq, features]; keep is [batch, seq] floats."""
    weights = keep / keep.sum(dim=1, keepdim=True).clamp_min(1.0)
    return torch.bmm(weights.unsqueeze(1), x).squeeze(1)


class Cnn(nn.Module):
    def __init__(self, filters=100, widths=(3, 4, 5)):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, EMBEDDING)
        self.convs = nn.ModuleList(nn.Conv1d(EMBEDDING, filters, w) for w in widths)
        self.output = nn.Linear(filters * len(widths), CLASSES)

    def forward(self, tokens, keep):
        x = (self.embedding(tokens) * keep.unsqueeze(2)).transpose(1, 2)
        pooled = [torch.relu(conv(x)).amax(dim=2) for conv in self.convs]
        return self.output(torch.cat(pooled, dim=1))


class Recurrent(nn.Module):
    def __init__(self, cell, hidden=128):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, EMBEDDING)
        self.rnn = cell(EMBEDDING, hidden, batch_first=True)
        self.output = nn.Linear(hidden, CLASSES)

    def forward(self, tokens, keep):
        x = self.embedding(tokens) * keep.unsqueeze(2)
        states, _ = self.rnn(x)
        return self.output(masked_mean(states, keep))


class Transformer(nn.Module):
    def __init__(self, heads=4, layers=2, d_ff=256):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, EMBEDDING)
        self.positions = nn.Embedding(SEQ, EMBEDDING)
        layer = nn.TransformerEncoderLayer(
            EMBEDDING, heads, d_ff, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.output = nn.Linear(EMBEDDING, CLASSES)

    def forward(self, tokens, keep):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = (self.embedding(tokens) + self.positions(positions)) * keep.unsqueeze(2)
        x = self.encoder(x, src_key_padding_mask=keep == 0)
        return self.output(masked_mean(x, keep))


MODELS = {
    "cnn": Cnn,
    "lstm": lambda: Recurrent(nn.LSTM),
    "gru": lambda: Recurrent(nn.GRU),
    "transformer": Transformer,
}


def batch(size, device):
    """Token ids as Tandem's benchmark makes them (every position real) and the class labels."""
    ids = (torch.arange(size * SEQ, dtype=torch.long) * 7919) % (VOCAB - 2) + 2
    tokens = ids.reshape(size, SEQ).to(device)
    keep = torch.ones(size, SEQ, device=device)
    labels = (torch.arange(size) % CLASSES).to(device)
    return tokens, keep, labels


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(arch, size, device, seconds, launches):
    torch.manual_seed(1)
    model = MODELS[arch]().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    tokens, keep, labels = batch(size, device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(tokens, keep), labels).backward()
        optimizer.step()

    for _ in range(5):
        step()
    synchronize(device)
    steps, started = 0, time.perf_counter()
    while steps < 3 or time.perf_counter() - started < seconds:
        step()
        steps += 1
    synchronize(device)
    elapsed = time.perf_counter() - started
    result = {"architecture": arch, "batch": size, "samples_per_second": steps * size / elapsed, "steps": steps}
    if launches and device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            synchronize(device)
        kernels = sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA")
        result["kernels_per_step"] = kernels / 3
    return result


def precision():
    """The float32 precision of PyTorch's matmuls and of cuDNN's convolutions and recurrences."""
    tf32 = "TF32" if torch.backends.cudnn.allow_tf32 else "f32"
    return f"matmul {torch.get_float32_matmul_precision()} (TF32 above 'highest'), cuDNN {tf32}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--archs", default=",".join(MODELS))
    parser.add_argument("--seconds", type=float, default=4.0, help="timed seconds per architecture and batch")
    parser.add_argument("--launches", action="store_true", help="also count CUDA kernels per step (profiler)")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    for arch in args.archs.split(","):
        for size in (int(b) for b in args.batches.split(",")):
            result = measure(arch, size, device, args.seconds, args.launches)
            result.update(device=str(device), torch=torch.__version__, precision=precision())
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
