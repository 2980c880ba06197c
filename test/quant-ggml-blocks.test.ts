/**
 * GGML block formats (src/quant/ggml-blocks.ts, ggml-gemv.ts): dequantization bit for bit against
 * gguf-py on tensors llama.cpp's llama-quantize made (test/fixtures/ggml-blocks/blocks.gguf, made by
 * scripts/fixtures/make-ggml-blocks-fixture.ts; committed, so this always runs), the CPU GEMV over the
 * blocks against an f64 reference, the model layer's dense and expert matrices of these types, and
 * the typed errors for bad input.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { openGguf } from "../src/formats/gguf.ts";
import type { GgufFile, TensorDType, TensorFile, TensorView } from "../src/formats/tensor.ts";
import type { Qwen3MoeConfig } from "../src/model/config.ts";
import { ModelWeightsError } from "../src/model/errors.ts";
import { loadWeights } from "../src/model/weights.ts";
import { GgmlBlockLinear } from "../src/model/linear.ts";
import { GgufLayoutError, InvalidDimensionError, NonFiniteValueError, ShapeMismatchError, UnsupportedFormatError } from "../src/quant/errors.ts";
import {
  dequantizeGgml,
  dequantizeGgmlRow,
  GGML_BLOCK_LAYOUTS,
  GGML_BLOCK_TYPES,
  ggmlBlockTensor,
  type GgmlBlockTensor,
  type GgmlBlockType,
} from "../src/quant/ggml-blocks.ts";
import { gemvGgmlBlocks } from "../src/quant/ggml-gemv.ts";
import { f32ToF16Bits } from "../src/quant/half.ts";
import { nmse } from "../src/quant/metrics.ts";
import { mulberry32, randomGaussianF32 } from "../src/quant/random.ts";
import { repoRoot } from "./support/paths.ts";

const FIXTURE = `${repoRoot}test/fixtures/ggml-blocks/blocks.gguf`;
const file: GgufFile = await openGguf(FIXTURE);
afterAll(() => file[Symbol.dispose]());

/** The fixture's quantized tensors of `type` (e.g. "Q4_K.expert") with gguf-py's values beside each. */
function fixtureTensors(type: GgmlBlockType): { view: TensorView; tensor: GgmlBlockTensor; expected: Float32Array }[] {
  const found = [...file.tensors.values()].filter((t) => t.dtype === type);
  return found.map((view) => {
    const [rows, cols] = view.shape as [number, number];
    const oracle = file.tensors.get(`${view.name}.dequant`)!;
    expect(oracle.dtype).toBe("F32");
    const expected = new Float32Array(oracle.bytes.slice().buffer);
    return { view, tensor: ggmlBlockTensor(type, view.bytes, rows, cols, view.name), expected };
  });
}

const bitsOf = (a: Float32Array) => Array.from(new Uint32Array(a.buffer, a.byteOffset, a.length));
const hex = (bits: number) => bits.toString(16).padStart(8, "0");

/** f64 y = x · Wᵀ from the dequantized matrix. */
function referenceGemv(w: Float32Array, rows: number, cols: number, x: Float32Array, S: number): Float64Array {
  const y = new Float64Array(S * rows);
  for (let s = 0; s < S; s++) {
    for (let r = 0; r < rows; r++) {
      let acc = 0;
      for (let c = 0; c < cols; c++) acc += w[r * cols + c]! * x[s * cols + c]!;
      y[s * rows + r] = acc;
    }
  }
  return y;
}

/** Random block bytes whose f16 scales are finite, of either sign, within 2^-10 .. 2^1 (sub-scales and q random). */
function randomBlocks(type: GgmlBlockType, rows: number, cols: number, seed: number): Uint8Array {
  const { blockElements, blockBytes, halfOffsets } = GGML_BLOCK_LAYOUTS[type];
  const rand = mulberry32(seed);
  const bytes = new Uint8Array(rows * (cols / blockElements) * blockBytes);
  for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(rand() * 256);
  for (let p = 0; p < bytes.length; p += blockBytes) {
    for (const h of halfOffsets) {
      const bits = f32ToF16Bits((rand() < 0.5 ? -1 : 1) * 2 ** (-10 + 11 * rand()));
      bytes[p + h] = bits & 0xff;
      bytes[p + h + 1] = bits >> 8;
    }
  }
  return bytes;
}

describe("the fixture (llama-quantize output) opens through openGguf", () => {
  test("every GGML block type is present, shaped [rows, cols] with several blocks per row and odd row counts", () => {
    for (const type of GGML_BLOCK_TYPES) {
      const tensors = fixtureTensors(type);
      expect(tensors.length).toBeGreaterThanOrEqual(2);
      for (const { tensor } of tensors) {
        expect(tensor.rows % 2).toBe(1);
        expect(tensor.cols / GGML_BLOCK_LAYOUTS[type].blockElements).toBeGreaterThanOrEqual(3);
      }
    }
  });
});

describe("dequantization is gguf-py's, bit for bit", () => {
  for (const type of GGML_BLOCK_TYPES) {
    test(type, () => {
      for (const { view, tensor, expected } of fixtureTensors(type)) {
        const got = dequantizeGgml(tensor);
        const a = new Uint32Array(got.buffer), b = new Uint32Array(expected.buffer);
        expect(a.length).toBe(b.length);
        let first = -1, count = 0;
        for (let i = 0; i < a.length; i++) {
          if (a[i] !== b[i]) {
            if (first < 0) first = i;
            count++;
          }
        }
        const where = first < 0 ? "" : `${view.name}: ${count} of ${a.length} differ, first at [${Math.floor(first / tensor.cols)}, ${first % tensor.cols}]: ${got[first]} (0x${hex(a[first]!)}) vs gguf-py ${expected[first]} (0x${hex(b[first]!)})`;
        expect(where).toBe("");
        // A fixture of zeros would prove nothing.
        expect(new Set(got).size).toBeGreaterThan(100);
        // One row alone decodes the same.
        const row = new Float32Array(tensor.cols);
        dequantizeGgmlRow(tensor, tensor.rows - 1, row);
        expect(bitsOf(row)).toEqual(bitsOf(got.subarray((tensor.rows - 1) * tensor.cols)));
      }
    });
  }
});

describe("CPU GEMV over the blocks matches the f64 reference (NMSE <= 1e-9)", () => {
  for (const type of GGML_BLOCK_TYPES) {
    test(`${type}: fixture tensors and random blocks (13 rows x 4 super-blocks / 32 blocks), S = 1, 3, 70`, () => {
      const cases = fixtureTensors(type).map(({ tensor }) => tensor);
      cases.push(ggmlBlockTensor(type, randomBlocks(type, 13, 1024, 7), 13, 1024));
      for (const w of cases) {
        const matrix = dequantizeGgml(w);
        for (const S of [1, 3, 70]) {
          const x = randomGaussianF32(S * w.cols, 100 + S);
          const y = new Float32Array(S * w.rows);
          gemvGgmlBlocks(w, x, S, y);
          const ref = referenceGemv(matrix, w.rows, w.cols, x, S);
          expect(nmse(ref, y)).toBeLessThanOrEqual(1e-9);
          // The Linear the model layer uses gives the same answer, also with longer buffers than needed.
          const linear = new GgmlBlockLinear(type, w.bytes, w.rows, w.cols);
          const y2 = new Float32Array(S * w.rows + 5);
          const x2 = new Float32Array(S * w.cols + 7);
          x2.set(x);
          linear.apply(x2, S, y2);
          expect(y2.subarray(0, S * w.rows)).toEqual(y);
        }
      }
    });
  }

  test("Linear kind and bytes: held in place, named by the GGML type", () => {
    const bytes = randomBlocks("Q6_K", 3, 512, 1);
    const linear = new GgmlBlockLinear("Q6_K", bytes, 3, 512);
    expect(linear.kind).toBe("q6_k");
    expect(linear.bytes).toBe(3 * 2 * 210);
    expect(linear.tensor.bytes).toBe(bytes);
  });
});

describe("bad input gets the quant module's typed errors", () => {
  test("wrong byte length names the shape, the block size and both lengths", () => {
    const bytes = new Uint8Array(3 * 2 * 144 - 1);
    expect(() => ggmlBlockTensor("Q4_K", bytes, 3, 512, "blk.0.attn_q.weight")).toThrow(GgufLayoutError);
    expect(() => ggmlBlockTensor("Q4_K", bytes, 3, 512, "blk.0.attn_q.weight")).toThrow(
      "blk.0.attn_q.weight: a [3, 512] Q4_K tensor is 3*2 blocks of 144 bytes = 864 bytes, got 863",
    );
  });

  test("cols not a multiple of the block", () => {
    expect(() => ggmlBlockTensor("Q6_K", new Uint8Array(210), 1, 288)).toThrow(
      new GgufLayoutError("GGML tensor: Q6_K rows hold whole 256-element blocks; cols must be a multiple of 256, got 288"),
    );
    expect(() => ggmlBlockTensor("Q5_0", new Uint8Array(22), 1, 48)).toThrow(GgufLayoutError);
  });

  test("unknown type, bad dimensions, bad operands", () => {
    expect(() => ggmlBlockTensor("Q2_K", new Uint8Array(84), 1, 256)).toThrow(UnsupportedFormatError);
    expect(() => ggmlBlockTensor("Q4_1", new Uint8Array(0), 0, 32)).toThrow(InvalidDimensionError);
    const w = ggmlBlockTensor("Q4_1", randomBlocks("Q4_1", 2, 64, 3), 2, 64);
    expect(() => gemvGgmlBlocks(w, new Float32Array(63), 1, new Float32Array(2))).toThrow(ShapeMismatchError);
    expect(() => gemvGgmlBlocks(w, new Float32Array(64), 1, new Float32Array(3))).toThrow(ShapeMismatchError);
    expect(() => gemvGgmlBlocks(w, new Float32Array(64), 0, new Float32Array(0))).toThrow(InvalidDimensionError);
    const nan = new Float32Array(64);
    nan[5] = NaN;
    expect(() => gemvGgmlBlocks(w, nan, 1, new Float32Array(2))).toThrow(NonFiniteValueError);
  });

  test("a NaN/Inf block scale is refused when the Linear is made, naming row and block", () => {
    const bytes = randomBlocks("Q5_K", 3, 768, 4);
    const p = (1 * 3 + 2) * 176 + 2; // row 1, block 2, dmin
    bytes[p] = 0x00;
    bytes[p + 1] = 0x7c; // +Inf
    expect(() => new GgmlBlockLinear("Q5_K", bytes, 3, 768, "blk.0.attn_q.weight")).toThrow(
      new NonFiniteValueError("blk.0.attn_q.weight: row 1, block 2: the f16 scale at byte 2 of the Q5_K block is NaN or infinite"),
    );
  });
});

describe("the model layer (loadWeights) on a GGUF whose dense tensors are GGML block types", () => {
  const D = 256, HD = 128, E = 4, I = 256, V = 8;
  const cfg: Qwen3MoeConfig = {
    architecture: "qwen3_moe", hidden: D, layers: 1, heads: 2, kvHeads: 1, headDim: HD, experts: E, topK: 2,
    expertIntermediate: I, denseIntermediate: 512, vocab: V, ropeTheta: 1e6, rmsEps: 1e-6, normTopkProb: true,
    tieEmbeddings: false, maxPositions: 4096, moeLayers: [true], ropeFrequencies: "f32",
  };
  /** An in-memory TensorFile: block types get random blocks with finite scales, floats zeros. */
  function file(types: Partial<Record<string, GgmlBlockType>>): TensorFile {
    const specs: [string, number[]][] = [
      ["token_embd.weight", [V, D]], ["output.weight", [V, D]], ["output_norm.weight", [D]],
      ["blk.0.attn_norm.weight", [D]], ["blk.0.ffn_norm.weight", [D]], ["blk.0.attn_q_norm.weight", [HD]], ["blk.0.attn_k_norm.weight", [HD]],
      ["blk.0.attn_q.weight", [2 * HD, D]], ["blk.0.attn_k.weight", [HD, D]], ["blk.0.attn_v.weight", [HD, D]], ["blk.0.attn_output.weight", [D, 2 * HD]],
      ["blk.0.ffn_gate_inp.weight", [E, D]], ["blk.0.ffn_gate_exps.weight", [E, I, D]], ["blk.0.ffn_up_exps.weight", [E, I, D]], ["blk.0.ffn_down_exps.weight", [E, D, I]],
    ];
    const tensors = new Map<string, TensorView>();
    specs.forEach(([name, shape], i) => {
      const type = types[name];
      const cols = shape[shape.length - 1]!, rows = shape.reduce((a, b) => a * b, 1) / cols;
      const bytes = type ? randomBlocks(type, rows, cols, i) : new Uint8Array(rows * cols * 4);
      tensors.set(name, { name, dtype: (type ?? "F32") as TensorDType, shape, bytes });
    });
    return { format: "gguf", tensors, mappedBytes: 0, [Symbol.dispose]: () => {} };
  }
  const dense = {
    "token_embd.weight": "Q4_K", "output.weight": "Q6_K", "blk.0.attn_q.weight": "Q4_K", "blk.0.attn_k.weight": "Q5_K",
    "blk.0.attn_v.weight": "Q6_K", "blk.0.attn_output.weight": "Q4_1",
  } as const;

  test("dense matrices become in-place block Linears, embedding rows are GGML's dequantized rows", () => {
    const f = file(dense);
    const w = loadWeights(f, cfg, { experts: "none", dense: "none" }, "test.gguf");
    const a = w.layers[0]!.attention;
    expect([a.q.kind, a.k.kind, a.v.kind, a.o.kind, w.lmHead.kind]).toEqual(["q4_k", "q5_k", "q6_k", "q4_1", "q6_k"]);
    const embed = f.tensors.get("token_embd.weight")!;
    const all = dequantizeGgml(ggmlBlockTensor("Q4_K", embed.bytes, V, D));
    const row = new Float32Array(D);
    w.embed(5, row);
    expect(bitsOf(row)).toEqual(bitsOf(all.subarray(5 * D, 6 * D)));
  });

  test("block-typed routed experts load as \"ggml\": each expert matrix a block Linear of its own type, in place in the file", () => {
    const f = file({ ...dense, "blk.0.ffn_gate_exps.weight": "Q4_K", "blk.0.ffn_up_exps.weight": "Q4_K", "blk.0.ffn_down_exps.weight": "Q6_K" });
    const w = loadWeights(f, cfg, { experts: "none", dense: "none" }, "test.gguf");
    const layer = w.layers[0]!;
    const stacks = ["gate", "up", "down"].map((m) => f.tensors.get(`blk.0.ffn_${m}_exps.weight`)!);
    expect(layer.expertFormat).toBe("ggml");
    expect(layer.expertTypes).toEqual(["Q4_K", "Q6_K"]);
    expect(layer.expertBytes).toBe(stacks.reduce((n, t) => n + t.bytes.byteLength, 0));
    const m = w.expert(0, 1);
    if (m.kind !== "linear") throw new Error(`expert kind ${m.kind}`);
    const linears = [m.gate, m.up, m.down] as GgmlBlockLinear[];
    expect(linears.map((l) => [l.kind, l.rows, l.cols, l.bytes])).toEqual([["q4_k", I, D, I * 144], ["q4_k", I, D, I * 144], ["q6_k", D, I, D * 210]]);
    linears.forEach((l, k) => {
      // A view of expert 1's slice of the stacked tensor: no copy.
      expect(l.tensor.bytes.buffer).toBe(stacks[k]!.bytes.buffer);
      expect(l.tensor.bytes.byteOffset).toBe(stacks[k]!.bytes.byteOffset + stacks[k]!.bytes.byteLength / E);
    });
  });

  test("a NaN scale in a block expert is refused when that expert is first made, naming tensor, expert, row and block; other types are refused at load", () => {
    const f = file({ ...dense, "blk.0.ffn_gate_exps.weight": "Q4_K", "blk.0.ffn_up_exps.weight": "Q4_K", "blk.0.ffn_down_exps.weight": "Q6_K" });
    const down = f.tensors.get("blk.0.ffn_down_exps.weight")!;
    down.bytes.set([0x00, 0x7e], (2 * down.bytes.byteLength) / E + 3 * 210 + 208); // expert 2, row 3, block 0: d = NaN
    const w = loadWeights(f, cfg, { experts: "none", dense: "none" }, "test.gguf");
    expect(() => w.expert(0, 1)).not.toThrow();
    expect(() => w.expert(0, 2)).toThrow(
      new NonFiniteValueError("test.gguf: tensor blk.0.ffn_down_exps.weight (expert 2): row 3, block 0: the f16 scale at byte 208 of the Q6_K block is NaN or infinite"),
    );
    const g = file(dense);
    const gate = g.tensors.get("blk.0.ffn_gate_exps.weight")!;
    (g.tensors as Map<string, TensorView>).set(gate.name, { ...gate, dtype: "Q2_K" as TensorDType });
    expect(() => loadWeights(g, cfg, { experts: "none", dense: "none" }, "test.gguf")).toThrow(
      new ModelWeightsError("test.gguf: tensor blk.0.ffn_gate_exps.weight is Q2_K, which routed experts cannot be"),
    );
  });
});
