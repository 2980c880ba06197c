/**
 * The Gated DeltaNet core (src/model/linear-attention.ts) against two oracles:
 * - a float64 reference written here straight from the math, on seeded random inputs (shapes,
 *   GQA ratios, chunk sizes, S not a multiple of the chunk, state carried across calls);
 * - transformers' own functions (torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule,
 *   causal_conv1d_update, Qwen3_5MoeRMSNormGated, a whole Qwen3_5MoeGatedDeltaNet through a
 *   DynamicCache: prefill, decode steps, a prefill in two pieces), run by scripts/fixtures/make-linear-attention-fixture.py into
 *   test/fixtures/linear-attention/reference.safetensors (f32, transformers 5.17 / torch 2.11).
 * Bounds: max |got − ref| / max |ref| ≤ 1e-5 (f32 against f64 or torch's f32); measured 3e-8..5e-8
 * against the f64 reference and 1e-7..5e-7 against transformers.
 */
import { describe, expect, test } from "bun:test";
import { openSafetensors } from "../src/formats/index.ts";
import { causalConv1dSilu, gatedDeltaRuleChunked, gatedDeltaRuleRecurrent, gatedRmsNorm, newDeltaRuleState, type DeltaRuleShape } from "../src/model/linear-attention.ts";
import { gaussian, mulberry32 } from "../src/quant/random.ts";
import { relMaxErr } from "./support/delta-layer.ts";
import { repoRoot } from "./support/paths.ts";

const TOL = 1e-5;


/** Every error below TOL, with the errors in the failure message. */
function expectClose(label: Record<string, unknown>, errors: Record<string, number>): void {
  const ok = Object.values(errors).every((e) => e < TOL);
  expect({ ...label, ...errors, ok }).toMatchObject({ ...label, ok: true });
}

function randn(seed: number, n: number, scale = 1): Float32Array {
  const next = gaussian(mulberry32(seed));
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = next() * scale;
  return a;
}

interface DeltaInputs { q: Float32Array; k: Float32Array; v: Float32Array; g: Float32Array; beta: Float32Array }

/** Random inputs as the layer makes them: g = −exp(A_log)·softplus(a + dt_bias) with moderate decay, beta = sigmoid(b). */
function deltaInputs(shape: DeltaRuleShape, S: number, seed: number): DeltaInputs {
  const { keyHeads: Hk, valueHeads: Hv, keyDim: Dk, valueDim: Dv } = shape;
  const a = randn(seed + 3, S * Hv), b = randn(seed + 4, S * Hv);
  const g = new Float32Array(S * Hv), beta = new Float32Array(S * Hv);
  for (let i = 0; i < S * Hv; i++) {
    const A = 0.05 + 0.9 * ((i % Hv) / Hv); // per head
    g[i] = -A * Math.log1p(Math.exp(a[i]! * 0.5 - 0.5));
    beta[i] = 1 / (1 + Math.exp(-b[i]!));
  }
  return { q: randn(seed, S * Hk * Dk), k: randn(seed + 1, S * Hk * Dk), v: randn(seed + 2, S * Hv * Dv), g, beta };
}

const slice = (x: DeltaInputs, shape: DeltaRuleShape, t0: number, t1: number): DeltaInputs => {
  const qk = shape.keyHeads * shape.keyDim, vv = shape.valueHeads * shape.valueDim, h = shape.valueHeads;
  return { q: x.q.subarray(t0 * qk, t1 * qk), k: x.k.subarray(t0 * qk, t1 * qk), v: x.v.subarray(t0 * vv, t1 * vv), g: x.g.subarray(t0 * h, t1 * h), beta: x.beta.subarray(t0 * h, t1 * h) };
};

/**
 * The gated delta rule in f64, token by token, from the definition: value head h uses key head
 * floor(h·Hk/Hv); q, k L2-normalised (eps 1e-6 inside the sqrt, added to Σx²), q scaled by 1/sqrt(Dk);
 * S ← S·exp(g); kv = Sᵀk; δ = (v − kv)·β; S ← S + k δᵀ; o = Sᵀq. State [Hv, Dk, Dv] in f64.
 */
function referenceDelta(shape: DeltaRuleShape, x: DeltaInputs, S: number, state: Float64Array): Float64Array {
  const { keyHeads: Hk, valueHeads: Hv, keyDim: Dk, valueDim: Dv } = shape;
  const out = new Float64Array(S * Hv * Dv);
  const unit = (a: Float32Array, o: number, scale: number) => {
    let s = 0;
    for (let d = 0; d < Dk; d++) s += a[o + d]! * a[o + d]!;
    return Array.from({ length: Dk }, (_, d) => (a[o + d]! / Math.sqrt(s + 1e-6)) * scale);
  };
  for (let t = 0; t < S; t++) {
    for (let h = 0; h < Hv; h++) {
      const kh = Math.floor((h * Hk) / Hv);
      const q = unit(x.q, (t * Hk + kh) * Dk, 1 / Math.sqrt(Dk)), k = unit(x.k, (t * Hk + kh) * Dk, 1);
      const at = (i: number, j: number) => h * Dk * Dv + i * Dv + j;
      const decay = Math.exp(x.g[t * Hv + h]!), b = x.beta[t * Hv + h]!;
      for (let i = 0; i < Dk; i++) for (let j = 0; j < Dv; j++) state[at(i, j)] *= decay;
      for (let j = 0; j < Dv; j++) {
        let kv = 0;
        for (let i = 0; i < Dk; i++) kv += state[at(i, j)]! * k[i]!;
        const delta = (x.v[t * Hv * Dv + h * Dv + j]! - kv) * b;
        for (let i = 0; i < Dk; i++) state[at(i, j)] += k[i]! * delta;
      }
      for (let j = 0; j < Dv; j++) {
        let o = 0;
        for (let i = 0; i < Dk; i++) o += state[at(i, j)]! * q[i]!;
        out[t * Hv * Dv + h * Dv + j] = o;
      }
    }
  }
  return out;
}

type Kernel = "recurrent" | "chunked";
function run(kind: Kernel, shape: DeltaRuleShape, x: DeltaInputs, S: number, state: ReturnType<typeof newDeltaRuleState>, chunk?: number): Float32Array {
  const out = new Float32Array(S * shape.valueHeads * shape.valueDim);
  if (kind === "recurrent") gatedDeltaRuleRecurrent(shape, x.q, x.k, x.v, x.g, x.beta, S, state, out);
  else gatedDeltaRuleChunked(shape, x.q, x.k, x.v, x.g, x.beta, S, state, out, chunk);
  return out;
}

const SHAPES: [string, DeltaRuleShape][] = [
  ["GQA 1, Dk = Dv", { keyHeads: 2, valueHeads: 2, keyDim: 16, valueDim: 16 }],
  ["GQA 2, Dk > Dv", { keyHeads: 2, valueHeads: 4, keyDim: 16, valueDim: 8 }],
  ["GQA 4, Dk < Dv", { keyHeads: 1, valueHeads: 4, keyDim: 8, valueDim: 24 }],
];

describe("gated delta rule vs a float64 reference", () => {
  for (const [label, shape] of SHAPES) {
    test(`${label}: recurrent and chunked (chunk 1, 3, 16, 64), S = 1 and 37`, () => {
      for (const S of [1, 37]) {
        const x = deltaInputs(shape, S, 100 + S);
        const refState = new Float64Array(shape.valueHeads * shape.keyDim * shape.valueDim);
        const ref = referenceDelta(shape, x, S, refState);
        const runs: [string, Kernel, number?][] = [["recurrent", "recurrent"], ...[1, 3, 16, 64].map((c): [string, Kernel, number] => [`chunk ${c}`, "chunked", c])];
        for (const [name, kind, chunk] of runs) {
          const state = newDeltaRuleState(shape);
          const out = run(kind, shape, x, S, state, chunk);
          expectClose({ name, S }, { out: relMaxErr(ref, out), state: relMaxErr(refState, state.recurrent) });
        }
      }
    });
  }

  test("the state carries across calls: 37 tokens == 20 then 17, for both kernels and mixed", () => {
    const [, shape] = SHAPES[1]!;
    const x = deltaInputs(shape, 37, 7);
    const refState = new Float64Array(shape.valueHeads * shape.keyDim * shape.valueDim);
    const ref = referenceDelta(shape, x, 37, refState);
    const plans: [Kernel, number | undefined, Kernel, number | undefined][] = [
      ["recurrent", undefined, "recurrent", undefined],
      ["chunked", 16, "chunked", 16],
      ["chunked", 64, "chunked", 3],
      ["chunked", 64, "recurrent", undefined], // chunked prefill, then recurrent decode
    ];
    for (const [k1, c1, k2, c2] of plans) {
      const state = newDeltaRuleState(shape);
      const a = run(k1, shape, slice(x, shape, 0, 20), 20, state, c1);
      const b = run(k2, shape, slice(x, shape, 20, 37), 17, state, c2);
      const out = new Float32Array([...a, ...b]);
      expectClose({ k1, c1, k2, c2 }, { out: relMaxErr(ref, out), state: relMaxErr(refState, state.recurrent) });
    }
    // A chunked prefill then one-token recurrent decode steps == one recurrent run.
    const state = newDeltaRuleState(shape), whole = newDeltaRuleState(shape);
    const parts = [run("chunked", shape, slice(x, shape, 0, 33), 33, state)];
    for (let t = 33; t < 37; t++) parts.push(run("recurrent", shape, slice(x, shape, t, t + 1), 1, state));
    const one = run("recurrent", shape, x, 37, whole);
    expect(relMaxErr(one, new Float32Array(parts.flatMap((p) => [...p])))).toBeLessThan(TOL);
    expect(relMaxErr(whole.recurrent, state.recurrent)).toBeLessThan(TOL);
  });

  test("S = 0 leaves the state as it was", () => {
    const [, shape] = SHAPES[1]!;
    const x = deltaInputs(shape, 5, 9);
    const state = newDeltaRuleState(shape);
    run("recurrent", shape, x, 5, state);
    const before = state.recurrent.slice();
    run("chunked", shape, x, 0, state);
    run("recurrent", shape, x, 0, state);
    expect(state.recurrent).toEqual(before);
  });

  test("a prefill of a few hundred tokens at a real-ish head shape is quick", () => {
    const shape = { keyHeads: 2, valueHeads: 4, keyDim: 64, valueDim: 64 };
    const S = 256;
    const x = deltaInputs(shape, S, 11);
    const t0 = performance.now();
    run("chunked", shape, x, S, newDeltaRuleState(shape));
    const chunkedMs = performance.now() - t0;
    const t1 = performance.now();
    run("recurrent", shape, x, S, newDeltaRuleState(shape));
    const recurrentMs = performance.now() - t1;
    console.log(`delta rule, ${S} tokens × ${shape.valueHeads} heads of ${shape.keyDim}×${shape.valueDim}: chunked ${chunkedMs.toFixed(0)} ms, recurrent ${recurrentMs.toFixed(0)} ms`);
    expect(chunkedMs).toBeLessThan(2000);
  });
});

/** A padded full convolution: zeros (or the state) before t = 0, then out[t] = silu(Σ_j w[j]·xpad[t + j]), from the definition. */
function referenceConv(x: Float32Array, S: number, C: number, K: number, w: Float32Array, state: Float32Array): { out: Float64Array; state: Float64Array } {
  const out = new Float64Array(S * C), next = new Float64Array(C * (K - 1));
  for (let c = 0; c < C; c++) {
    const padded = [...Array.from({ length: K - 1 }, (_, j) => state[c * (K - 1) + j]!), ...Array.from({ length: S }, (_, t) => x[t * C + c]!)];
    for (let t = 0; t < S; t++) {
      let s = 0;
      for (let j = 0; j < K; j++) s += w[c * K + j]! * padded[t + j]!;
      out[t * C + c] = s / (1 + Math.exp(-s));
    }
    for (let j = 0; j < K - 1; j++) next[c * (K - 1) + j] = padded[padded.length - (K - 1) + j]!;
  }
  return { out, state: next };
}

describe("causal conv1d with SiLU", () => {
  const C = 10, K = 4;
  const w = randn(21, C * K, 0.5);

  test("one call from a zero state == a zero-padded full convolution", () => {
    for (const S of [1, 2, 3, 9]) {
      const x = randn(22 + S, S * C);
      const state = new Float32Array(C * (K - 1));
      const ref = referenceConv(x, S, C, K, w, new Float32Array(C * (K - 1)));
      const out = new Float32Array(S * C);
      causalConv1dSilu(x, S, C, K, w, state, out);
      expect(relMaxErr(ref.out, out)).toBeLessThan(TOL);
      expect(relMaxErr(ref.state, state)).toBe(0);
    }
  });

  test("split across calls (prefill, decode, pieces shorter than kernel − 1) == one call", () => {
    const S = 13;
    const x = randn(30, S * C);
    const ref = referenceConv(x, S, C, K, w, new Float32Array(C * (K - 1)));
    for (const pieces of [[13], [1, 12], [5, 1, 1, 1, 5], [2, 1, 2, 8], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]) {
      const state = new Float32Array(C * (K - 1));
      const out = new Float32Array(S * C);
      let t = 0;
      for (const n of pieces) {
        causalConv1dSilu(x.subarray(t * C, (t + n) * C), n, C, K, w, state, out.subarray(t * C, (t + n) * C));
        t += n;
      }
      expectClose({ pieces }, { out: relMaxErr(ref.out, out) });
      expect(relMaxErr(ref.state, state)).toBe(0);
    }
  });

  test("kernel 1 (no state) and an aliased out are handled", () => {
    const x = randn(40, 3 * C), out = new Float32Array(3 * C);
    causalConv1dSilu(x, 3, C, 1, w.subarray(0, C), new Float32Array(0), out);
    expect(relMaxErr(referenceConv(x, 3, C, 1, w.subarray(0, C), new Float32Array(0)).out, out)).toBeLessThan(TOL);
    expect(() => causalConv1dSilu(x, 3, C, K, w, new Float32Array(C * (K - 1)), x)).toThrow(/alias/);
  });
});

describe("gated RMSNorm", () => {
  test("== weight · x / sqrt(mean(x²) + eps) · silu(z), in place too", () => {
    const rows = 6, dim = 16, eps = 1e-6;
    const x = randn(50, rows * dim), z = randn(51, rows * dim, 2), w = randn(52, dim, 0.3).map((v) => 1 + v);
    const ref = new Float64Array(rows * dim);
    for (let r = 0; r < rows; r++) {
      let ms = 0;
      for (let i = 0; i < dim; i++) ms += x[r * dim + i]! ** 2 / dim;
      for (let i = 0; i < dim; i++) {
        const zi = z[r * dim + i]!;
        ref[r * dim + i] = (w[i]! * x[r * dim + i]!) / Math.sqrt(ms + eps) * (zi / (1 + Math.exp(-zi)));
      }
    }
    const out = new Float32Array(rows * dim);
    gatedRmsNorm(x, z, w, rows, dim, eps, out);
    expect(relMaxErr(ref, out)).toBeLessThan(TOL);
    const inPlace = x.slice();
    gatedRmsNorm(inPlace, z, w, rows, dim, eps, inPlace);
    expect(inPlace).toEqual(out);
  });
});

describe("against transformers' own functions (test/fixtures/linear-attention)", () => {
  // Each test opens the file itself: a `using` here would close it before the tests run.
  const open = () => openSafetensors(`${repoRoot}test/fixtures/linear-attention/reference.safetensors`);
  let file: ReturnType<typeof open>;
  const tensor = (name: string): Float32Array => {
    const view = file.tensors.get(name);
    if (!view || view.dtype !== "F32") throw new Error(`fixture tensor ${name} missing or not F32`);
    return new Float32Array(view.bytes.slice().buffer); // a copy: aligned, and writable
  };
  const meta = (key: string) => JSON.parse(file.metadata[key]!);
  const withFile = (body: () => void) => () => {
    using f = open();
    file = f;
    body();
  };

  test("torch_chunk_gated_delta_rule (chunk 64, 16), torch_recurrent_gated_delta_rule, decode and chunked continuation from a state", withFile(() => {
    const { keyHeads, valueHeads, keyDim, valueDim, prefill: S, decode: S2 } = meta("kernel");
    const shape = { keyHeads, valueHeads, keyDim, valueDim };
    const x: DeltaInputs = { q: tensor("kernel.q"), k: tensor("kernel.k"), v: tensor("kernel.v"), g: tensor("kernel.g"), beta: tensor("kernel.beta") };
    const pre = slice(x, shape, 0, S), post = slice(x, shape, S, S + S2);
    const check = (name: string, out: Float32Array, state: Float32Array) => {
      expectClose({ name }, { out: relMaxErr(tensor(`kernel.${name}.out`), out), state: relMaxErr(tensor(`kernel.${name}.state`), state) });
    };
    for (const [name, kind, chunk] of [["chunk64", "chunked", 64], ["chunk16", "chunked", 16], ["recurrent", "recurrent", undefined]] as const) {
      const state = newDeltaRuleState(shape);
      const out = run(kind, shape, pre, S, state, chunk);
      check(name, out, state.recurrent);
      if (name !== "chunk64") continue;
      const decoded = { recurrent: state.recurrent.slice() }, continued = { recurrent: state.recurrent.slice() };
      check("decode", run("recurrent", shape, post, S2, decoded), decoded.recurrent);
      check("continue", run("chunked", shape, post, S2, continued, 64), continued.recurrent);
    }
  }));

  test("causal_conv1d_update: a decode step from a state", withFile(() => {
    const { channels: C, kernel: K, tokens: S } = meta("conv");
    const before = tensor("conv.state_before"), after = tensor("conv.state_after"); // [C, K]: transformers keeps K columns
    const lastColumns = (s: Float32Array) => Float32Array.from({ length: C * (K - 1) }, (_, i) => s[Math.floor(i / (K - 1)) * K + 1 + (i % (K - 1))]!);
    const state = lastColumns(before);
    const out = new Float32Array(S * C);
    causalConv1dSilu(tensor("conv.x"), S, C, K, tensor("conv.weight"), state, out);
    expect(relMaxErr(tensor("conv.out"), out)).toBeLessThan(TOL);
    expect(state).toEqual(lastColumns(after));
  }));

  test("Qwen3_5MoeRMSNormGated", withFile(() => {
    const { rows, dim, eps } = meta("norm");
    const out = new Float32Array(rows * dim);
    gatedRmsNorm(tensor("norm.x"), tensor("norm.z"), tensor("norm.weight"), rows, dim, eps, out);
    expect(relMaxErr(tensor("norm.out"), out)).toBeLessThan(TOL);
  }));

  test("a whole Qwen3_5MoeGatedDeltaNet: prefill (conv from zeros, chunked rule), decode steps through the cache, a prefill in two pieces", withFile(() => {
    const { hidden: D, keyHeads: Hk, valueHeads: Hv, keyDim: Dk, valueDim: Dv, kernel: K, prefill: P, decode: N, split: P1, eps } = meta("layer");
    const shape = { keyHeads: Hk, valueHeads: Hv, keyDim: Dk, valueDim: Dv };
    const w = (name: string) => tensor(`layer.w.${name}`);
    const keyDimAll = Hk * Dk, valueDimAll = Hv * Dv, C = 2 * keyDimAll + valueDimAll;
    /** y[S, rows] = x[S, cols] · Wᵀ, summed in f64 (nn.Linear, no bias). */
    const linear = (x: Float32Array, S: number, W: Float32Array, rows: number) => {
      const y = new Float32Array(S * rows);
      for (let t = 0; t < S; t++) for (let r = 0; r < rows; r++) {
        let s = 0;
        for (let c = 0; c < D; c++) s += x[t * D + c]! * W[r * D + c]!;
        y[t * rows + r] = s;
      }
      return y;
    };
    const convState = new Float32Array(C * (K - 1));
    const state = newDeltaRuleState(shape);
    const [Wqkv, Wz, Wb, Wa, Wconv, Wout, dtBias, Alog, normW] = ["in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight", "conv1d.weight", "out_proj.weight", "dt_bias", "A_log", "norm.weight"].map(w);
    const layer = (x: Float32Array, S: number, kind: Kernel) => {
      const mixed = linear(x, S, Wqkv!, C);
      const conv = new Float32Array(S * C);
      causalConv1dSilu(mixed, S, C, K, Wconv!, convState, conv); // conv1d.weight [C, 1, K] is [C, K] squeezed
      const q = new Float32Array(S * keyDimAll), k = new Float32Array(S * keyDimAll), v = new Float32Array(S * valueDimAll);
      for (let t = 0; t < S; t++) {
        q.set(conv.subarray(t * C, t * C + keyDimAll), t * keyDimAll);
        k.set(conv.subarray(t * C + keyDimAll, t * C + 2 * keyDimAll), t * keyDimAll);
        v.set(conv.subarray(t * C + 2 * keyDimAll, (t + 1) * C), t * valueDimAll);
      }
      const b = linear(x, S, Wb!, Hv), a = linear(x, S, Wa!, Hv);
      const g = new Float32Array(S * Hv), beta = new Float32Array(S * Hv);
      for (let i = 0; i < S * Hv; i++) {
        const u = a[i]! + dtBias![i % Hv]!;
        g[i] = -Math.exp(Alog![i % Hv]!) * (u > 20 ? u : Math.log1p(Math.exp(u))); // F.softplus, threshold 20
        beta[i] = 1 / (1 + Math.exp(-b[i]!));
      }
      const core = run(kind, shape, { q, k, v, g, beta }, S, state);
      const normed = new Float32Array(S * valueDimAll);
      gatedRmsNorm(core, linear(x, S, Wz!, valueDimAll), normW!, S * Hv, Dv, eps, normed);
      const out = new Float32Array(S * D);
      for (let t = 0; t < S; t++) for (let r = 0; r < D; r++) {
        let s = 0;
        for (let c = 0; c < valueDimAll; c++) s += normed[t * valueDimAll + c]! * Wout![r * valueDimAll + c]!;
        out[t * D + r] = s;
      }
      return out;
    };
    const hidden = tensor("layer.hidden"), ref = tensor("layer.out");
    const pre = layer(hidden.subarray(0, P * D), P, "chunked");
    expect(relMaxErr(ref.subarray(0, P * D), pre)).toBeLessThan(TOL);
    const refConv = tensor("layer.prefill.conv_state"); // [C, K]: the last K pre-conv inputs
    expect(relMaxErr(Float32Array.from({ length: C * (K - 1) }, (_, i) => refConv[Math.floor(i / (K - 1)) * K + 1 + (i % (K - 1))]!), convState)).toBeLessThan(TOL);
    expect(relMaxErr(tensor("layer.prefill.recurrent_state"), state.recurrent)).toBeLessThan(TOL);
    for (let i = 0; i < N; i++) {
      const t = P + i;
      expectClose({ step: i }, { out: relMaxErr(ref.subarray(t * D, (t + 1) * D), layer(hidden.subarray(t * D, (t + 1) * D), 1, "recurrent")) });
    }
    expect(relMaxErr(tensor("layer.final.recurrent_state"), state.recurrent)).toBeLessThan(TOL);
    // The prefill in two pieces through transformers' cache (its chunked rule from the state) == the same pieces here.
    convState.fill(0);
    state.recurrent.fill(0);
    const split = new Float32Array([...layer(hidden.subarray(0, P1 * D), P1, "chunked"), ...layer(hidden.subarray(P1 * D, P * D), P - P1, "chunked")]);
    expectClose({ split: P1 }, { out: relMaxErr(tensor("layer.split.out"), split), vsOnePiece: relMaxErr(ref.subarray(0, P * D), split) });
  }));
});
