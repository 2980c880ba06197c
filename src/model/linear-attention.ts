/**
 * The numerical core of Qwen3.5-MoE's linear-attention layers (Gated DeltaNet) on the CPU, as
 * transformers 5.17 computes it in Qwen3_5MoeGatedDeltaNet (models/qwen3_5_moe/modeling_qwen3_5_moe.py)
 * with the torch fallbacks that run without the fla / causal-conv1d kernels (5.17 keeps them in
 * integrations/hub_kernels.py; older versions in the modeling file): the gated delta rule token by
 * token (torch_recurrent_gated_delta_rule) and chunk-wise (torch_chunk_gated_delta_rule), the causal
 * depthwise conv1d with SiLU and its rolling state (causal_conv1d_fn for a prefill,
 * causal_conv1d_update for a decode step; torch_causal_conv1d_update in older versions), and the
 * gated RMSNorm of the output (Qwen3_5MoeRMSNormGated). test/linear-attention.test.ts checks each
 * against transformers' own outputs.
 *
 * Layouts are token-major as the projections give them: q, k [S, keyHeads·keyDim]; v, out
 * [S, valueHeads·valueDim]; g, beta [S, valueHeads]. Value head h reads key head
 * floor(h / (valueHeads / keyHeads)): the module repeats q and k with repeat_interleave along the
 * head axis. Sums run in f64; the recurrent state is f32 between calls (transformers keeps it in
 * f32) and f64 inside one.
 */
import { InvalidArgumentError } from "../errors.ts";

export interface DeltaRuleShape {
  keyHeads: number;
  valueHeads: number;
  keyDim: number;
  valueDim: number;
}

/** Per-sequence state of one linear-attention layer. */
export interface DeltaRuleState {
  /** [valueHeads, keyDim, valueDim], as transformers' recurrent_state (batch dropped). */
  recurrent: Float32Array;
}

/** transformers' l2norm eps (use_qk_l2norm_in_kernel=True): x · rsqrt(Σx² + 1e-6). */
export const L2NORM_EPS = 1e-6;
export const DEFAULT_CHUNK_SIZE = 64;

export function newDeltaRuleState(shape: DeltaRuleShape): DeltaRuleState {
  checkShape(shape);
  return { recurrent: new Float32Array(shape.valueHeads * shape.keyDim * shape.valueDim) };
}

/** Clears a state for a new sequence. */
export function resetDeltaRuleState(state: DeltaRuleState): void {
  state.recurrent.fill(0);
}

/**
 * S tokens through the gated delta rule, updating `state` in place.
 * q, k: [S, keyHeads*keyDim] (NOT yet L2-normalised: this function does it, as transformers' kernel with use_qk_l2norm_in_kernel=True);
 * v: [S, valueHeads*valueDim]; g: [S, valueHeads] (the log decay, already -exp(A_log)*softplus(a+dt_bias)); beta: [S, valueHeads] (already sigmoid);
 * out: [S, valueHeads*valueDim].
 *
 * Mirrors torch_recurrent_gated_delta_rule: per token, state *= exp(g); kv = stateᵀk;
 * delta = (v − kv)·beta; state += k ⊗ delta; o = stateᵀq, with q scaled by 1/sqrt(keyDim).
 */
export function gatedDeltaRuleRecurrent(shape: DeltaRuleShape, q: Float32Array, k: Float32Array, v: Float32Array, g: Float32Array, beta: Float32Array, S: number, state: DeltaRuleState, out: Float32Array): void {
  checkDeltaArgs(shape, q, k, v, g, beta, S, state, out);
  const { keyHeads: Hk, valueHeads: Hv, keyDim: Dk, valueDim: Dv } = shape;
  const ratio = Hv / Hk;
  const { qn, kn } = normalizedQueriesKeys(shape, q, k, S);
  const st = new Float64Array(Dk * Dv);
  const kv = new Float64Array(Dv);
  const o = new Float64Array(Dv);
  for (let h = 0; h < Hv; h++) {
    const sBase = h * Dk * Dv;
    for (let i = 0; i < Dk * Dv; i++) st[i] = state.recurrent[sBase + i]!;
    const kh = Math.floor(h / ratio);
    for (let t = 0; t < S; t++) {
      const qk = (t * Hk + kh) * Dk;
      const vo = t * Hv * Dv + h * Dv;
      const decay = Math.exp(g[t * Hv + h]!);
      const b = beta[t * Hv + h]!;
      // state *= exp(g), and kv = stateᵀ k over the decayed state, in one pass.
      kv.fill(0);
      for (let i = 0; i < Dk; i++) {
        const ki = kn[qk + i]!;
        const row = i * Dv;
        for (let j = 0; j < Dv; j++) {
          const s = st[row + j]! * decay;
          st[row + j] = s;
          kv[j] += s * ki;
        }
      }
      for (let j = 0; j < Dv; j++) kv[j] = (v[vo + j]! - kv[j]!) * b; // delta
      // state += k ⊗ delta, and o = stateᵀ q over the updated state, in one pass.
      o.fill(0);
      for (let i = 0; i < Dk; i++) {
        const ki = kn[qk + i]!, qi = qn[qk + i]!;
        const row = i * Dv;
        for (let j = 0; j < Dv; j++) {
          const s = st[row + j]! + ki * kv[j]!;
          st[row + j] = s;
          o[j] += s * qi;
        }
      }
      for (let j = 0; j < Dv; j++) out[vo + j] = o[j]!;
    }
    for (let i = 0; i < Dk * Dv; i++) state.recurrent[sBase + i] = st[i]!;
  }
}

/**
 * Same contract as gatedDeltaRuleRecurrent, computed chunk-wise as transformers'
 * torch_chunk_gated_delta_rule (chunkSize 64 by default), from `state` as its initial_state (5.17
 * runs a multi-token call after the first through the cache this way too, so a prompt may be
 * prefilled in pieces). transformers zero-pads S up to a multiple of the chunk; padded tokens have
 * k = v = beta = 0 and g = 0, so they change nothing, and the last chunk here is simply shorter.
 * Equal to the recurrent form up to rounding; in this scalar code it costs about 3× more.
 */
export function gatedDeltaRuleChunked(shape: DeltaRuleShape, q: Float32Array, k: Float32Array, v: Float32Array, g: Float32Array, beta: Float32Array, S: number, state: DeltaRuleState, out: Float32Array, chunkSize = DEFAULT_CHUNK_SIZE): void {
  checkDeltaArgs(shape, q, k, v, g, beta, S, state, out);
  if (!Number.isInteger(chunkSize) || chunkSize < 1) throw new InvalidArgumentError(`chunkSize must be a positive integer, got ${chunkSize}`);
  const { keyHeads: Hk, valueHeads: Hv, keyDim: Dk, valueDim: Dv } = shape;
  const ratio = Hv / Hk;
  const C = Math.min(chunkSize, Math.max(S, 1));
  const { qn, kn } = normalizedQueriesKeys(shape, q, k, S);
  const st = new Float64Array(Dk * Dv);
  const gc = new Float64Array(C); // cumulative log decay within the chunk
  const decay = new Float64Array(C * C); // exp(gc[i] − gc[j]) for j ≤ i
  const T = new Float64Array(C * C); // the chunk's (I + strictly lower) transform, "attn"
  const row = new Float64Array(C);
  const U = new Float64Array(C * Dv); // attn @ v_beta, then v_new
  const W = new Float64Array(C * Dk); // k_cumdecay = attn @ (k_beta · exp(gc))
  const kb = new Float64Array(C * Dk); // k · beta
  const kbe = new Float64Array(C * Dk); // k · beta · exp(gc)
  const vb = new Float64Array(C * Dv); // v · beta
  const P = new Float64Array(C * C); // intra-chunk q kᵀ · decay, causal
  const o = new Float64Array(Dv);
  for (let h = 0; h < Hv; h++) {
    const sBase = h * Dk * Dv;
    for (let i = 0; i < Dk * Dv; i++) st[i] = state.recurrent[sBase + i]!;
    const kh = Math.floor(h / ratio);
    const qkAt = (t: number) => (t * Hk + kh) * Dk;
    const vAt = (t: number) => t * Hv * Dv + h * Dv;
    for (let c0 = 0; c0 < S; c0 += C) {
      const L = Math.min(C, S - c0);
      let acc = 0;
      for (let i = 0; i < L; i++) gc[i] = acc += g[(c0 + i) * Hv + h]!;
      for (let i = 0; i < L; i++) for (let j = 0; j <= i; j++) decay[i * C + j] = Math.exp(gc[i]! - gc[j]!);
      for (let i = 0; i < L; i++) {
        const b = beta[(c0 + i) * Hv + h]!, ko = qkAt(c0 + i);
        for (let d = 0; d < Dk; d++) kb[i * Dk + d] = kn[ko + d]! * b;
      }
      // attn = −((k_beta @ kᵀ) · decay_mask), strictly lower triangular.
      for (let i = 0; i < L; i++) {
        for (let j = 0; j < i; j++) {
          const ko = qkAt(c0 + j);
          let dot = 0;
          for (let d = 0; d < Dk; d++) dot += kb[i * Dk + d]! * kn[ko + d]!;
          T[i * C + j] = -dot * decay[i * C + j]!;
        }
      }
      // (I + strictly lower)⁻¹ by forward substitution: attn[i, :i] = row + Σ_j row[j] · attn[j, :i]
      // (rows j < i already done), then + I. transformers 5.17 solves the same unit-triangular system
      // with solve_triangular; older versions ran this very loop.
      for (let i = 1; i < L; i++) {
        for (let m = 0; m < i; m++) row[m] = T[i * C + m]!;
        for (let m = 0; m < i; m++) {
          let s = row[m]!;
          for (let j = m + 1; j < i; j++) s += row[j]! * T[j * C + m]!;
          T[i * C + m] = s;
        }
      }
      for (let i = 0; i < L; i++) T[i * C + i] = 1;
      // value = attn @ v_beta; k_cumdecay = attn @ (k_beta · exp(gc)).
      for (let j = 0; j < L; j++) {
        const b = beta[(c0 + j) * Hv + h]!, vo = vAt(c0 + j), eg = Math.exp(gc[j]!);
        for (let d = 0; d < Dv; d++) vb[j * Dv + d] = v[vo + d]! * b;
        for (let d = 0; d < Dk; d++) kbe[j * Dk + d] = kb[j * Dk + d]! * eg;
      }
      U.fill(0, 0, L * Dv);
      W.fill(0, 0, L * Dk);
      for (let i = 0; i < L; i++) {
        for (let j = 0; j <= i; j++) {
          const tij = T[i * C + j]!;
          if (tij === 0) continue;
          for (let d = 0; d < Dv; d++) U[i * Dv + d] += tij * vb[j * Dv + d]!;
          for (let d = 0; d < Dk; d++) W[i * Dk + d] += tij * kbe[j * Dk + d]!;
        }
      }
      // v_new = value − k_cumdecay @ state.
      for (let i = 0; i < L; i++) {
        for (let d = 0; d < Dk; d++) {
          const w = W[i * Dk + d]!;
          if (w === 0) continue;
          const sr = d * Dv;
          for (let e = 0; e < Dv; e++) U[i * Dv + e] -= w * st[sr + e]!;
        }
      }
      // out = (q · exp(gc)) @ state + ((q @ kᵀ) · decay_mask, causal incl. the diagonal) @ v_new.
      for (let i = 0; i < L; i++) {
        const qo = qkAt(c0 + i);
        for (let j = 0; j <= i; j++) {
          const ko = qkAt(c0 + j);
          let dot = 0;
          for (let d = 0; d < Dk; d++) dot += qn[qo + d]! * kn[ko + d]!;
          P[i * C + j] = dot * decay[i * C + j]!;
        }
      }
      for (let i = 0; i < L; i++) {
        o.fill(0);
        const qo = qkAt(c0 + i), eg = Math.exp(gc[i]!);
        for (let d = 0; d < Dk; d++) {
          const qd = qn[qo + d]! * eg;
          const sr = d * Dv;
          for (let e = 0; e < Dv; e++) o[e] += qd * st[sr + e]!;
        }
        for (let j = 0; j <= i; j++) {
          const p = P[i * C + j]!;
          for (let e = 0; e < Dv; e++) o[e] += p * U[j * Dv + e]!;
        }
        const oo = vAt(c0 + i);
        for (let e = 0; e < Dv; e++) out[oo + e] = o[e]!;
      }
      // state = state · exp(gLast) + (k · exp(gLast − gc))ᵀ @ v_new.
      const gLast = gc[L - 1]!, eLast = Math.exp(gLast);
      for (let i = 0; i < Dk * Dv; i++) st[i] = st[i]! * eLast;
      for (let j = 0; j < L; j++) {
        const ko = qkAt(c0 + j), w = Math.exp(gLast - gc[j]!);
        for (let d = 0; d < Dk; d++) {
          const kd = kn[ko + d]! * w;
          const sr = d * Dv;
          for (let e = 0; e < Dv; e++) st[sr + e] += kd * U[j * Dv + e]!;
        }
      }
    }
    for (let i = 0; i < Dk * Dv; i++) state.recurrent[sBase + i] = st[i]!;
  }
}

/**
 * Causal depthwise conv1d over time with SiLU. x, out: [S, channels]; weight: [channels, kernel]
 * (transformers' conv1d.weight squeezed); state: [channels, kernel-1], the previous kernel-1 inputs
 * per channel (oldest first), updated in place. out must not alias x.
 *
 * As the module's prefill (F.conv1d with kernel−1 zeros of left padding: a zero state) and
 * torch_causal_conv1d_update (decode): out[t, c] = silu(Σ_j weight[c, j] · x[t − (kernel−1) + j, c]),
 * inputs before t = 0 read from the state. transformers' own conv_state holds `kernel` columns;
 * its oldest is never read, so its last kernel−1 columns are this state.
 */
export function causalConv1dSilu(x: Float32Array, S: number, channels: number, kernel: number, weight: Float32Array, state: Float32Array, out: Float32Array): void {
  const W = kernel - 1;
  if (!Number.isInteger(kernel) || kernel < 1) throw new InvalidArgumentError(`conv kernel must be a positive integer, got ${kernel}`);
  need("x", x, S * channels);
  need("out", out, S * channels);
  need("weight", weight, channels * kernel);
  need("state", state, channels * W);
  if (x.buffer === out.buffer && S > 0 && overlaps(x, out)) throw new InvalidArgumentError("causalConv1dSilu: out must not alias x");
  for (let t = 0; t < S; t++) {
    for (let c = 0; c < channels; c++) {
      let s = 0;
      for (let j = 0; j < kernel; j++) {
        const p = t - W + j; // input time of tap j
        const xv = p >= 0 ? x[p * channels + c]! : state[c * W + W + p]!;
        s += weight[c * kernel + j]! * xv;
      }
      const y = Math.fround(s); // conv output is f32 before the SiLU, as in torch
      out[t * channels + c] = y / (1 + Math.exp(-y));
    }
  }
  // The new state: the last kernel−1 inputs of [state, x].
  if (W === 0) return;
  for (let c = 0; c < channels; c++) {
    for (let j = 0; j < W; j++) {
      const p = S - W + j;
      state[c * W + j] = p >= 0 ? x[p * channels + c]! : state[c * W + j + S]!; // j + S < W here, read before written
    }
  }
}

/**
 * Gated RMSNorm of the delta rule's output, as Qwen3_5MoeRMSNormGated (norm before gate):
 * out = weight · (x · rsqrt(mean(x²) + eps)) · silu(z), per row of `dim`, each product rounded to
 * f32 as torch's f32 ops round it. The weight applies as is (initialised to ones), not as 1 + w like
 * the decoder's other RMSNorms. x, z, out: [rows, dim]; out may be x.
 */
export function gatedRmsNorm(x: Float32Array, z: Float32Array, weight: Float32Array, rows: number, dim: number, eps: number, out: Float32Array): void {
  need("x", x, rows * dim);
  need("z", z, rows * dim);
  need("out", out, rows * dim);
  need("weight", weight, dim);
  for (let r = 0; r < rows; r++) {
    const o = r * dim;
    let sum = 0;
    for (let i = 0; i < dim; i++) sum += x[o + i]! * x[o + i]!;
    const inv = 1 / Math.sqrt(sum / dim + eps);
    for (let i = 0; i < dim; i++) {
      const normed = Math.fround(weight[i]! * Math.fround(x[o + i]! * inv));
      const zi = z[o + i]!;
      out[o + i] = normed * Math.fround(zi / (1 + Math.exp(-zi)));
    }
  }
}

/** q and k L2-normalised per key head (x · rsqrt(Σx² + eps), as transformers' l2norm), q also scaled by 1/sqrt(keyDim). [S, keyHeads, keyDim] in f64. */
function normalizedQueriesKeys(shape: DeltaRuleShape, q: Float32Array, k: Float32Array, S: number): { qn: Float64Array; kn: Float64Array } {
  const { keyHeads: Hk, keyDim: Dk } = shape;
  const scale = 1 / Math.sqrt(Dk);
  const qn = new Float64Array(S * Hk * Dk), kn = new Float64Array(S * Hk * Dk);
  for (let r = 0; r < S * Hk; r++) {
    const o = r * Dk;
    let sq = 0, sk = 0;
    for (let d = 0; d < Dk; d++) {
      sq += q[o + d]! * q[o + d]!;
      sk += k[o + d]! * k[o + d]!;
    }
    const iq = scale / Math.sqrt(sq + L2NORM_EPS), ik = 1 / Math.sqrt(sk + L2NORM_EPS);
    for (let d = 0; d < Dk; d++) {
      qn[o + d] = q[o + d]! * iq;
      kn[o + d] = k[o + d]! * ik;
    }
  }
  return { qn, kn };
}

function checkShape(shape: DeltaRuleShape): void {
  const { keyHeads, valueHeads, keyDim, valueDim } = shape;
  for (const [name, n] of Object.entries({ keyHeads, valueHeads, keyDim, valueDim })) {
    if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError(`delta rule ${name} must be a positive integer, got ${n}`);
  }
  if (valueHeads % keyHeads !== 0) throw new InvalidArgumentError(`delta rule valueHeads (${valueHeads}) must be a multiple of keyHeads (${keyHeads})`);
}

function checkDeltaArgs(shape: DeltaRuleShape, q: Float32Array, k: Float32Array, v: Float32Array, g: Float32Array, beta: Float32Array, S: number, state: DeltaRuleState, out: Float32Array): void {
  checkShape(shape);
  if (!Number.isInteger(S) || S < 0) throw new InvalidArgumentError(`delta rule token count must be a non-negative integer, got ${S}`);
  const { keyHeads: Hk, valueHeads: Hv, keyDim: Dk, valueDim: Dv } = shape;
  need("q", q, S * Hk * Dk);
  need("k", k, S * Hk * Dk);
  need("v", v, S * Hv * Dv);
  need("g", g, S * Hv);
  need("beta", beta, S * Hv);
  need("out", out, S * Hv * Dv);
  if (state.recurrent.length !== Hv * Dk * Dv) throw new InvalidArgumentError(`delta rule state has ${state.recurrent.length} floats, the shape needs ${Hv * Dk * Dv}`);
}

function need(name: string, a: Float32Array, n: number): void {
  if (a.length < n) throw new InvalidArgumentError(`${name} has ${a.length} floats, needs at least ${n}`);
}

function overlaps(a: Float32Array, b: Float32Array): boolean {
  return a.byteOffset < b.byteOffset + b.byteLength && b.byteOffset < a.byteOffset + a.byteLength;
}
