/** Markdown tables for benchmark output: numeric cells right-aligned, text left-aligned. */

const numeric = /^[-+]?[\d.,]+(e[-+]?\d+)?\s*(%|x|×)?$/i;

export function formatTable(rows: readonly (readonly string[])[]): string {
  const cols = Math.max(...rows.map((r) => r.length));
  const widths = Array.from({ length: cols }, (_, i) => Math.max(3, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (r: readonly string[], header: boolean) =>
    `| ${widths.map((w, i) => {
      const v = r[i] ?? "";
      return !header && numeric.test(v) ? v.padStart(w) : v.padEnd(w);
    }).join(" | ")} |`;
  const [head, ...body] = rows;
  const sep = `|${widths.map((w, i) => (body.some((r) => numeric.test(r[i] ?? "")) ? `${"-".repeat(w + 1)}:` : "-".repeat(w + 2))).join("|")}|`;
  return [line(head ?? [], true), sep, ...body.map((r) => line(r, false))].join("\n");
}

/** Significant digits without exponent notation for the ranges benchmarks print. */
export function fmt(v: number, digits = 3): string {
  if (!Number.isFinite(v)) return "—";
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 10 ** digits) return v.toFixed(0);
  return v.toPrecision(digits).replace(/^(-?\d+)\.$/, "$1");
}

export function median(xs: readonly number[]): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

export function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}

export function mean(xs: readonly number[]): number {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN;
}
