/**
 * Ordering of the CPU's stores to mapped device memory. Such memory is often write-combining (a
 * discrete GPU's BAR): stores may reach the device late and out of order. A locked
 * read-modify-write (x86: `lock xchg`, which drains the write-combining buffers; ARM: a full
 * barrier) between two groups of stores makes the first group visible to the device before any
 * store of the second. The word is in a SharedArrayBuffer so that the engine must perform the
 * exchange atomically.
 */
const fenceWord = new Int32Array(new SharedArrayBuffer(4));

export function storeFence(): void {
  Atomics.exchange(fenceWord, 0, 0);
}
