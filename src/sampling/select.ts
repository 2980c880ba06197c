/**
 * Candidate selection without sorting the vocabulary. One order is used everywhere: larger logit first, and
 * among equal logits the lower token id first. -Infinity and NaN logits are never candidates.
 */

/** Index of the largest logit, the lowest such index on ties; -1 when no logit is > -Infinity. */
export function argmax(logits: Float32Array): number {
  let best = -1;
  let bestValue = -Infinity;
  for (let i = 0; i < logits.length; i++) {
    const v = logits[i];
    if (v > bestValue) { // strict: a tie keeps the earlier (lower) id; NaN never compares greater
      bestValue = v;
      best = i;
    }
  }
  return best;
}

/** Whether candidate a (id, value) ranks below candidate b. */
function ranksBelow(aValue: number, aId: number, bValue: number, bId: number): boolean {
  return aValue < bValue || (aValue === bValue && aId > bId);
}

/** Restores the heap property below `root` in a heap whose root is the lowest-ranked candidate. */
function siftDown(ids: Int32Array, values: Float64Array, size: number, root: number): void {
  const id = ids[root];
  const value = values[root];
  let at = root;
  for (;;) {
    let child = 2 * at + 1;
    if (child >= size) break;
    if (child + 1 < size && ranksBelow(values[child + 1], ids[child + 1], values[child], ids[child])) child++;
    if (!ranksBelow(values[child], ids[child], value, id)) break;
    ids[at] = ids[child];
    values[at] = values[child];
    at = child;
  }
  ids[at] = id;
  values[at] = value;
}

function siftUp(ids: Int32Array, values: Float64Array, at: number): void {
  const id = ids[at];
  const value = values[at];
  while (at > 0) {
    const parent = (at - 1) >> 1;
    if (!ranksBelow(value, id, values[parent], ids[parent])) break;
    ids[at] = ids[parent];
    values[at] = values[parent];
    at = parent;
  }
  ids[at] = id;
  values[at] = value;
}

/** Sorts the first `n` candidates best-first, in place (heapsort: no allocation, O(n log n)). */
export function sortBestFirst(ids: Int32Array, values: Float64Array, n: number): void {
  for (let i = (n >> 1) - 1; i >= 0; i--) siftDown(ids, values, n, i);
  for (let size = n - 1; size > 0; size--) {
    // the root is the lowest-ranked of what is left: it goes to the back
    const id = ids[0];
    const value = values[0];
    ids[0] = ids[size];
    values[0] = values[size];
    ids[size] = id;
    values[size] = value;
    siftDown(ids, values, size, 0);
  }
}

/**
 * The k best candidates of `logits`, best-first, into ids/values (each at least k long); returns how many
 * there are (fewer than k when fewer logits are > -Infinity). One pass with a k-entry heap whose root is the
 * weakest kept candidate: most logits lose a single comparison against it, so this is O(vocab) in practice.
 */
export function selectTopK(logits: Float32Array, k: number, ids: Int32Array, values: Float64Array): number {
  let size = 0;
  const vocab = logits.length;
  let i = 0;
  for (; i < vocab && size < k; i++) {
    const v = logits[i];
    if (!(v > -Infinity)) continue;
    ids[size] = i;
    values[size] = v;
    siftUp(ids, values, size++);
  }
  if (size === k && k > 0) {
    let weakest = values[0];
    for (; i < vocab; i++) {
      const v = logits[i];
      // strict: an equal logit has a higher id than everything kept, so it ranks below the root
      if (v > weakest) {
        ids[0] = i;
        values[0] = v;
        siftDown(ids, values, k, 0);
        weakest = values[0];
      }
    }
  }
  sortBestFirst(ids, values, size);
  return size;
}
