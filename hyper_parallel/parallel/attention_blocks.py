"""Softmax attention at explicit global positions, whole or block by block, and the merge of blocks.

CP's all-gather and Ulysses attend over the whole sequence at once (``attend``). Ring attention sees the
keys one block at a time, so it needs attention that can be resumed: ``block_attention`` returns a
block's output *normalised within the block* together with each query row's log-sum-exp of scores,

    lse = log(sum_j exp(s_j)),   out = sum_j exp(s_j - lse) v_j,

and ``merge_partial`` folds a new block into the running result exactly (the online softmax of
FlashAttention, written with log-sum-exps as in torch's ring attention and ring-flash-attention):

    lse_new = log(exp(lse_a) + exp(lse_b))
    out_new = exp(lse_a - lse_new) out_a + exp(lse_b - lse_new) out_b

After the last block, ``out`` is softmax attention over every key and ``lse`` the log of the full
softmax denominator, which is all backward needs to recompute any block's probabilities
(``block_attention_backward``): p = exp(s - lse), without keeping a single score from forward.

Masks are ``query position >= key position`` on global positions; a block is either computed whole
(``masked=False``: every key visible to every query) or with that mask (``masked=True``). Scores run
in ``dtype`` (float32, or float64 for float64 inputs); grouped-query K/V heads are repeated here,
after any communication, so only the few K/V heads travel.
"""

from __future__ import annotations

import torch


def expand_heads(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention: repeat K/V heads to q's head count (only the few are sent)."""
    hq, hk = q.shape[1], kv.shape[1]
    if hq == hk:
        return kv
    if hq % hk:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hk})")
    return kv.repeat_interleave(hq // hk, dim=1)


def fold_heads(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The adjoint of ``expand_heads``: sum the gradients of each K/V head's repeats."""
    batch, heads, *rest = grad.shape
    if heads == kv_heads:
        return grad
    return grad.reshape(batch, kv_heads, heads // kv_heads, *rest).sum(dim=2)


def checked_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``positions`` as int64 on q's device, after checking that q, k, v are [batch, heads, s_local, head_dim]
    of the same tokens (K/V may have fewer heads: GQA) with one position per token; checked before any
    rank enters a collective, so a bad shape is an error on every rank rather than a hang."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be [batch, heads, seq, head_dim], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    s_local = q.shape[2]
    if k.shape[2] != s_local or v.shape[2] != s_local or k.shape[:2] != v.shape[:2] or k.shape[0] != q.shape[0]:
        raise ValueError(f"q, k, v must hold the same tokens: got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    positions = positions.to(device=q.device, dtype=torch.long)
    if positions.shape != (s_local,):
        raise ValueError(f"positions must be [{s_local}] (one per local token), got shape {tuple(positions.shape)}")
    expand_heads(q, k[:, :, :0])  # the GQA head counts
    return positions


def scores(q, k, q_pos, k_pos, masked: bool, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """q k^T * scale in ``dtype``, with -inf where a query precedes a key when ``masked``."""
    result = torch.matmul(q.to(dtype), expand_heads(q, k).to(dtype).transpose(-2, -1)) * scale
    if masked:
        result = result.masked_fill(q_pos[:, None] < k_pos[None, :], float("-inf"))
    return result


def attend(q, k, v, q_pos, k_pos, causal, scale, dtype):
    """Softmax attention of q over k/v at explicit global positions (mask: query pos >= key pos),
    scores in ``dtype``, output in q's dtype. CP's all-gather, Ulysses and a cp group of one use it."""
    probs = torch.softmax(scores(q, k, q_pos, k_pos, causal, scale, dtype), dim=-1)
    return torch.matmul(probs, expand_heads(q, v).to(dtype)).to(q.dtype)


def block_attention(q, k, v, q_pos, k_pos, masked: bool, scale: float, dtype: torch.dtype):
    """One block's (out, lse): out [.., sq, d] normalised over this block's keys, lse [.., sq]. A row
    whose keys are all masked has lse -inf and out 0 (it merges as nothing)."""
    s = scores(q, k, q_pos, k_pos, masked, scale, dtype)
    lse = torch.logsumexp(s, dim=-1)
    probs = torch.exp(s - _finite(lse)[..., None])
    return torch.matmul(probs, expand_heads(q, v).to(dtype)), lse


def merge_partial(out, lse, block_out, block_lse):
    """The running (out, lse) with one more block folded in; exact, in any order of blocks."""
    merged = torch.logaddexp(lse, block_lse)
    safe = _finite(merged)
    return out * torch.exp(lse - safe)[..., None] + block_out * torch.exp(block_lse - safe)[..., None], merged


def block_attention_backward(q, k, v, dout, delta, lse, q_pos, k_pos, masked: bool, scale: float, dtype):
    """Gradients of one block from the final ``lse`` (FlashAttention's backward): the probabilities are
    recomputed, p = exp(s - lse); ``delta`` = rowsum(dout * out) of the final output. Returns dq [like
    q], dk and dv [like k and v, GQA repeats summed], all in ``dtype``."""
    probs = torch.exp(scores(q, k, q_pos, k_pos, masked, scale, dtype) - _finite(lse)[..., None])
    dout = dout.to(dtype)
    k_all, v_all = expand_heads(q, k).to(dtype), expand_heads(q, v).to(dtype)
    dv = torch.matmul(probs.transpose(-2, -1), dout)
    dscores = probs * (torch.matmul(dout, v_all.transpose(-2, -1)) - delta[..., None])
    dq = torch.matmul(dscores, k_all) * scale
    dk = torch.matmul(dscores.transpose(-2, -1), q.to(dtype)) * scale
    return dq, fold_heads(dk, k.shape[1]), fold_heads(dv, v.shape[1])


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """``lse`` with -inf (rows that saw no key yet) as 0, so exp(x - lse) stays 0 instead of NaN."""
    return torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
