"""A hand-built starting point for training: a 3-gram induction circuit written into the weights.

Random initialisation did not form induction heads within the CPU budget (1.1k steps, copy loss at
the unigram level), so training starts from weights that already implement the mechanism and then
refines them (LM on filler, name-conditioned needles, ignoring spurious matches).

Residual layout (hidden 128): [0:24) token code c(t), [24:48) c(t-1), [48:72) c(t-2),
[72:96) c(t-3), [96:120) induced next-token code, 120 constant, rest free.
 layer 0 head 0: attends to distance 1 (RoPE high-frequency pairs, query/key from the constant),
                 copies c(t) into [24:48); head 1: distance 2 -> [48:72)
 layer 1 head 0: distance 1, copies [48:72) of the previous token into [72:96)
 layer 2 head 0: induction: query [c(t), c(t-1), c(t-2)] against key [c(t-1), c(t-2), c(t-3)] in
                 the RoPE pairs whose rotation stays < 0.2 rad over 32k tokens (rope_theta 1e12);
                 copies the matched position's c into [96:120)
 lm_head:        logits = gamma * code(t) . x[96:120)
Everything else keeps its small random init.
"""

import math

import torch

D_CODE = 24
CONT, P1, P2, P3, OUT, CONST = 0, 24, 48, 72, 96, 120


def _norm_in(layer_norm, x):
    return layer_norm(x)


@torch.no_grad()
def construct(model, seed=7, sample_ids=None):
    c = model.c
    g = torch.Generator().manual_seed(seed)
    V, E, Dh = c.vocab_size, c.hidden_size, c.head_dim
    half = Dh // 2
    theta = c.rope_theta
    inv = [1.0 / theta ** (2 * i / Dh) for i in range(half)]
    codes = torch.randn(V, D_CODE, generator=g)
    codes = codes / codes.norm(dim=1, keepdim=True) * math.sqrt(D_CODE)
    emb = model.model.embed_tokens.weight
    emb.mul_(0.1)
    emb[:, CONT:CONT + D_CODE] = codes
    emb[:, CONST] = 4.0

    ids = sample_ids
    pos = torch.arange(ids.shape[1])[None]
    from passkey_lib import rope_cos_sin
    cos, sin = rope_cos_sin(pos, Dh, theta)
    T = ids.shape[1]
    mask = torch.full((T, T), float("-inf")).triu(1)

    def layer_input(l):
        x = model.model.embed_tokens(ids)
        for i in range(l):
            x = model.model.layers[i](x, cos, sin, mask)
        return model.model.layers[l].input_layernorm(x)

    def scale_of(xn, lo, hi):
        return xn[0, 8:, lo:hi].pow(2).mean().sqrt().item()  # rms per dim of that block

    def pos_head(l, h, delta, src, dst, A=32.0):
        at = model.model.layers[l].self_attn
        xn = layer_input(l)
        cn = xn[0, 8:, CONST].mean().item()
        sn = scale_of(xn, src, src + D_CODE)
        q = at.q_proj.weight.view(-1, Dh, E)[h]
        k = at.k_proj.weight.view(-1, Dh, E)[h]
        v = at.v_proj.weight.view(-1, Dh, E)[h]
        o = at.o_proj.weight.view(E, -1, Dh)[:, h]
        q.zero_(); k.zero_(); v.zero_(); o[:, :] = 0
        amp = A * math.sqrt(Dh)   # undo the 1/sqrt(head_dim) softmax scale
        for i in range(7):
            q[i, CONST] = amp * math.cos(delta * inv[i]) / cn
            q[i + half, CONST] = -amp * math.sin(delta * inv[i]) / cn
            k[i, CONST] = 1.0 / cn
        for j in range(D_CODE):
            v[j, src + j] = 1.0 / sn
            o[dst + j, j] = 1.0

    pos_head(0, 0, 1, CONT, P1)
    pos_head(0, 1, 2, CONT, P2)
    pos_head(1, 0, 1, P2, P3)

    # induction head in layer 2
    at = model.model.layers[2].self_attn
    xn = layer_input(2)
    s = {b: scale_of(xn, b, b + D_CODE) for b in (CONT, P1, P2, P3)}
    q = at.q_proj.weight.view(-1, Dh, E)[0]
    k = at.k_proj.weight.view(-1, Dh, E)[0]
    v = at.v_proj.weight.view(-1, Dh, E)[0]
    o = at.o_proj.weight.view(E, -1, Dh)[:, 0]
    q.zero_(); k.zero_(); v.zero_(); o[:, :] = 0
    flat = [i for i in range(half) if inv[i] * 32768 < 0.2]
    groups = [flat[j::3] for j in range(3)]
    alpha = 1.6 * math.sqrt(Dh)
    for gi, (qb, kb) in enumerate([(CONT, P1), (P1, P2), (P2, P3)]):
        pairs = groups[gi]
        dims = pairs + [p + half for p in pairs]
        M = torch.linalg.qr(torch.randn(D_CODE, len(dims), generator=g))[0].T  # orthonormal rows
        M = M * math.sqrt(D_CODE / len(dims))
        for r, d in enumerate(dims):
            q[d, qb:qb + D_CODE] = alpha * M[r] / s[qb]
            k[d, kb:kb + D_CODE] = M[r] / s[kb]
    for j in range(D_CODE):
        v[j, CONT + j] = 1.0 / s[CONT]
        o[OUT + j, j] = 1.0
    # output
    xf = model.model.embed_tokens(ids)
    for i in range(c.num_hidden_layers):
        xf = model.model.layers[i](xf, cos, sin, mask)
    xf = model.model.norm(xf)
    so = scale_of(xf, OUT, OUT + D_CODE)
    model.lm_head.weight.mul_(0.1)
    model.lm_head.weight[:, OUT:OUT + D_CODE] = 0.6 * codes / so
    return codes
