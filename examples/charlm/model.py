"""A small GPT-style character-level language model on the Python standard library's source.

The text ships with every Python: the top-level ``*.py`` files of the running
interpreter's own standard library (``sysconfig.get_paths()["stdlib"]``), sorted by name.
Every tenth of them (the 10th, 20th, ...) is validation text, the others training text:
the same split on every machine of one Python version, and no file on both sides.

The model is a decoder-only transformer (as nanoGPT's): token and position embeddings,
pre-norm blocks of causal self-attention and an MLP, a final LayerNorm and an output layer
tied to the token embedding. Its metric ``val_loss`` is the cross-entropy in nats per
character. The large-batch recipe comes from the hyperparameters through the runtime's
helpers, as in the digits example; under ``optimizations.mixed_precision: bf16`` the loop
runs it in bf16 autocast.

Hyperparameters read here: ``global_batch_size`` (required), ``block_size`` (256),
``n_layer`` (6), ``n_embd`` (384), ``head_size`` (64; ``n_embd / head_size`` heads),
``dropout`` (0.0), ``grad_clip`` (1.0; 0 turns clipping off) and those of
:func:`trials.runtime.build_optimizer` and :func:`trials.runtime.build_lr_scheduler`.
``data.train_chars`` and ``data.val_windows`` cut the text down (a CPU-sized search).
"""

from __future__ import annotations

import math
import sysconfig
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from trials.runtime import (
    DataLoader,
    PyTorchTrial,
    PyTorchTrialContext,
    build_lr_scheduler,
    build_optimizer,
)

VALIDATION_EVERY = 10  # every 10th file, counted from 1, is validation text


def stdlib_files() -> list[Path]:
    """The top-level ``*.py`` files of this interpreter's standard library, sorted by name."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"), key=lambda p: p.name)


@dataclass(frozen=True)
class Corpus:
    """Training and validation text as character ids; id 0 is a character training lacks."""

    train: torch.Tensor
    val: torch.Tensor
    vocab: str  # vocab[i - 1] is the character of id i

    @property
    def vocab_size(self) -> int:
        return len(self.vocab) + 1

    def unigram_loss(self, targets: torch.Tensor) -> float:
        """The loss (nats/char) on ``targets`` of predicting every character by its
        frequency in the training text (add-one smoothed): the bar a model must clear."""
        counts = torch.bincount(self.train, minlength=self.vocab_size).double() + 1.0
        return float(-(counts / counts.sum()).log()[targets].mean())


def load_corpus() -> Corpus:
    """Read and split the standard library's source (about 4.7 MB on Python 3.11)."""
    train_parts: list[str] = []
    val_parts: list[str] = []
    for number, path in enumerate(stdlib_files(), start=1):
        text = path.read_text(encoding="utf-8", errors="replace")
        (val_parts if number % VALIDATION_EVERY == 0 else train_parts).append(text)
    train, val = _code_points("".join(train_parts)), _code_points("".join(val_parts))
    chars = torch.unique(train)  # sorted
    table = torch.zeros(int(max(train.max(), val.max())) + 1, dtype=torch.long)
    table[chars] = torch.arange(1, len(chars) + 1)
    return Corpus(table[train], table[val], "".join(map(chr, chars.tolist())))


def _code_points(text: str) -> torch.Tensor:
    # A Python loop over 4.7 million characters would cost every cold rank a second.
    return torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32).long()


class Windows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Windows of ``block_size`` characters and the characters that follow each one."""

    def __init__(self, ids: torch.Tensor, block_size: int, count: int | None = None) -> None:
        available = (len(ids) - 1) // block_size
        count = available if count is None else min(count, available)
        # Spread over the whole text when only some of its windows are kept.
        self.starts = torch.arange(count) * (available // count) * block_size
        self.ids, self.block_size = ids, block_size

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = int(self.starts[index])
        chunk = self.ids[start : start + self.block_size + 1]
        return chunk[:-1], chunk[1:]

    def targets(self) -> torch.Tensor:
        """Every character the windows predict, in order."""
        return torch.cat([self[i][1] for i in range(len(self))])


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.dropout = n_head, dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        # Flash or memory-efficient attention where the device has it.
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    """Pre-norm: x + attn(ln(x)), then x + mlp(ln(x)); the residual path stays unnormalised."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.mlp = nn.Sequential(
            OrderedDict(
                fc=nn.Linear(n_embd, 4 * n_embd),
                gelu=nn.GELU(),
                proj=nn.Linear(4 * n_embd, n_embd),
                drop=nn.Dropout(dropout),
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharGPT(nn.Module):
    """Next-character logits for every position of a batch of windows."""

    def __init__(
        self,
        vocab: int,
        block_size: int,
        *,
        n_layer: int,
        n_embd: int,
        n_head: int,
        dropout: float,
    ) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, n_embd), nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*(Block(n_embd, n_head, dropout) for _ in range(n_layer)))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied: one matrix reads and writes characters
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                # GPT-2's init: the projections into the residual path shrink with depth.
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.blocks(self.drop(self.tok(idx) + self.pos(positions)))
        return self.head(self.ln_f(x))


class CharLMTrial(PyTorchTrial):
    """Predict the next character of Python source; reports ``val_loss`` in nats/char."""

    def __init__(self, context: PyTorchTrialContext) -> None:
        super().__init__(context)
        hparams, data = context.hparams, context.data
        # Kept in the worker's cache: a warm worker's next trial finds the text read.
        if "charlm" not in context.cache:
            context.cache["charlm"] = load_corpus()
        corpus: Corpus = context.cache["charlm"]
        block_size = int(hparams.get("block_size", 256))
        train_chars = data.get("train_chars")
        train = corpus.train if train_chars is None else corpus.train[: int(train_chars)]
        self.train_set = Windows(train, block_size)
        self.val_set = Windows(corpus.val, block_size, data.get("val_windows"))
        if context.is_chief:
            print(
                f"charlm: {len(train):,} training and {len(corpus.val):,} validation characters "
                f"({len(self.val_set)} windows evaluated), {corpus.vocab_size} ids; "
                f"unigram loss {corpus.unigram_loss(self.val_set.targets()):.4f} nats/char",
                flush=True,
            )
        n_embd = int(hparams.get("n_embd", 384))
        model = CharGPT(
            corpus.vocab_size,
            block_size,
            n_layer=int(hparams.get("n_layer", 6)),
            n_embd=n_embd,
            n_head=n_embd // int(hparams.get("head_size", 64)),
            dropout=float(hparams.get("dropout", 0.0)),
        )
        self.model = context.wrap_model(model)
        # Weight decay on the matrices only, not on biases and LayerNorm gains (as GPT-2).
        matrices = [p for p in model.parameters() if p.dim() >= 2]
        vectors = [p for p in model.parameters() if p.dim() < 2]
        groups: list[dict[str, Any]] = [
            {"params": matrices},
            {"params": vectors, "weight_decay": 0.0},
        ]
        self.optimizer = context.wrap_optimizer(
            build_optimizer(
                groups,
                hparams,
                global_batch_size=context.global_batch_size,
                world_size=context.world_size,
            )
        )
        self.scheduler = context.wrap_lr_scheduler(
            build_lr_scheduler(
                self.optimizer,
                hparams,
                steps_per_epoch=context.optimizer_steps_per_epoch(len(self.train_set)),
                total_steps=context.total_optimizer_steps(len(self.train_set)),
            )
        )
        self.grad_clip = float(hparams.get("grad_clip", 1.0))

    def build_training_data_loader(self) -> DataLoader:
        return DataLoader(self.train_set, shuffle=True)

    def build_validation_data_loader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.context.per_slot_batch_size)

    def _loss(self, batch: Any) -> torch.Tensor:
        x, y = batch
        logits = self.model(x)
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        loss = self._loss(batch)
        self.context.backward(loss)
        clip = self.grad_clip
        self.context.step_optimizer(
            self.optimizer,
            clip_grads=(lambda ps: nn.utils.clip_grad_norm_(ps, clip)) if clip > 0 else None,
        )
        return {"loss": loss, "lr": self.optimizer.param_groups[0]["lr"]}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return {"val_loss": self._loss(batch)}
