"""The numba CPU kernel of TD3's gradient step (``embodied/algos/td3.py``, whose ``_gradient_step`` with
``td3.kernel=torch`` is the reference): sampling, symmetry augmentation, the clipped double-Q target with
target-policy smoothing, the twin critics' loss and gradients (LayerNorm optional), the actor's loss and
gradients through the first critic, per-network gradient clipping, Adam with L2 weight decay (torch's fused
kernel, step for step) and the targets' Polyak averaging, in two calls instead of ~300 small torch ops.

At the quadrotor's sizes (a 128-wide actor, 64-wide critics, batch 256) the torch step spends more time in
per-op dispatch (~5 us an op on this machine class) than in its matmuls; here the matmuls go to the same BLAS
and everything between them is compiled loops.

Networks are flat float32 vectors (``FusedStep`` points the torch parameters at views of them, so checkpoints,
acting, evaluation and export see every write):
- critics: an ``EnsembleMLP`` of two members, its parameters in order ``W_l [2, in, out]``, ``b_l [2, 1, out]``
  (``q_w``/``q_b``: the offset of each layer's weight and bias, ``q_dims``: the widths);
- actor: any MLP given as ``assembled = flat[index] * sign`` (a ``GroupMLP``'s gather map, or the identity
  layout of a plain one): per hidden layer ``b [out]``, ``W [out, in]``, then the last layer's ``W [out, in]`` and
  ``G`` signed images of its bias ``[G, out]`` whose mean is the bias; ``tanh`` on the output.

Random numbers (``td3_draw``) come from a splitmix64 stream whose state the learner checkpoints; the torch path
draws from its generator, so the two paths sample different batches from the same distributions."""

import math

import numba as nb
import numpy as np

from embodied.kernels.copy_numba import copy1, copy2
from embodied.kernels.quadrotor_numba import _next, normal_pair

RELU, TANH = 0, 1
# hp: the step's scalars, float64
TARGET_NOISE, NOISE_CLIP, LR_Q, LR_PI, WD_Q, WD_PI, BETA1, BETA2, EPS, MAX_NORM, TAU = range(11)
LN_EPS = 1e-5  # F.layer_norm's default


@nb.njit(cache=True)
def td3_draw(rng, size, batch, groups, act_dim, idx, g, eps):
    """Row indices U{0..size-1}, group elements U{0..groups-1} (0 without augmentation), N(0, 1) target noise."""
    for b in range(batch):
        idx[b] = np.int64(_next(rng) % np.uint64(size))
        g[b] = np.int64(_next(rng) % np.uint64(groups)) if groups > 1 else 0
    n = batch * act_dim
    flat = eps.reshape(n)
    for k in range(0, n, 2):
        z0, z1 = normal_pair(rng)
        flat[k] = z0
        if k + 1 < n:
            flat[k + 1] = z1


# ---- pieces ------------------------------------------------------------------------------------
@nb.njit(fastmath=True, cache=True)
def _act(z, kind):
    if kind == RELU:
        for i in range(z.shape[0]):
            for j in range(z.shape[1]):
                z[i, j] = max(z[i, j], np.float32(0.0))
    else:
        for i in range(z.shape[0]):
            for j in range(z.shape[1]):
                z[i, j] = math.tanh(z[i, j])


@nb.njit(fastmath=True, cache=True)
def _act_backward(d, h, kind):
    """d <- d * act'(pre-activation), given the activation's output h."""
    if kind == RELU:
        for i in range(d.shape[0]):
            for j in range(d.shape[1]):
                d[i, j] = d[i, j] if h[i, j] > 0.0 else np.float32(0.0)
    else:
        for i in range(d.shape[0]):
            for j in range(d.shape[1]):
                d[i, j] *= np.float32(1.0) - h[i, j] * h[i, j]


@nb.njit(fastmath=True, cache=True)
def _add_bias(z, b):
    for i in range(z.shape[0]):
        for j in range(z.shape[1]):
            z[i, j] += b[j]


@nb.njit(fastmath=True, cache=True)
def _layer_norm(z, rstd):
    """Rows of z normalized in place (biased variance, eps 1e-5, no affine); rstd [B] kept for the backward."""
    n = z.shape[1]
    inv_n = np.float32(1.0 / n)
    for i in range(z.shape[0]):
        m = np.float32(0.0)
        for j in range(n):
            m += z[i, j]
        m *= inv_n
        v = np.float32(0.0)
        for j in range(n):
            d = z[i, j] - m
            v += d * d
        r = np.float32(1.0) / np.sqrt(v * inv_n + np.float32(LN_EPS))
        rstd[i] = r
        for j in range(n):
            z[i, j] = (z[i, j] - m) * r


@nb.njit(fastmath=True, cache=True)
def _layer_norm_backward(d, xhat, rstd):
    """d (gradient at the normalized output) <- gradient at the input: rstd (d - mean(d) - xhat mean(d xhat))."""
    n = d.shape[1]
    inv_n = np.float32(1.0 / n)
    for i in range(d.shape[0]):
        a = np.float32(0.0)
        c = np.float32(0.0)
        for j in range(n):
            a += d[i, j]
            c += d[i, j] * xhat[i, j]
        a *= inv_n
        c *= inv_n
        r = rstd[i]
        for j in range(n):
            d[i, j] = r * (d[i, j] - a - xhat[i, j] * c)


@nb.njit(fastmath=True, cache=True)
def _col_sum(d, out):
    """out += the column sums of d (rows accumulated in float32, row-major)."""
    acc = np.zeros(d.shape[1], dtype=np.float32)
    for i in range(d.shape[0]):
        for j in range(d.shape[1]):
            acc[j] += d[i, j]
    for j in range(d.shape[1]):
        out[j] += acc[j]


# ---- critics -----------------------------------------------------------------------------------
@nb.njit(cache=True)
def critic_forward(flat, q_w, q_b, dims, e, x, ln, kind):
    """Member ``e``'s Q on ``x`` [B, in] -> ``(q [B], cache)``; the cache holds each layer's input (``hs``), each
    hidden layer's normalized pre-activation (``ns``, with LN) and its rstd, for ``critic_backward``. (Lists are
    built fresh per call: clearing and refilling one list was ~10x slower than the whole forward.)"""
    layers = dims.shape[0] - 1
    hs = [x]
    ns = [x]
    rstds = [np.empty(0, dtype=np.float32)]
    h = x
    out = np.empty(x.shape[0], dtype=np.float32)
    for lay in range(layers):
        di, do = dims[lay], dims[lay + 1]
        w = flat[q_w[lay] + e * di * do: q_w[lay] + (e + 1) * di * do].reshape((di, do))
        b = flat[q_b[lay] + e * do: q_b[lay] + (e + 1) * do]
        hs.append(h)
        z = h @ w
        _add_bias(z, b)
        if lay < layers - 1:
            if ln:
                rstd = np.empty(z.shape[0], dtype=np.float32)
                _layer_norm(z, rstd)
                ns.append(z.copy())
                rstds.append(rstd)
            _act(z, kind)
            h = z
        else:
            copy1(out, z[:, 0])
    return out, (hs[1:], ns[1:], rstds[1:])


@nb.njit(cache=True)
def critic_backward(flat, grad, q_w, q_b, dims, e, dq, ln, kind, cache, want_params):
    """Backward of ``critic_forward`` from dQ [B]: parameter gradients added into ``grad`` (when
    ``want_params``) and the gradient at the input returned."""
    hs, ns, rstds = cache
    layers = dims.shape[0] - 1
    d = dq.reshape((dq.shape[0], 1)).copy()
    for lay in range(layers - 1, -1, -1):
        di, do = dims[lay], dims[lay + 1]
        w0 = q_w[lay] + e * di * do
        w = flat[w0: w0 + di * do].reshape((di, do))
        if want_params:
            gw = hs[lay].T @ d
            gsl = grad[w0: w0 + di * do].reshape((di, do))
            gsl += gw
            _col_sum(d, grad[q_b[lay] + e * do: q_b[lay] + (e + 1) * do])
        d = d @ w.T
        if lay > 0:
            _act_backward(d, hs[lay], kind)
            if ln:
                _layer_norm_backward(d, ns[lay - 1], rstds[lay - 1])
    return d


# ---- actor -------------------------------------------------------------------------------------
@nb.njit(fastmath=True, cache=True)
def _spectral(u, chi, scale):
    """``[B, G c] -> [G, B, c]``: ``out[k] = scale sum_g chi[k, g] u[:, g c:(g + 1) c]`` (the group's Fourier transform
    of the G copies, for a group whose characters are real: +-1)."""
    n_g = chi.shape[0]
    c = u.shape[1] // n_g
    out = np.zeros((n_g, u.shape[0], c), dtype=np.float32)
    for k in range(n_g):
        for g in range(n_g):
            w = np.float32(chi[k, g] * scale)
            for i in range(u.shape[0]):
                for j in range(c):
                    out[k, i, j] += w * u[i, g * c + j]
    return out


@nb.njit(fastmath=True, cache=True)
def _spatial(v, chi, scale):
    """``[G, B, c] -> [B, G c]``: ``out[:, g c:(g + 1) c] = scale sum_k chi[k, g] v[k]`` (the inverse transform)."""
    n_g, rows, c = v.shape
    out = np.zeros((rows, n_g * c), dtype=np.float32)
    for g in range(n_g):
        for k in range(n_g):
            w = np.float32(chi[k, g] * scale)
            for i in range(rows):
                for j in range(c):
                    out[i, g * c + j] += w * v[k, i, j]
    return out


@nb.njit(cache=True)
def _blocks(w, chi_w):
    """The hidden weight [G c_out, G c_in] (a group convolution) as its G Fourier blocks [G, c_out, c_in]:
    ``W^_k = sum_g' chi_w[k, g'] W[0 block, g' block]``."""
    n_g = chi_w.shape[0]
    co, ci = w.shape[0] // n_g, w.shape[1] // n_g
    out = np.zeros((n_g, co, ci), dtype=np.float32)
    for k in range(n_g):
        for gp in range(n_g):
            c = np.float32(chi_w[k, gp])
            for o in range(co):
                for i in range(ci):
                    out[k, o, i] += c * w[o, gp * ci + i]
    return out


@nb.njit(cache=True)
def _hidden(h, w, chi, chi_w):
    """``h @ w.T`` for a hidden layer: with G > 1 characters, in the group's Fourier basis (G matmuls of
    [B, c_in] x [c_in, c_out] instead of one of [B, G c_in] x [G c_in, G c_out]: G times fewer FLOPs)."""
    n_g = chi.shape[0]
    if n_g == 1:
        return h @ w.T
    hh = _spectral(h, chi, 1.0)
    wh = _blocks(w, chi_w)
    zh = np.empty((n_g, h.shape[0], wh.shape[1]), dtype=np.float32)
    for k in range(n_g):
        np.dot(hh[k], wh[k].T, zh[k])
    return _spatial(zh, chi, 1.0 / n_g)


@nb.njit(cache=True)
def actor_forward(assembled, dims, groups, chi, chi_w, x, kind):
    """tanh(MLP(x)) with the assembled layout (module docstring) -> ``(action, hs)``: ``hs`` holds each layer's
    input and the action, for ``actor_backward``. ``chi`` [G, G]: the characters of the group whose convolutions
    the hidden layers are (``chi[k, g]``, ``chi_w[k, g']`` that of the element in the weight's block (0, g')), or
    ``[[1]]`` for dense hidden layers."""
    layers = dims.shape[0] - 1
    hs = [x]
    h = x
    off = 0
    for lay in range(layers):
        di, do = dims[lay], dims[lay + 1]
        hs.append(h)
        if lay < layers - 1:
            b = assembled[off: off + do]
            w = assembled[off + do: off + do + do * di].reshape((do, di))
            off += do + do * di
            z = h @ w.T if lay == 0 else _hidden(h, w, chi, chi_w)
            _add_bias(z, b)
            _act(z, kind)
        else:
            w = assembled[off: off + do * di].reshape((do, di))
            images = assembled[off + do * di: off + do * di + groups * do].reshape((groups, do))
            z = h @ w.T
            for j in range(do):
                s = 0.0
                for k in range(groups):
                    s += images[k, j]
                bj = s / groups
                for i in range(z.shape[0]):
                    z[i, j] = math.tanh(z[i, j] + bj)
        h = z
    hs.append(h)
    return h, hs[1:]


@nb.njit(cache=True)
def actor_backward(assembled, dims, groups, chi, chi_w, index, sign, grad, da, kind, hs):
    """Backward of ``actor_forward`` from dL/da: the assembled entries' gradients scattered back to the flat
    parameters (``grad[index[k]] += g[k] sign[k]``). A Fourier hidden layer's weight gradient goes to its
    block row 0 (``dW[m] = sum_k chi(m) dW^_k``), which holds every shared weight once."""
    layers = dims.shape[0] - 1
    n_g = chi.shape[0]
    g_asm = np.zeros(assembled.shape[0], dtype=np.float32)
    d = da.copy()
    _act_backward(d, hs[layers], TANH)  # through the output's tanh
    # offsets of each layer's pieces
    offs = np.zeros(layers, dtype=np.int64)
    off = 0
    for lay in range(layers - 1):
        offs[lay] = off
        off += dims[lay + 1] + dims[lay + 1] * dims[lay]
    offs[layers - 1] = off
    for lay in range(layers - 1, -1, -1):
        di, do = dims[lay], dims[lay + 1]
        o = offs[lay]
        if lay < layers - 1:
            b0, w0 = o, o + do
        else:
            w0, b0 = o, o + do * di
        w = assembled[w0: w0 + do * di].reshape((do, di))
        if lay < layers - 1:
            _col_sum(d, g_asm[b0: b0 + do])
        else:
            gb = np.zeros(do, dtype=np.float32)
            _col_sum(d, gb)
            for k in range(groups):
                for j in range(do):
                    g_asm[b0 + k * do + j] += gb[j] / groups
        if n_g > 1 and 0 < lay < layers - 1:
            # z^_k = h^_k W^_k^T with z = (1/G) spatial(z^): dz^_k = (1/G) sum_g chi[k, g] dz[g]
            dzh = _spectral(d, chi, 1.0 / n_g)
            hh = _spectral(hs[lay], chi, 1.0)
            wh = _blocks(w, chi_w)
            co, ci = do // n_g, di // n_g
            gw = g_asm[w0: w0 + do * di].reshape((do, di))
            dhh = np.empty((n_g, d.shape[0], ci), dtype=np.float32)
            for k in range(n_g):
                gwk = dzh[k].T @ hh[k]  # dW^_k [c_out, c_in]
                for gp in range(n_g):
                    c = np.float32(chi_w[k, gp])
                    for r in range(co):
                        for i in range(ci):
                            gw[r, gp * ci + i] += c * gwk[r, i]
                np.dot(dzh[k], wh[k], dhh[k])
            d = _spatial(dhh, chi, 1.0)
            _act_backward(d, hs[lay], kind)
            continue
        gw = d.T @ hs[lay]  # [out, in]
        for r in range(do):
            for i in range(di):
                g_asm[w0 + r * di + i] += gw[r, i]
        if lay > 0:
            d = d @ w
            _act_backward(d, hs[lay], kind)
    for k in range(index.shape[0]):
        grad[index[k]] += g_asm[k] * sign[k]


@nb.njit(cache=True)
def actor_act(assembled, dims, groups, chi, chi_w, x, kind):
    """The actor's action on ``x`` (acting: no cache kept for a backward)."""
    a, _ = actor_forward(assembled, dims, groups, chi, chi_w, x, kind)
    return a


@nb.njit(cache=True)
def assemble(flat, index, sign):
    out = np.empty(index.shape[0], dtype=np.float32)
    for k in range(index.shape[0]):
        out[k] = flat[index[k]] * sign[k]
    return out


# ---- optimizer ---------------------------------------------------------------------------------
@nb.njit(fastmath=True, cache=True)
def _reduce(grads, lo, hi):
    """``grads[0, lo:hi]`` <- the sum over the parts ``grads[:, lo:hi]`` (in part order); returns that slice's
    squared norm (float64) for the clip."""
    s = 0.0
    for j in range(lo, hi):
        acc = grads[0, j]
        for p in range(1, grads.shape[0]):
            acc += grads[p, j]
        grads[0, j] = acc
        s += np.float64(acc) * acc
    return s


@nb.njit(cache=True)
def _clip_scale(sq, max_norm):
    """The factor ``clip_grad_norm_`` multiplies the gradients by (1 when no clip is set or the norm is within it)."""
    if max_norm < 0.0:
        return np.float32(1.0)
    scale = max_norm / (math.sqrt(sq) + 1e-6)
    return np.float32(scale) if scale < 1.0 else np.float32(1.0)


@nb.njit(cache=True)
def _adam_scalars(steps, lr, beta1, beta2):
    """Advances a group's per-parameter step counts (all equal) -> (step size, 1 / sqrt(bias correction 2)), in
    float64 as torch computes them on the host."""
    for k in range(steps.shape[0]):
        steps[k] += 1.0
    t = np.float64(steps[0])
    return np.float32(lr / (1.0 - beta1 ** t)), np.float32(1.0 / math.sqrt(1.0 - beta2 ** t))


@nb.njit(fastmath=True, cache=True)
def _adam(param, grad, m, v, lo, hi, scale, step_size, inv_bc2_sqrt, wd, beta1, beta2, eps):
    """torch's fused Adam (L2 weight decay added to the gradient, the gradient times the clip's ``scale`` first) on
    ``[lo, hi)`` of one flat group, elementwise in float32 as torch's kernel is for float32 parameters."""
    one_b1, b2, one_b2 = np.float32(1.0 - beta1), np.float32(beta2), np.float32(1.0 - beta2)
    wd32, eps32 = np.float32(wd), np.float32(eps)
    for k in range(lo, hi):
        gk = grad[k] * scale + wd32 * param[k]
        mk = m[k] + one_b1 * (gk - m[k])
        vk = b2 * v[k] + one_b2 * gk * gk
        m[k] = mk
        v[k] = vk
        param[k] -= step_size * mk / (np.sqrt(vk) * inv_bc2_sqrt + eps32)


@nb.njit(fastmath=True, cache=True)
def _lerp(target, source, tau, lo, hi):
    t = np.float32(tau)
    for k in range(lo, hi):
        target[k] += t * (source[k] - target[k])


# ---- the step ----------------------------------------------------------------------------------
@nb.njit(cache=True)
def _gradients(storage, cols, dims3, aug_index, aug_sign, idx, g, eps, batch,
               qf, qt, q_w, q_b, q_dims, pf_asm, pt_asm, p_index, p_sign, p_dims, p_groups, chi, chi_w,
               hp, ln, kind, actor_step, qg, pg, stats):
    """The loss gradients of the rows ``idx`` (a part of a batch of ``batch`` rows: the losses are means over the
    whole batch) added into ``qg`` / ``pg``; ``stats`` <- this part's critic loss, sum of Q, actor loss."""
    n = idx.shape[0]
    width = storage.shape[1]
    od, cd, ad = dims3[0], dims3[1], dims3[2]
    rows = np.empty((n, width), dtype=np.float32)
    for b in range(n):
        r = storage[idx[b]]
        if aug_index.shape[0] > 0:
            gi, gs = aug_index[g[b]], aug_sign[g[b]]
            for j in range(width):
                rows[b, j] = r[gi[j]] * gs[j]
        else:
            copy1(rows[b], r)
    obs = np.ascontiguousarray(rows[:, cols[0]: cols[0] + od])
    next_obs = np.ascontiguousarray(rows[:, cols[5]: cols[5] + od])
    x = np.empty((n, cd + ad), dtype=np.float32)  # [cobs, action]
    xt = np.empty((n, cd + ad), dtype=np.float32)  # [next_cobs, next action]
    # not x[:, :cd] = rows[...] (kernels/copy_numba.py)
    copy2(x[:, :cd], rows[:, cols[1]: cols[1] + cd])
    copy2(xt[:, :cd], rows[:, cols[6]: cols[6] + cd])
    copy2(x[:, cd:], rows[:, cols[2]: cols[2] + ad])

    # target: y = r + d min_j Q'_j(s', clip(pi'(s') + clip(eps s~, -c, c), -1, 1))
    noise, clip = np.float32(hp[TARGET_NOISE]), np.float32(hp[NOISE_CLIP])
    mu, _ = actor_forward(pt_asm, p_dims, p_groups, chi, chi_w, next_obs, kind)
    for b in range(n):
        for j in range(ad):
            e = min(max(eps[b, j] * noise, -clip), clip)
            xt[b, cd + j] = min(max(mu[b, j] + e, np.float32(-1.0)), np.float32(1.0))
    y, _ = critic_forward(qt, q_w, q_b, q_dims, 0, xt, ln, kind)
    y1, _ = critic_forward(qt, q_w, q_b, q_dims, 1, xt, ln, kind)
    for b in range(n):
        y[b] = rows[b, cols[3]] + rows[b, cols[4]] * min(y[b], y1[b])

    # critics: L = 1/2 sum_j mean_b (Q_j - y)^2
    loss, qsum = 0.0, 0.0
    for e in range(2):
        q, cache = critic_forward(qf, q_w, q_b, q_dims, e, x, ln, kind)
        dq = np.empty(n, dtype=np.float32)
        for b in range(n):
            diff = q[b] - y[b]
            loss += 0.5 * diff * diff / batch
            qsum += q[b]
            dq[b] = diff / batch
        critic_backward(qf, qg, q_w, q_b, q_dims, e, dq, ln, kind, cache, True)
    stats[0] = loss
    stats[1] = qsum

    # actor: L = -mean_b Q_1(s, pi(s)), the critic's parameters held constant
    if actor_step:
        a, ahs = actor_forward(pf_asm, p_dims, p_groups, chi, chi_w, obs, kind)
        copy2(x[:, cd:], a)
        q1, cache = critic_forward(qf, q_w, q_b, q_dims, 0, x, ln, kind)
        stats[2] = -q1.sum() / batch
        dq = np.full(n, -1.0 / batch, dtype=np.float32)
        dx = critic_backward(qf, qg, q_w, q_b, q_dims, 0, dq, ln, kind, cache, False)
        da = np.ascontiguousarray(dx[:, cd:])
        actor_backward(pf_asm, p_dims, p_groups, chi, chi_w, p_index, p_sign, pg, da, kind, ahs)


@nb.njit(parallel=True, cache=True)
def td3_update(storage, cols, dims3, aug_index, aug_sign, idx, g, eps,
               qf, qt, qm, qv, q_steps, q_w, q_b, q_dims,
               pf, pt, pm, pv, pi_steps, p_index, p_sign, p_dims, p_groups, chi, chi_w,
               hp, ln, kind, actor_step, delayed, parts, metrics):
    """One TD3 gradient step on the rows ``idx`` (each under group element ``g``) with target noise ``eps``
    (N(0, 1), scaled and clipped here). ``cols``: the storage columns of obs, cobs, action, reward, discount,
    next_obs, next_cobs; ``dims3``: obs, cobs and action widths. Writes the critics (and on ``actor_step`` the
    actor), their Adam moments and step counts, on ``delayed`` the targets; ``metrics`` <- critic loss, mean Q,
    actor loss. The batch's gradients are computed in ``parts`` consecutive slices of rows, in parallel (numba's
    threads), and summed in slice order."""
    batch = idx.shape[0]
    qgs = np.zeros((parts, qf.shape[0]), dtype=np.float32)
    pgs = np.zeros((parts, pf.shape[0]), dtype=np.float32)
    stats = np.zeros((parts, 3), dtype=np.float64)
    pt_asm = assemble(pt, p_index, p_sign)
    pf_asm = assemble(pf, p_index, p_sign) if actor_step else pt_asm
    for k in nb.prange(parts):
        lo, hi = k * batch // parts, (k + 1) * batch // parts
        _gradients(storage, cols, dims3, aug_index, aug_sign, idx[lo:hi], g[lo:hi], eps[lo:hi], batch,
                   qf, qt, q_w, q_b, q_dims, pf_asm, pt_asm, p_index, p_sign, p_dims, p_groups, chi, chi_w,
                   hp, ln, kind, actor_step, qgs[k], pgs[k], stats[k])
    metrics[0] = stats[:, 0].sum()
    metrics[1] = stats[:, 1].sum() / (2 * batch)
    metrics[2] = stats[:, 2].sum()
    # the parts' gradients summed, clipped per network and applied, each thread on its slice of the parameters
    nq, npi = qf.shape[0], pf.shape[0]
    sq = np.zeros((parts, 2), dtype=np.float64)
    for k in nb.prange(parts):
        sq[k, 0] = _reduce(qgs, k * nq // parts, (k + 1) * nq // parts)
        if actor_step:
            sq[k, 1] = _reduce(pgs, k * npi // parts, (k + 1) * npi // parts)
    q_scale = _clip_scale(sq[:, 0].sum(), hp[MAX_NORM])
    p_scale = _clip_scale(sq[:, 1].sum(), hp[MAX_NORM])
    q_size, q_bc2 = _adam_scalars(q_steps, hp[LR_Q], hp[BETA1], hp[BETA2])
    # the actor's step size and bias correction: only on actor steps (its step counts advance then, as torch's do)
    no_step = (np.float32(0.0), np.float32(0.0))
    p_size, p_bc2 = _adam_scalars(pi_steps, hp[LR_PI], hp[BETA1], hp[BETA2]) if actor_step else no_step
    for k in nb.prange(parts):
        lo, hi = k * nq // parts, (k + 1) * nq // parts
        _adam(qf, qgs[0], qm, qv, lo, hi, q_scale, q_size, q_bc2, hp[WD_Q], hp[BETA1], hp[BETA2], hp[EPS])
        if delayed:
            _lerp(qt, qf, hp[TAU], lo, hi)
        lo, hi = k * npi // parts, (k + 1) * npi // parts
        if actor_step:
            _adam(pf, pgs[0], pm, pv, lo, hi, p_scale, p_size, p_bc2, hp[WD_PI], hp[BETA1], hp[BETA2], hp[EPS])
        if delayed:
            _lerp(pt, pf, hp[TAU], lo, hi)
