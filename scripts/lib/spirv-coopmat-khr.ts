// Rewrites a SPIR-V module's VK_NV_cooperative_matrix instructions as VK_KHR_cooperative_matrix ones.
// Why: Debian 12's glslang (12) emits only the NV extension and its spirv-tools (2023.1) cannot
// assemble the KHR one, but the KHR extension is what AMD's drivers offer and what NVIDIA's
// well-trodden path (llama.cpp's matrix-core GEMMs) uses. The two extensions' instructions differ only
// in their operands:
//   OpTypeCooperativeMatrixNV  %t %comp %scope %rows %cols       -> OpTypeCooperativeMatrixKHR ... %use
//   OpCooperativeMatrixLoadNV  %rt %r %ptr %stride %colMajor [mem] -> LoadKHR  %rt %r %ptr %layout %stride [mem]
//   OpCooperativeMatrixStoreNV %ptr %obj %stride %colMajor [mem]   -> StoreKHR %ptr %obj %layout %stride [mem]
//   OpCooperativeMatrixMulAddNV %rt %r %a %b %c                    -> MulAddKHR (same operands)
//   OpCooperativeMatrixLengthNV                                     -> LengthKHR (same operands)
// A KHR matrix type names its use (A, B or accumulator), which the NV type leaves to the MulAdd that
// takes it: each type's use is read off the MulAdds, and a type used in two roles is an error (the
// shader must declare distinct types, as gemm_coopmat_tile.glsl does). The layout operand is a
// 32-bit integer constant id (0 row-major, 1 column-major) where NV has a bool constant id.
// Only what glslang emits for these shaders is handled; anything else is an error, never a guess.

const MAGIC = 0x07230203;
const Op = {
  Extension: 10, TypeInt: 21, TypeBool: 20, Constant: 43, ConstantTrue: 41, ConstantFalse: 42, Capability: 17,
  TypeCooperativeMatrixNV: 5358, CooperativeMatrixLoadNV: 5359, CooperativeMatrixStoreNV: 5360,
  CooperativeMatrixMulAddNV: 5361, CooperativeMatrixLengthNV: 5362,
  TypeCooperativeMatrixKHR: 4456, CooperativeMatrixLoadKHR: 4457, CooperativeMatrixStoreKHR: 4458,
  CooperativeMatrixMulAddKHR: 4459, CooperativeMatrixLengthKHR: 4460,
} as const;
const CAPABILITY_COOPMAT_NV = 5357;
const CAPABILITY_COOPMAT_KHR = 6022;
const USE = { a: 0, b: 1, accumulator: 2 } as const;

export class SpirvRewriteError extends Error {
  override name = "SpirvRewriteError";
}

interface Instruction { op: number; words: number[] }

function decode(words: Uint32Array): { header: number[]; body: Instruction[] } {
  if (words.length < 5 || words[0] !== MAGIC) throw new SpirvRewriteError("not a SPIR-V module (magic number)");
  const body: Instruction[] = [];
  for (let i = 5; i < words.length;) {
    const count = words[i]! >>> 16, op = words[i]! & 0xffff;
    if (count === 0 || i + count > words.length) throw new SpirvRewriteError(`malformed instruction at word ${i}`);
    body.push({ op, words: Array.from(words.subarray(i + 1, i + count)) });
    i += count;
  }
  return { header: Array.from(words.subarray(0, 5)), body };
}

function encode(header: number[], body: Instruction[]): Uint32Array {
  const out: number[] = [...header];
  for (const ins of body) out.push(((ins.words.length + 1) << 16) | ins.op, ...ins.words);
  return Uint32Array.from(out);
}

/** A null-terminated SPIR-V literal string, padded to whole words. */
function stringWords(s: string): number[] {
  const bytes = new Uint8Array(Math.floor(s.length / 4) * 4 + 4);
  for (let i = 0; i < s.length; i++) bytes[i] = s.charCodeAt(i);
  return Array.from(new Uint32Array(bytes.buffer));
}

function readString(words: number[]): string {
  const bytes = new Uint8Array(Uint32Array.from(words).buffer);
  const end = bytes.indexOf(0);
  return String.fromCharCode(...bytes.subarray(0, end < 0 ? bytes.length : end));
}

/** The module with its NV cooperative-matrix instructions as KHR ones; a module without any is an error. */
export function nvToKhrCoopmat(input: Uint32Array): Uint32Array {
  const { header, body } = decode(input);
  if (!body.some((i) => i.op === Op.TypeCooperativeMatrixNV)) throw new SpirvRewriteError("no OpTypeCooperativeMatrixNV to rewrite");
  let bound = header[3]!;

  // each matrix type's role, from the MulAdds (result type and C: the accumulator)
  const use = new Map<number, number>();
  const setUse = (type: number | undefined, u: number, what: string) => {
    if (type === undefined) throw new SpirvRewriteError(`a MulAdd's ${what} has no known matrix type`);
    const had = use.get(type);
    if (had !== undefined && had !== u) throw new SpirvRewriteError(`matrix type %${type} is used in two roles (${had} and ${u}): declare distinct types`);
    use.set(type, u);
  };
  // a MulAdd operand may be a load, another MulAdd, a constant or a variable's load: follow the ids
  // whose types are known, and take the types of the others from the instructions that make them
  const typeOfId = new Map<number, number>();
  const matrixTypes = new Set(body.filter((i) => i.op === Op.TypeCooperativeMatrixNV).map((i) => i.words[0]!));
  const annotations = new Set([5, 6, 71, 72, 332]); // OpName, OpMemberName, OpDecorate, OpMemberDecorate, OpDecorateId: a type as their target
  for (const i of body) {
    // instructions with a result type first: [resultType, result, ...]
    if (i.words.length >= 2 && matrixTypes.has(i.words[0]!) && !annotations.has(i.op)) typeOfId.set(i.words[1]!, i.words[0]!);
  }
  for (const i of body) if (i.op === Op.CooperativeMatrixMulAddNV) {
    const [rt, , a, b, c] = i.words;
    setUse(typeOfId.get(a!), USE.a, "A");
    setUse(typeOfId.get(b!), USE.b, "B");
    setUse(typeOfId.get(c!), USE.accumulator, "C");
    setUse(rt, USE.accumulator, "result");
  }
  for (const t of matrixTypes) if (!use.has(t)) throw new SpirvRewriteError(`matrix type %${t} is never used by a MulAdd: its role is unknown`);

  // 32-bit unsigned integer constants for the uses and layouts (made where glslang did not)
  const uintType = body.find((i) => i.op === Op.TypeInt && i.words[1] === 32 && i.words[2] === 0)?.words[0];
  if (uintType === undefined) throw new SpirvRewriteError("no 32-bit unsigned integer type to make constants of");
  const constants = new Map<number, number>();
  for (const i of body) if (i.op === Op.Constant && i.words[0] === uintType && !constants.has(i.words[2]!)) constants.set(i.words[2]!, i.words[1]!);
  const added: Instruction[] = [];
  const uintConstant = (v: number) => {
    let id = constants.get(v);
    if (id === undefined) {
      id = bound++;
      constants.set(v, id);
      added.push({ op: Op.Constant, words: [uintType, id, v] });
    }
    return id;
  };
  const bools = new Map<number, boolean>();
  for (const i of body) {
    if (i.op === Op.ConstantTrue) bools.set(i.words[1]!, true);
    if (i.op === Op.ConstantFalse) bools.set(i.words[1]!, false);
  }
  const layoutOf = (colMajorId: number) => {
    const b = bools.get(colMajorId);
    if (b === undefined) throw new SpirvRewriteError(`a load or store's column-major operand %${colMajorId} is not a bool constant`);
    return uintConstant(b ? 1 : 0);
  };

  const out: Instruction[] = [];
  for (const i of body) {
    switch (i.op) {
      case Op.Capability:
        out.push(i.words[0] === CAPABILITY_COOPMAT_NV ? { op: i.op, words: [CAPABILITY_COOPMAT_KHR] } : i);
        break;
      case Op.Extension: {
        const name = readString(i.words);
        out.push(name === "SPV_NV_cooperative_matrix" ? { op: i.op, words: stringWords("SPV_KHR_cooperative_matrix") } : i);
        break;
      }
      case Op.TypeCooperativeMatrixNV: {
        const [result, comp, scope, rows, cols] = i.words;
        out.push({ op: Op.TypeCooperativeMatrixKHR, words: [result!, comp!, scope!, rows!, cols!, uintConstant(use.get(result!)!)] });
        break;
      }
      case Op.CooperativeMatrixLoadNV: {
        const [rt, r, ptr, stride, colMajor, ...mem] = i.words;
        out.push({ op: Op.CooperativeMatrixLoadKHR, words: [rt!, r!, ptr!, layoutOf(colMajor!), stride!, ...mem] });
        break;
      }
      case Op.CooperativeMatrixStoreNV: {
        const [ptr, obj, stride, colMajor, ...mem] = i.words;
        out.push({ op: Op.CooperativeMatrixStoreKHR, words: [ptr!, obj!, layoutOf(colMajor!), stride!, ...mem] });
        break;
      }
      case Op.CooperativeMatrixMulAddNV:
        out.push({ op: Op.CooperativeMatrixMulAddKHR, words: i.words });
        break;
      case Op.CooperativeMatrixLengthNV:
        out.push({ op: Op.CooperativeMatrixLengthKHR, words: i.words });
        break;
      default:
        out.push(i);
    }
  }
  // the constants made while rewriting: right after their type, before any matrix type uses them
  if (added.length > 0) {
    const at = out.findIndex((i) => i.op === Op.TypeInt && i.words[0] === uintType);
    out.splice(at + 1, 0, ...added);
  }
  header[3] = bound;
  for (const i of out) if (i.op >= 5357 && i.op <= 5362) throw new SpirvRewriteError(`an NV cooperative-matrix instruction (op ${i.op}) is left`);
  return encode(header, out);
}
