/**
 * A hint to collect garbage now, for loops that churn through large typed arrays faster than the
 * collector notices (JavaScriptCore counts their memory late): Bun.gc where it exists, V8's gc()
 * when exposed, otherwise nothing.
 */
export function collectGarbage(): void {
  const bun = (globalThis as any).Bun;
  if (bun?.gc) bun.gc(false);
  else (globalThis as any).gc?.();
}
