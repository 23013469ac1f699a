"""The trained model's forward pass in torch: refimpl's definitions, batched and differentiable.

Parameters are held under their GGUF tensor names, in numpy shapes, with the values llama.cpp reads
— so export is a copy (``train/export.py``) and every line below can be read against refimpl:

* norms: ``rms_norm(x) · w`` with w the *stored* weight. Qwen3.5's RMSNorm computes x̂·(1+w) and
  llama.cpp's converter stores 1+w; here the stored value is the parameter itself (initialised to 1),
  except ``ssm_norm``, which Qwen stores plain and which is used plain (refimpl.model.ops.rms_norm_w);
* gated attention (refimpl.model.attention): Q and the output gate interleaved per head, q/k RMSNorm,
  IMRoPE with refimpl's own cos/sin tables (``rope_cache``), causal GQA softmax(q·k/√D),
  ``o ⊙ sigmoid(gate)``;
* Gated DeltaNet (refimpl.model.deltanet): causal depthwise conv with the kernel's last column on the
  current token, SiLU, L2-normalised q/k, value head j on key head j mod Hk,
  ``g = softplus(alpha + dt_bias) · ssm_a`` with ``ssm_a = −exp(A_log)``, β = sigmoid(beta), the
  gated delta rule read out from the updated state, gated RMSNorm with silu(z);
* MoE (refimpl.model.moe): softmax over all experts, top-K, renormalised (clamp 2⁻¹⁴), SwiGLU experts
  weighted after the down projection, plus the shared expert times sigmoid(w·x);
* the nextn head (refimpl.model.mtp): row p is [enorm(embed(x_p)) ‖ hnorm(h_{p−1})] → eh_proj → an
  attention block with its own causal context → MoE → shared_head_norm → the trunk's LM head.

Only ``A_log`` is not a GGUF tensor: the file stores ``ssm_a = −exp(A_log)`` (the converter's transform).
Shapes: B sequences of T tokens; the letters of docs/architecture.md otherwise.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from refimpl.model.attention import rope_cache
from refimpl.fixtures.presets import FixturePreset
from refimpl.fixtures.weights import build_weights

A_LOG = "A_log"  # blk.i.A_log: the parameter behind blk.i.ssm_a


def _key(name: str) -> str:
    return name.replace(".", "__")


class TrainedModel(torch.nn.Module):
    """All tensors of a qwen35moe file with an MTP block (trunk + ``blk.L.nextn.shared_head_norm``)."""

    def __init__(self, p: FixturePreset, seed: int, max_len: int, chunked: bool = True):
        super().__init__()
        self.p, self.chunked = p, chunked
        self.params = torch.nn.ParameterDict()
        for name, value in initial_tensors(p, seed).items():
            self.params[_key(name)] = torch.nn.Parameter(torch.from_numpy(value))
        cos, sin = zip(*(rope_cache(pos, p.rope_dim, p.rope_sections, p.rope_freq_base, 1.0) for pos in range(max_len)))
        self.register_buffer("cos", torch.from_numpy(np.stack(cos)), persistent=False)  # [Tmax, R/2]
        self.register_buffer("sin", torch.from_numpy(np.stack(sin)), persistent=False)

    def w(self, name: str) -> torch.Tensor:
        return self.params[_key(name)]

    def gguf_tensors(self) -> dict[str, np.ndarray]:
        """name → float32 array, the values the GGUF stores (``A_log`` becomes ``ssm_a``)."""
        out = {}
        for key, value in self.params.items():
            name, arr = key.replace("__", "."), value.detach().to(torch.float32).cpu().numpy()
            if name.endswith(A_LOG):
                name, arr = name[: -len(A_LOG)] + "ssm_a", (-np.exp(arr.astype(np.float64))).astype(np.float32)
            out[name] = np.ascontiguousarray(arr)
        return out

    # ---- blocks ---------------------------------------------------------------------------------

    def rms_norm(self, x: torch.Tensor, name: str | None) -> torch.Tensor:
        """refimpl.model.ops.rms_norm_w: x / sqrt(mean(x²) + eps) · w (w absent: no weight)."""
        y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.p.rms_eps)
        return y if name is None else y * self.w(name)

    def rope(self, x: torch.Tensor) -> torch.Tensor:
        """refimpl.model.attention.rope_imrope at positions 0 … T−1: NEOX pairs (k, k+R/2) of the first R dims.
        x [B, T, heads, D]."""
        T, half = x.shape[1], self.p.rope_dim // 2
        cos, sin = self.cos[:T, None, :].to(x.dtype), self.sin[:T, None, :].to(x.dtype)  # [T, 1, R/2]
        x0, x1, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
        return torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos, rest], dim=-1)

    def attention(self, b: str, a: torch.Tensor) -> torch.Tensor:
        """refimpl.model.attention.gated_attention over whole sequences. a [B, T, E] -> [B, T, E]."""
        p = self.p
        B, T, _ = a.shape
        H, Hkv, D = p.n_head, p.n_head_kv, p.head_dim
        qg = (a @ self.w(b + "attn_q.weight").T).view(B, T, H, 2, D)  # [B, T, H, 2, D]: query, gate
        q = self.rope(self.rms_norm(qg[:, :, :, 0], b + "attn_q_norm.weight"))  # [B, T, H, D]
        gate = qg[:, :, :, 1].reshape(B, T, H * D)  # [B, T, HD]
        k = self.rope(self.rms_norm((a @ self.w(b + "attn_k.weight").T).view(B, T, Hkv, D), b + "attn_k_norm.weight"))
        v = (a @ self.w(b + "attn_v.weight").T).view(B, T, Hkv, D)  # [B, T, Hkv, D]
        group = H // Hkv  # query head h reads KV head h // group
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)  # [B, T, H, D]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, scale=1.0 / math.sqrt(D))  # [B, H, T, D]
        o = o.transpose(1, 2).reshape(B, T, H * D) * torch.sigmoid(gate)  # [B, T, HD]
        return o @ self.w(b + "attn_output.weight").T

    def deltanet(self, b: str, a: torch.Tensor) -> torch.Tensor:
        """refimpl.model.deltanet.gated_deltanet from the zero state. a [B, T, E] -> [B, T, E]."""
        p = self.p
        B, T, _ = a.shape
        Hk, Hv, S, Kc = p.ssm_group_count, p.ssm_time_step_rank, p.ssm_state_size, p.ssm_conv_kernel
        mix = a @ self.w(b + "attn_qkv.weight").T  # [B, T, C]
        z = a @ self.w(b + "attn_gate.weight").T  # [B, T, Din]
        beta = torch.sigmoid(a @ self.w(b + "ssm_beta.weight").T)  # [B, T, Hv]
        ssm_a = -torch.exp(self.w(b + A_LOG))  # [Hv]
        g = F.softplus(a @ self.w(b + "ssm_alpha.weight").T + self.w(b + "ssm_dt.bias")) * ssm_a  # [B, T, Hv]

        w_conv = self.w(b + "ssm_conv1d.weight")  # [C, Kc], column Kc−1 on the current token
        xpad = F.pad(mix.transpose(1, 2), (Kc - 1, 0))  # [B, C, Kc−1+T], zero state before token 0
        y = F.silu(F.conv1d(xpad, w_conv[:, None, :], groups=w_conv.shape[0]).transpose(1, 2))  # [B, T, C]

        def l2(x):  # refimpl.model.ops.l2_norm: x / sqrt(Σx² + eps)
            return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + p.rms_eps)

        tile = Hv // Hk  # value head j reads key head j mod Hk: the key heads repeated as a block
        q = l2(y[..., : Hk * S].reshape(B, T, Hk, S)).repeat(1, 1, tile, 1)  # [B, T, Hv, S]
        k = l2(y[..., Hk * S : 2 * Hk * S].reshape(B, T, Hk, S)).repeat(1, 1, tile, 1)  # [B, T, Hv, S]
        v = y[..., 2 * Hk * S :].reshape(B, T, Hv, S)  # [B, T, Hv, S]
        o = (gated_delta_rule_chunked if self.chunked else gated_delta_rule)(q, k, v, g, beta) / math.sqrt(S)  # [B, T, Hv, S]
        out = self.rms_norm(o, b + "ssm_norm.weight") * F.silu(z.view(B, T, Hv, S))  # gated norm
        return out.reshape(B, T, Hv * S) @ self.w(b + "ssm_out.weight").T

    def moe(self, b: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """refimpl.model.moe.moe_ffn. x [B, T, E] -> (ffn_out [B, T, E], router probs [N, X], sel [N, K])."""
        p = self.p
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [N, E]
        probs = torch.softmax(x @ self.w(b + "ffn_gate_inp.weight").T, dim=-1)  # [N, X]
        wsel, sel = torch.topk(probs, p.n_expert_used, dim=-1)  # [N, K], descending
        wsel = wsel / wsel.sum(-1, keepdim=True).clamp_min(6.103515625e-5)
        gate_e, up_e, down_e = (self.w(b + f"ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
        out = torch.zeros_like(x)
        for e in range(p.n_expert):
            rows, slot = torch.nonzero(sel == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            xe = x[rows]  # [n, E]
            ye = (F.silu(xe @ gate_e[e].T) * (xe @ up_e[e].T)) @ down_e[e].T  # [n, E]
            out = out.index_add(0, rows, ye * wsel[rows, slot, None])
        shared = (F.silu(x @ self.w(b + "ffn_gate_shexp.weight").T) * (x @ self.w(b + "ffn_up_shexp.weight").T)) @ self.w(b + "ffn_down_shexp.weight").T
        out = out + shared * torch.sigmoid(x @ self.w(b + "ffn_gate_inp_shexp.weight"))[:, None]
        return out.reshape(shape), probs, sel

    def layer(self, il: int, h: torch.Tensor, routing: list) -> torch.Tensor:
        """One block of refimpl.model.trunk.forward: mixer, residual, post-attention norm, MoE, residual."""
        b = f"blk.{il}."
        a = self.rms_norm(h, b + "attn_norm.weight")
        m = self.deltanet(b, a) if self.p.is_recurrent(il) else self.attention(b, a)
        r = h + m
        f, probs, sel = self.moe(b, self.rms_norm(r, b + "post_attention_norm.weight"))
        routing.append((probs, sel))
        return r + f

    # ---- trunk and head -------------------------------------------------------------------------

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list]:
        """tokens [B, T] (each sequence from position 0) -> (trunk logits [B, T, V], h_nextn [B, T, E],
        MTP logits [B, T, V] — row p fed x_p and h_nextn of p−1, zeros at p = 0 —, routing per layer)."""
        p = self.p
        routing: list = []
        h = self.w("token_embd.weight")[tokens]  # [B, T, E]
        for il in range(p.n_layer):
            h = self.layer(il, h, routing)
        h_nextn = self.rms_norm(h, "output_norm.weight")  # [B, T, E]
        logits = h_nextn @ self.w("output.weight").T  # [B, T, V]
        return logits, h_nextn, self.mtp(tokens, h_nextn.detach(), routing), routing

    def mtp(self, tokens: torch.Tensor, h_nextn: torch.Tensor, routing: list) -> torch.Tensor:
        """refimpl.model.mtp.mtp_forward as catch-up feeds it (drafts.mtp_catchup_logits). -> [B, T, V]."""
        p = self.p
        b = f"blk.{p.n_layer}."
        h_prev = torch.cat([torch.zeros_like(h_nextn[:, :1]), h_nextn[:, :-1]], dim=1)  # [B, T, E]: row p ← h of p−1
        en = self.rms_norm(self.w("token_embd.weight")[tokens], b + "nextn.enorm.weight")
        hn = self.rms_norm(h_prev, b + "nextn.hnorm.weight")
        z = torch.cat([en, hn], dim=-1) @ self.w(b + "nextn.eh_proj.weight").T  # [B, T, E]
        out = self.layer(p.n_layer, z, routing)
        return self.rms_norm(out, b + "nextn.shared_head_norm.weight") @ self.w("output.weight").T


def gated_delta_rule(q, k, v, g, beta) -> torch.Tensor:
    """The recurrence token by token, exactly as refimpl.model.deltanet.delta_rule_step (before the 1/√S).
    q, k, v [B, T, Hv, S]; g, beta [B, T, Hv] -> o [B, T, Hv, S], from the zero state."""
    B, T, Hv, S = v.shape
    decay = torch.exp(g)  # [B, T, Hv]
    M = v.new_zeros(B, Hv, S, S)  # [B, Hv, S_v, S_k]
    outs = []
    for t in range(T):
        M = M * decay[:, t, :, None, None]
        kt = k[:, t]  # [B, Hv, S]
        u = (M @ kt[..., None])[..., 0]  # [B, Hv, S_v]
        delta = (v[:, t] - u) * beta[:, t, :, None]  # [B, Hv, S_v]
        M = M + delta[..., None] * kt[:, :, None, :]
        outs.append((M @ q[:, t, :, :, None])[..., 0])  # [B, Hv, S_v], from the updated state
    return torch.stack(outs, dim=1)


CHUNK = 32


def gated_delta_rule_chunked(q, k, v, g, beta, chunk: int = CHUNK) -> torch.Tensor:
    """The same recurrence, computed chunk by chunk (the WY form of Yang, Kautz, Hatamizadeh,
    arXiv 2412.06464): equal to :func:`gated_delta_rule` up to rounding, ~10× faster to train.

    With M_t = α_t M_{t−1} + u_t k_tᵀ, u_t = β_t (v_t − α_t M_{t−1} k_t), and, inside a chunk that starts
    from state M_0, γ_t = Π_{r≤t} α_r (G = log γ = cumsum g)::

        (I + A) U = β V − (β γ K) M_0ᵀ,    A[t, s] = β_t (γ_t/γ_s) k_t·k_s  for s < t
        O         = (γ Q) M_0ᵀ + ((Q Kᵀ) ⊙ Γ) U,    Γ[t, s] = γ_t/γ_s  for s ≤ t
        M_Cᵀ      = γ_C M_0ᵀ + ((γ_C/γ) K)ᵀ U

    (rows of U, V, K, Q are tokens). Everything but the last two lines runs for all chunks at once.
    q, k, v [B, T, Hv, S]; g, beta [B, T, Hv] -> o [B, T, Hv, S]."""
    B, T, Hv, S = v.shape
    pad = (-T) % chunk
    if pad:  # trailing zero tokens (β = 0, g = 0) change nothing before them
        q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
    n = (T + pad) // chunk

    def chunks(x):  # [B, T, Hv, ...] -> [B, Hv, n, C, ...]
        return x.reshape(B, n, chunk, Hv, *x.shape[3:]).movedim(3, 1)

    q, k, v, g, beta = chunks(q), chunks(k), chunks(v), chunks(g), chunks(beta)  # [B, Hv, n, C(, S)]
    G = torch.cumsum(g, dim=-1)  # [B, Hv, n, C]
    diff = G[..., :, None] - G[..., None, :]  # [.., C, C]: G_t − G_s
    incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    Gamma = torch.exp(diff.masked_fill(~incl, float("-inf")))  # γ_t/γ_s for s ≤ t, else 0
    kk = k @ k.transpose(-1, -2)  # [.., C, C]
    A = (beta[..., :, None] * Gamma * kk).tril(-1)  # strictly lower
    I = torch.eye(chunk, dtype=q.dtype, device=q.device)
    bv = beta[..., None] * v  # [.., C, S]
    bgk = (beta * torch.exp(G))[..., None] * k  # [.., C, S]
    W = torch.linalg.solve_triangular(I + A, torch.cat([bv, bgk], dim=-1), upper=False, unitriangular=True)
    W1, W2 = W[..., :S], W[..., S:]  # U = W1 − W2 M_0ᵀ
    P = (q @ k.transpose(-1, -2)) * Gamma  # [.., C, C]
    gq = torch.exp(G)[..., None] * q  # [.., C, S]
    kdecay = torch.exp(G[..., -1:] - G)[..., None] * k  # (γ_C/γ_t) k_t
    state = v.new_zeros(B, Hv, S, S)  # M_0ᵀ [B, Hv, S_k, S_v]
    outs = []
    for i in range(n):
        U = W1[:, :, i] - W2[:, :, i] @ state  # [B, Hv, C, S_v]
        outs.append(gq[:, :, i] @ state + P[:, :, i] @ U)
        state = torch.exp(G[:, :, i, -1])[..., None, None] * state + kdecay[:, :, i].transpose(-1, -2) @ U
    o = torch.stack(outs, dim=2)  # [B, Hv, n, C, S]
    return o.movedim(1, 3).reshape(B, n * chunk, Hv, S)[:, :T]


def initial_tensors(p: FixturePreset, seed: int) -> dict[str, np.ndarray]:
    """Starting values: refimpl's fixture draws (same names and shapes, seeded per tensor), with norms
    reset to exactly 1 (the converted value of Qwen's zero-initialised w), the embedding and LM head
    rescaled to N(0, 0.02²), the decay parameters of Gated DeltaNet
    (A_log ~ U(log 1, log 16), dt_bias such that softplus(dt_bias) ∈ [0.001, 0.1]) and the MTP
    block's ``shared_head_norm``."""
    t = build_weights(p, seed, mtp="full", tied=False, fused_gate_up=False)
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, value in t.items():
        if name.endswith("norm.weight"):
            value = np.ones_like(value)
        elif name in ("token_embd.weight", "output.weight"):
            value = (value / value.std() * 0.02).astype(np.float32)
        elif name.endswith("ssm_a"):
            name, value = name[: -len("ssm_a")] + A_LOG, np.log(-value.astype(np.float64)).astype(np.float32)
        elif name.endswith("ssm_dt.bias"):
            dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), value.shape))
            value = (dt + np.log(-np.expm1(-dt))).astype(np.float32)  # inverse softplus
        out[name] = value
    out[f"blk.{p.n_layer}.nextn.shared_head_norm.weight"] = np.ones(p.n_embd, dtype=np.float32)
    return out
