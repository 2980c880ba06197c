/**
 * A progress bar on stderr. On a terminal it redraws one line (at most every 100 ms); otherwise
 * it prints the label once and one summary line when done, so logs stay readable.
 */
import { stderrIsTTY, writeStderr } from "./cli.ts";

const WIDTH = 28;

export class Progress {
  private done = 0;
  private readonly t0 = performance.now();
  private lastDraw = 0;
  private readonly tty = stderrIsTTY();
  private finished = false;

  /** `bytesPerUnit` adds a byte count ("1.2 GB") to the line. */
  constructor(private readonly label: string, private readonly total: number, private readonly unit = "", private readonly bytesPerUnit = 0) {
    if (!this.tty) writeStderr(`${label}: ${total}${unit ? ` ${unit}` : ""}...\n`);
    else this.draw();
  }

  tick(n = 1): void {
    this.done += n;
    if (!this.tty) return;
    const now = performance.now();
    if (now - this.lastDraw >= 100 || this.done >= this.total) this.draw();
  }

  private line(): string {
    const f = this.total > 0 ? Math.min(1, this.done / this.total) : 1;
    const bar = "#".repeat(Math.round(f * WIDTH)).padEnd(WIDTH, ".");
    const bytes = this.bytesPerUnit ? `, ${formatBytes(this.done * this.bytesPerUnit)}` : "";
    return `${this.label} [${bar}] ${(100 * f).toFixed(0).padStart(3)}% ${this.done}/${this.total}${this.unit ? ` ${this.unit}` : ""}${bytes}, ${((performance.now() - this.t0) / 1000).toFixed(1)} s`;
  }

  private draw(): void {
    this.lastDraw = performance.now();
    writeStderr(`\r${this.line()}\x1b[K`);
  }

  /** Final line (always printed). Returns the seconds taken. */
  finish(): number {
    const s = (performance.now() - this.t0) / 1000;
    if (this.finished) return s;
    this.finished = true;
    if (this.tty) {
      this.draw();
      writeStderr("\n");
    } else writeStderr(`${this.line()}\n`);
    return s;
  }
}

export function formatBytes(b: number): string {
  if (b >= 1e9) return `${(b / 1e9).toFixed(2)} GB`;
  if (b >= 1e6) return `${(b / 1e6).toFixed(1)} MB`;
  if (b >= 1e3) return `${(b / 1e3).toFixed(1)} kB`;
  return `${b} B`;
}
