"""A qwen35moe model in PyTorch, written in the terms of the GGUF file (docs/reference.md section 5).

Every parameter is stored the way the file stores it, so export is a copy: norm weights as used (the file's
"1 + w"), `ssm_a` derived from A_log at export, value heads already in the file's tiled order (value head h reads
key head h mod Hk), the attention query projection interleaved per head as [q D | gate D]. The Gated DeltaNet
runs in a chunked (WY) form for training and in the sequential form for checking; both compute the recurrence of
reference 5.6: S <- exp(g) S; d = (v - S^T k) b; S <- S + k d^T; o = S^T q / sqrt(Dv).
"""
import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


# Evaluation hooks (export.py --bf16): how an activation is rounded before it meets a weight the BF16 file
# stores as BF16, for the products that are not nn.Linear modules. None = no rounding (training).
EXPERT_INPUT_ROUNDING = None
HEAD_INPUT_ROUNDING = None


def _round(hook, x):
    return x if hook is None else hook(x)


@dataclass
class Config:
    vocab: int = 4096
    embd: int = 256
    layers: int = 8              # executed layers; one MTP block follows
    interval: int = 4            # every 4th layer is softmax attention
    heads: int = 4
    heads_kv: int = 2
    head_dim: int = 64
    rot_dims: int = 16           # IMRoPE sections [3, 3, 2, 0]: NEOX RoPE on the first 16 dims for text
    rope_base: float = 1e7
    experts: int = 32
    experts_used: int = 8
    expert_ffn: int = 32
    shared_ffn: int = 256
    ssm_k_heads: int = 2
    ssm_v_heads: int = 4
    ssm_dim: int = 64            # Dk = Dv
    conv_kernel: int = 4
    eps: float = 1e-6
    context: int = 4096

    def recurrent(self, i):
        return i < self.layers and (i + 1) % self.interval != 0

    def as_dict(self):
        return asdict(self)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def l2_norm(x, eps):
    return x / torch.clamp(x.pow(2).sum(-1, keepdim=True).sqrt(), min=eps)


def rope_neox(x, rot, base):
    """x [B, T, H, D]: pairs (i, i + rot/2) of the first `rot` dims rotated by pos * base^(-2i/rot)."""
    T = x.shape[1]
    half = rot // 2
    inv = base ** (-2.0 * torch.arange(half, dtype=torch.float32) / rot)
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    c, s = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    a, b, rest = x[..., :half], x[..., half:rot], x[..., rot:]
    return torch.cat([a * c - b * s, a * s + b * c, rest], dim=-1)


def delta_rule_sequential(q, k, v, beta, g):
    """q, k [B, H, T, Dk], v [B, H, T, Dv], beta, g [B, H, T]: the reference recurrence, token by token."""
    B, H, T, Dk = q.shape
    S = q.new_zeros(B, H, Dk, v.shape[-1])
    out = []
    for t in range(T):
        S = S * g[:, :, t].exp()[..., None, None]
        d = (v[:, :, t] - (S * k[:, :, t, :, None]).sum(-2)) * beta[:, :, t, None]
        S = S + k[:, :, t, :, None] * d[:, :, None, :]
        out.append((S * q[:, :, t, :, None]).sum(-2))
    return torch.stack(out, 2) / math.sqrt(v.shape[-1])


def delta_rule_chunked(q, k, v, beta, g, C=64):
    """The same recurrence in chunks of C tokens: inside a chunk the deltas solve a unit lower-triangular
    system, across chunks the state is carried."""
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    pad = (-T) % C
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        beta, g = F.pad(beta, (0, pad)), F.pad(g, (0, pad))
    N = q.shape[2] // C
    q, k, v = (t.reshape(B, H, N, C, -1) for t in (q, k, v))
    beta, g = beta.reshape(B, H, N, C), g.reshape(B, H, N, C)
    cum = g.cumsum(-1)
    lower = torch.ones(C, C, dtype=torch.bool).tril()
    decay = torch.where(lower, cum[..., :, None] - cum[..., None, :], torch.tensor(-math.inf)).exp()
    strict = torch.ones(C, C, dtype=torch.bool).tril(-1)
    A = (beta[..., :, None] * (k @ k.transpose(-1, -2)) * decay).masked_fill(~strict, 0.0)
    eye = torch.eye(C).expand_as(A)
    inv = torch.linalg.solve_triangular(eye + A, eye, upper=False, unitriangular=True)
    U = inv @ (beta[..., None] * v)
    W = inv @ (beta[..., None] * cum.exp()[..., None] * k)
    qk = (q @ k.transpose(-1, -2)) * decay
    S = q.new_zeros(B, H, Dk, Dv)
    outs = []
    for n in range(N):
        d = U[:, :, n] - W[:, :, n] @ S
        outs.append((q[:, :, n] * cum[:, :, n].exp()[..., None]) @ S + qk[:, :, n] @ d)
        last = cum[:, :, n, -1]
        tail = (last[..., None] - cum[:, :, n]).exp()[..., None]
        S = last.exp()[..., None, None] * S + (k[:, :, n] * tail).transpose(-1, -2) @ d
    o = torch.stack(outs, 2).reshape(B, H, N * C, Dv)[:, :, :T]
    return o / math.sqrt(Dv)


class GatedDeltaNet(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        kd, vd = c.ssm_k_heads * c.ssm_dim, c.ssm_v_heads * c.ssm_dim
        self.qkv = nn.Linear(c.embd, 2 * kd + vd, bias=False)          # attn_qkv
        self.gate = nn.Linear(c.embd, vd, bias=False)                  # attn_gate (z)
        self.beta = nn.Linear(c.embd, c.ssm_v_heads, bias=False)       # ssm_beta
        self.alpha = nn.Linear(c.embd, c.ssm_v_heads, bias=False)      # ssm_alpha
        self.conv = nn.Parameter(torch.empty(2 * kd + vd, c.conv_kernel))   # ssm_conv1d, tap 0 oldest
        self.dt_bias = nn.Parameter(torch.empty(c.ssm_v_heads))       # ssm_dt.bias
        self.a_log = nn.Parameter(torch.empty(c.ssm_v_heads))         # ssm_a = -exp(a_log)
        self.norm = nn.Parameter(torch.ones(c.ssm_dim))                # ssm_norm
        self.out = nn.Linear(vd, c.embd, bias=False)                   # ssm_out
        nn.init.uniform_(self.conv, -1 / math.sqrt(c.conv_kernel), 1 / math.sqrt(c.conv_kernel))
        dt = torch.exp(torch.rand(c.ssm_v_heads) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
        with torch.no_grad():
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            self.a_log.copy_(torch.log(torch.empty(c.ssm_v_heads).uniform_(1, 16)))

    def forward(self, a, sequential=False):
        c = self.c
        B, T, _ = a.shape
        kd = c.ssm_k_heads * c.ssm_dim
        mix = self.qkv(a)
        u = F.conv1d(F.pad(mix.transpose(1, 2), (c.conv_kernel - 1, 0)), self.conv[:, None, :], groups=mix.shape[-1])
        u = F.silu(u.transpose(1, 2))
        q = u[..., :kd].reshape(B, T, c.ssm_k_heads, c.ssm_dim)
        k = u[..., kd:2 * kd].reshape(B, T, c.ssm_k_heads, c.ssm_dim)
        v = u[..., 2 * kd:].reshape(B, T, c.ssm_v_heads, c.ssm_dim)
        q, k = l2_norm(q, c.eps), l2_norm(k, c.eps)
        tile = c.ssm_v_heads // c.ssm_k_heads                          # value head h reads key head h mod Hk
        q, k = q.repeat(1, 1, tile, 1), k.repeat(1, 1, tile, 1)
        beta = torch.sigmoid(self.beta(a))
        g = F.softplus(self.alpha(a) + self.dt_bias) * -torch.exp(self.a_log)
        args = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), beta.transpose(1, 2), g.transpose(1, 2))
        o = (delta_rule_sequential if sequential else delta_rule_chunked)(*args).transpose(1, 2)
        z = self.gate(a).reshape(B, T, c.ssm_v_heads, c.ssm_dim)
        y = rms_norm(o, self.norm, c.eps) * F.silu(z)
        return self.out(y.reshape(B, T, -1))


class GatedAttention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.q = nn.Linear(c.embd, 2 * c.heads * c.head_dim, bias=False)   # attn_q: per head [q D | gate D]
        self.k = nn.Linear(c.embd, c.heads_kv * c.head_dim, bias=False)
        self.v = nn.Linear(c.embd, c.heads_kv * c.head_dim, bias=False)
        self.q_norm = nn.Parameter(torch.ones(c.head_dim))
        self.k_norm = nn.Parameter(torch.ones(c.head_dim))
        self.o = nn.Linear(c.heads * c.head_dim, c.embd, bias=False)

    def forward(self, a, sequential=False):
        c = self.c
        B, T, _ = a.shape
        qg = self.q(a).reshape(B, T, c.heads, 2, c.head_dim)
        q, gate = qg[..., 0, :], qg[..., 1, :]
        k = self.k(a).reshape(B, T, c.heads_kv, c.head_dim)
        v = self.v(a).reshape(B, T, c.heads_kv, c.head_dim)
        q = rope_neox(rms_norm(q, self.q_norm, c.eps), c.rot_dims, c.rope_base)
        k = rope_neox(rms_norm(k, self.k_norm, c.eps), c.rot_dims, c.rope_base)
        group = c.heads // c.heads_kv                                   # heads 0..G-1 share kv head 0
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(c.head_dim)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
        o = torch.einsum("bhts,bshd->bthd", s.softmax(-1), v)
        return self.o((o * torch.sigmoid(gate)).reshape(B, T, -1))


class MoE(nn.Module):
    """Routed experts (softmax, top-K, renormalised) plus the sigmoid-gated shared expert."""

    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        X, Fe, E = c.experts, c.expert_ffn, c.embd
        self.router = nn.Parameter(torch.randn(X, E) * 0.02)           # ffn_gate_inp, F32
        self.gate_exps = nn.Parameter(torch.randn(X, Fe, E) * 0.02)
        self.up_exps = nn.Parameter(torch.randn(X, Fe, E) * 0.02)
        self.down_exps = nn.Parameter(torch.randn(X, E, Fe) * 0.02)
        self.shexp_gate = nn.Parameter(torch.zeros(E))                  # ffn_gate_inp_shexp
        self.gate_shexp = nn.Linear(E, c.shared_ffn, bias=False)
        self.up_shexp = nn.Linear(E, c.shared_ffn, bias=False)
        self.down_shexp = nn.Linear(c.shared_ffn, E, bias=False)
        self.last_usage = None                                          # [X] picks in the last forward

    def forward(self, f):
        c = self.c
        shape = f.shape
        f = f.reshape(-1, shape[-1])
        p = (f @ self.router.t()).softmax(-1)
        w, ids = p.topk(c.experts_used, dim=-1)
        w = w / torch.clamp(w.sum(-1, keepdim=True), min=2.0 ** -14)
        out = torch.zeros_like(f)
        for e in range(c.experts):
            tok, slot = (ids == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            x = _round(EXPERT_INPUT_ROUNDING, f[tok])
            a = F.silu(x @ self.gate_exps[e].t()) * (x @ self.up_exps[e].t())
            y = _round(EXPERT_INPUT_ROUNDING, a) @ self.down_exps[e].t()
            out.index_add_(0, tok, y * w[tok, slot, None])
        sh = self.down_shexp(F.silu(self.gate_shexp(f)) * self.up_shexp(f))
        out = out + torch.sigmoid(f @ self.shexp_gate)[:, None] * sh
        picked = torch.zeros(c.experts).index_add_(0, ids.reshape(-1), torch.ones(ids.numel()))
        self.last_usage = picked.detach()
        # Switch-style balance: X * sum_e (share of picks of e) * (mean probability of e).
        self.aux = c.experts * ((picked / ids.numel()) * p.mean(0)).sum()
        return out.reshape(shape)


class Block(nn.Module):
    def __init__(self, c: Config, recurrent: bool):
        super().__init__()
        self.recurrent = recurrent
        self.attn_norm = nn.Parameter(torch.ones(c.embd))
        self.mixer = GatedDeltaNet(c) if recurrent else GatedAttention(c)
        self.post_attention_norm = nn.Parameter(torch.ones(c.embd))
        self.ffn = MoE(c)
        self.eps = c.eps

    def forward(self, h, sequential=False):
        h = h + self.mixer(rms_norm(h, self.attn_norm, self.eps), sequential)
        return h + self.ffn(rms_norm(h, self.post_attention_norm, self.eps))


class Model(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.embed = nn.Parameter(torch.randn(c.vocab, c.embd) * 0.02)       # token_embd
        self.blocks = nn.ModuleList(Block(c, c.recurrent(i)) for i in range(c.layers))
        self.output_norm = nn.Parameter(torch.ones(c.embd))
        self.output = nn.Parameter(torch.randn(c.vocab, c.embd) * 0.02)
        # MTP (nextn) block: predicts token t+2 from the final normed state of t and the embedding of t+1.
        self.mtp = Block(c, recurrent=False)
        self.mtp_enorm = nn.Parameter(torch.ones(c.embd))
        self.mtp_hnorm = nn.Parameter(torch.ones(c.embd))
        self.mtp_eh_proj = nn.Linear(2 * c.embd, c.embd, bias=False)
        self.mtp_head_norm = nn.Parameter(torch.ones(c.embd))
        scale = 0.02 / math.sqrt(2 * (c.layers + 1))
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        for b in list(self.blocks) + [self.mtp]:
            nn.init.normal_(b.mixer.out.weight if b.recurrent else b.mixer.o.weight, std=scale)
            nn.init.normal_(b.ffn.down_shexp.weight, std=scale)
            with torch.no_grad():
                b.ffn.down_exps.normal_(std=scale)

    def hidden(self, tokens, sequential=False):
        h = self.embed[tokens]
        for b in self.blocks:
            h = b(h, sequential)
        return rms_norm(h, self.output_norm, self.c.eps)

    def logits(self, tokens, sequential=False):
        return _round(HEAD_INPUT_ROUNDING, self.hidden(tokens, sequential)) @ self.output.t()

    def mtp_logits(self, hidden, next_tokens):
        """hidden [B, T, E] (final normed state of positions 0..T-1), next_tokens [B, T] (the tokens at 1..T):
        logits for the tokens at 2..T+1."""
        c = self.c
        e = rms_norm(self.embed[next_tokens], self.mtp_enorm, c.eps)
        g = rms_norm(hidden, self.mtp_hnorm, c.eps)
        x = self.mtp(self.mtp_eh_proj(torch.cat([e, g], -1)))
        return _round(HEAD_INPUT_ROUNDING, rms_norm(x, self.mtp_head_norm, c.eps)) @ self.output.t()

    def aux_loss(self):
        return sum(b.ffn.aux for b in list(self.blocks) + [self.mtp]) / (len(self.blocks) + 1)
