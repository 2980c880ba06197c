/**
 * GPT-2's byte-to-unicode table: ByteLevel BPE vocabularies spell every byte as one printable
 * character (printable Latin-1 as itself, the other 68 bytes as U+0100..U+0143), so a token string
 * maps back to its exact bytes. The streaming detokenizer works on those bytes.
 */

/** BYTE_TO_CHAR[b] is the character that spells byte b. */
export const BYTE_TO_CHAR: readonly string[] = (() => {
  const printable = (b: number) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const table: string[] = [];
  let extra = 0;
  for (let b = 0; b < 256; b++) table.push(String.fromCharCode(printable(b) ? b : 256 + extra++));
  return table;
})();

/** CHAR_TO_BYTE[code unit] is the byte it spells, or -1: every spelling character is below U+0144. */
const CHAR_TO_BYTE: Int16Array = (() => {
  const table = new Int16Array(0x144).fill(-1);
  BYTE_TO_CHAR.forEach((ch, b) => (table[ch.charCodeAt(0)] = b));
  return table;
})();

/** The bytes a ByteLevel token string spells, or undefined when it has a character outside the table (not a ByteLevel token). */
export function byteLevelToBytes(token: string): Uint8Array | undefined {
  const bytes = new Uint8Array(token.length);
  for (let i = 0; i < token.length; i++) {
    const code = token.charCodeAt(i);
    const b = code < CHAR_TO_BYTE.length ? CHAR_TO_BYTE[code]! : -1;
    if (b < 0) return undefined;
    bytes[i] = b;
  }
  return bytes;
}

/** Text of a ByteLevel token string (invalid UTF-8 becomes U+FFFD), or the string itself when it is not ByteLevel. */
export function byteLevelToText(token: string): string {
  const bytes = byteLevelToBytes(token);
  return bytes ? new TextDecoder("utf-8", { ignoreBOM: true }).decode(bytes) : token;
}
