/** Quantized weight formats, conversion, GGML block formats, and the CPU GEMVs. Formats are specified in FORMATS.md. */
export type { DenseSource, GroupSize, QuantFormat, QuantMatrix, QuantizeOptions, ScaleType } from "./types.ts";
export { MAX_TOKENS, SUPPORTED_FORMATS, SUPPORTED_GROUP_SIZES, SUPPORTED_SCALE_TYPES } from "./types.ts";
export {
  BufferTooShortError,
  GgufLayoutError,
  InvalidDimensionError,
  NonFiniteValueError,
  ScaleRangeError,
  ShapeMismatchError,
  UnsupportedFormatError,
  UnsupportedGroupSizeError,
} from "./errors.ts";
export {
  bf16ArrayToF32,
  bf16BitsToF32,
  f16ArrayToF32,
  f16BitsToF32,
  f32ToBf16Bits,
  f32ToF16Bits,
} from "./half.ts";
export {
  colsPerWord,
  createQuantMatrix,
  decodeScales,
  getQ,
  getScale,
  getScaleBits,
  groupsPerRowFor,
  paddedColsFor,
  rowWordsFor,
  scaleWordsFor,
  setQ,
  setScaleBits,
  zeroWord,
} from "./layout.ts";
export { checkGemvArgs, validateQuantMatrix } from "./validate.ts";
export { quantize } from "./quantize.ts";
export { dequantize } from "./dequantize.ts";
export { dequantizeGgufRow, fromGgufQ4_0, fromGgufQ8_0 } from "./gguf.ts";
export {
  checkGgmlScalesFinite,
  dequantizeGgml,
  dequantizeGgmlRow,
  GGML_BLOCK_LAYOUTS,
  GGML_BLOCK_TYPES,
  ggmlBlockTensor,
  isGgmlBlockType,
  type GgmlBlockLayout,
  type GgmlBlockTensor,
  type GgmlBlockType,
} from "./ggml-blocks.ts";
export { gemvGgmlBlocks } from "./ggml-gemv.ts";
export { gateUpReference, gemvReference } from "./gemv-reference.ts";
export { gateUpCpu, gemvCpu } from "./gemv-cpu.ts";
export { frexpExponent, gemvIntDotEmulated, quantizeActivations, type QuantizedActivations } from "./intdot.ts";
export { maxAbsDiff, nmse } from "./metrics.ts";
export { gaussian, mulberry32, randomGaussianF32, randomWords } from "./random.ts";
