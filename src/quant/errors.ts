/** Typed errors of the quant module; all are InvalidArgumentError, raised before any work is done. */
import { InvalidArgumentError } from "../errors.ts";

/** Group size other than 32, 64 or 128. */
export class UnsupportedGroupSizeError extends InvalidArgumentError {}

/** Format, scale type or dtype that does not exist. */
export class UnsupportedFormatError extends InvalidArgumentError {}

/** A dimension or token count that is not an integer or is out of range. */
export class InvalidDimensionError extends InvalidArgumentError {}

/** Lengths or layouts that disagree with each other (rowWords, x/y lengths, gate vs up shapes). */
export class ShapeMismatchError extends InvalidArgumentError {}

/** A weights, scales or data array shorter than its shape requires. */
export class BufferTooShortError extends InvalidArgumentError {}

/** NaN or infinity where a finite number is required. The message names where it is. */
export class NonFiniteValueError extends InvalidArgumentError {}

/** A scale that cannot be stored in the requested scale type (f16 overflow). */
export class ScaleRangeError extends InvalidArgumentError {}

/** A GGUF tensor whose shape or byte length does not fit its blocks (Q4_0/Q8_0, or GGML's Q4_1 ... Q6_K). */
export class GgufLayoutError extends InvalidArgumentError {}
