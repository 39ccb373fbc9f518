"""A mini decoder-only transformer (Llama-shaped, TorchTitan's names) small enough for 8 ranks on 2 cores.

tok_embeddings -> layers[i] (attention_norm, attention{wq,wk,wv,wo}, ffn_norm, feed_forward{w1,w2}
or a MoE) -> norm -> output. Rotary position embeddings take explicit positions, so context
parallelism (each rank holding non-contiguous chunks of the sequence) needs no position parameter.
The attention core is swappable (``Attention.core``): CP replaces it with its distributed version.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from hyper_parallel.models.layers import FeedForward, RMSNorm

AttentionCore = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TransformerConfig:
    vocab_size: int = 64
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    hidden: int = 64
    seq_len: int = 16
    rope_theta: float = 10000.0
    moe_layers: tuple[int, ...] = ()  # indices of layers whose feed-forward is a MoE
    num_experts: int = 4
    top_k: int = 2
    moe_hidden: int = 32
    shared_expert: bool = False

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate pairs of channels of ``x`` [batch, heads, seq, head_dim] by angles of their global position."""
    half = x.shape[-1] // 2
    freqs = 1.0 / theta ** (torch.arange(half, dtype=torch.float32, device=x.device) / half)
    angles = positions.to(torch.float32)[:, None] * freqs[None, :]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Plain causal attention over the whole (local) sequence; ``positions`` is unused (contiguous)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.core: AttentionCore = causal_attention

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        head_dim = self.config.head_dim
        # -1 heads: under TP the colwise projections hold n_heads / tp heads on each rank
        q, k, v = (w(x).view(batch, seq, -1, head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = rotary(q, positions, self.config.rope_theta), rotary(k, positions, self.config.rope_theta)
        out = self.core(q, k, v, positions)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class TransformerBlock(nn.Module):
    def __init__(self, config: TransformerConfig, layer_id: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.d_model)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.d_model)
        if layer_id in config.moe_layers:
            from hyper_parallel.models.moe import MoE, MoEConfig

            self.feed_forward = MoE(
                MoEConfig(config.d_model, config.moe_hidden, config.num_experts, config.top_k, config.shared_expert)
            )
        else:
            self.feed_forward = FeedForward(config.d_model, config.hidden)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), positions)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(TransformerBlock(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model)
        self.output = nn.Linear(config.d_model, config.vocab_size, bias=False)
        with torch.no_grad():  # norms not all ones, so a wrongly reduced norm gradient shows in the numbers
            for module in self.modules():
                if isinstance(module, RMSNorm):
                    module.weight.uniform_(0.5, 1.5)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``tokens`` [batch, seq]; ``positions`` [seq] global positions (default 0..seq-1)."""
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, positions)
        return self.output(self.norm(h))


def token_batch(config: TransformerConfig, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed next-token batch: tokens [batch, seq_len] and targets (the tokens shifted by one)."""
    generator = torch.Generator().manual_seed(seed)
    stream = torch.randint(
        0, config.vocab_size, (batch, config.seq_len + 1), generator=generator, device=generator.device
    )
    return stream[:, :-1].contiguous(), stream[:, 1:].contiguous()


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
