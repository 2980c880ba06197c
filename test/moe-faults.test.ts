/**
 * Tests 3 and 4: fault paths and the hybrid GPU+CPU split of the MoE layer.
 *  - device lost mid-run (injected): the call still returns the right answer from the CPU, mode
 *    becomes "cpu" with one log line saying "device lost", later calls stay right; also through
 *    issue()/take(), ready(), and with two tickets in flight (in a child process: it used to crash);
 *  - no GPU: VKMOE_GPU=0, a loader that is not there, a missing shader (a temp copy of src/ and
 *    shaders/ without one .spv, in a child process): CPU mode, one line, same results; a
 *    missing shader leaves no Vulkan object behind (the layer's own log file, since the backend's
 *    instance is gone by then);
 *  - budgets: smaller than one expert (everything on the CPU), and room for some experts (hybrid,
 *    both counters > 0), also with two tickets in flight;
 *  - bad input: typed errors (RoutingError / MoeInputError, both InvalidArgumentError) before any
 *    Vulkan call (counted with countCalls) and without touching counters or the cache; NaN or an
 *    infinity in x, which the GPU path finds while the call runs: the same error, the call dropped
 *    (its ticket and pins freed, with pre-launch too).
 * Every in-process backend must leave no validation message, leaks at teardown included.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { InvalidArgumentError } from "../src/errors.ts";
import { MoeInputError } from "../src/moe/backend.ts";
import { RoutingError, type Routing } from "../src/moe/routing.ts";
import { expertLayout, type ExpertShape } from "../src/pool/expert-layout.ts";
import { mulberry32, randomGaussianF32 } from "../src/quant/index.ts";
import { countCalls, type CallCounter, type CoreCommands } from "../src/vk/loader.ts";
import {
  CASE_BOUND, MoeHarness, NMSE_BOUND, PooledError, makeExperts, randomRouting, reference, validationEnv,
} from "./cases/moe.ts";
import { repoRoot } from "./support/paths.ts";
import { runProcess, runtimeExecutable } from "./support/proc.ts";

const SHAPE: ExpertShape = { format: "q4", groupSize: 32, scaleType: "f16", hidden: 64, intermediate: 32 };
const D = SHAPE.hidden;
const E = 16, TOPK = 8, LAYERS = 2;
const experts = makeExperts(SHAPE, E, LAYERS, 41);
const EXPERT_BYTES = expertLayout(SHAPE).bytes;
const MB = (experts: number) => (experts * EXPERT_BYTES) / 2 ** 20;

const tmp = mkdtempSync(join(tmpdir(), "vkmoe-moe-faults-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

function open(options: { budgetMB?: number; addressing?: "bda" | "descriptor"; tickets?: number } = {}, env = validationEnv()): MoeHarness {
  return new MoeHarness({ shape: SHAPE, experts: E, topK: TOPK, layers: LAYERS, shared: true, weights: (l, e) => experts[l]![e]!, budgetMB: 64, ...options }, env);
}

interface Call { layer: number; x: Float32Array; r: Routing; ref: Float64Array }
function makeCall(rnd: () => number, S: number, k: number, layer = 0): Call {
  const r = randomRouting(rnd, S, k, E, rnd() < 0.5);
  const x = randomGaussianF32(S * D, Math.floor(rnd() * 1e9));
  return { layer, x, r, ref: reference(x, r, experts[layer]!, E, true) };
}

/** forward() every call; each against its reference (per-case bound), pooled bound at the end. */
function checkCalls(h: MoeHarness, calls: Call[], label: string, pooled = new PooledError()): PooledError {
  for (const [i, c] of calls.entries()) {
    const y = new Float32Array(c.r.S * D);
    h.moe.forward(c.layer, c.x, c.r, y);
    pooled.add(c.ref, y, CASE_BOUND, `${label} call ${i} (S=${c.r.S}, k=${c.r.k})`);
  }
  expect(pooled.nmse).toBeLessThanOrEqual(NMSE_BOUND);
  return pooled;
}

const pairsOf = (calls: Call[]) => calls.reduce((n, c) => n + c.r.S * (c.r.k + 1), 0);

function someCalls(seed: number, n = 4): Call[] {
  const rnd = mulberry32(seed);
  const shapes: [number, number][] = [[1, 1], [7, 8], [64, 4], [2, 8], [5, 3], [3, 2]];
  return Array.from({ length: n }, (_, i) => makeCall(rnd, shapes[i % shapes.length]![0], shapes[i % shapes.length]![1], i % LAYERS));
}

/**
 * Vulkan FFI calls made by `fn`, counted with countCalls. The loader's table is shared by every
 * context of the process and countCalls wraps it in place once, so the counter is installed once per
 * table and left in place (a Map update per call); a good call must count > 0 (positive control).
 */
const counters = new Map<CoreCommands, CallCounter>();
function countVulkanCalls(vk: CoreCommands, fn: () => void): number {
  let c = counters.get(vk);
  if (!c) counters.set(vk, (c = countCalls(vk)));
  c.reset();
  fn();
  return c.total();
}

/** Writes a child script and runs it with the same runtime; returns its last stdout line as JSON. */
function runChild(name: string, code: string, opts: { args?: string[]; env?: Record<string, string>; cwd?: string } = {}): any {
  const file = join(opts.cwd ?? tmp, name);
  writeFileSync(file, code);
  const r = runProcess([runtimeExecutable(), file, ...(opts.args ?? [])], { env: opts.env, cwd: opts.cwd });
  expect(r.signal, `${name} died: ${r.stderr.slice(-2000)}`).toBeNull();
  expect(r.code, `${name} exited ${r.code}: ${r.stderr.slice(-2000)}`).toBe(0);
  return JSON.parse(r.stdout.trim().split("\n").at(-1)!);
}
const CASES = JSON.stringify(join(repoRoot, "test/cases/moe.ts"));

describe("device lost mid-run", () => {
  test("forward(): the call is answered by the CPU, mode becomes cpu with one 'device lost' line, later calls stay right", () => {
    const h = open();
    try {
      expect(h.moe.mode, h.moe.why).toBe("gpu");
      const calls = someCalls(1, 6);
      checkCalls(h, calls.slice(0, 2), "before");
      const gpuPairs = h.moe.stats().gpuPairs;
      h.moe.injectDeviceLost();
      checkCalls(h, calls.slice(2, 3), "the call that meets the lost device");
      expect(h.moe.mode).toBe("cpu");
      expect(h.moe.context).toBeUndefined();
      expect(h.logs).toHaveLength(1);
      expect(h.logs[0]).toContain("device lost");
      expect(h.logs[0]!.split("\n")).toHaveLength(1);
      expect(h.moe.why).toContain("device lost");
      checkCalls(h, calls.slice(3), "after");
      const s = h.moe.stats();
      // The lost call and every later one ran on the CPU. (gpuPairs also still counts the lost
      // call's pairs, counted when they were submitted: not asserted either way.)
      expect(s.cpuPairs).toBe(pairsOf(calls.slice(2)));
      expect(s.gpuPairs).toBeGreaterThanOrEqual(gpuPairs);
      expect(s.cache).toBeUndefined();
      expect(h.logs).toHaveLength(1);
    } finally {
      h.finish(); // what the drop destroyed was reported to the captured instance
    }
  });

  test("issue()/take() and ready(): the lost call and the next ones are right", async () => {
    const h = open({ addressing: "descriptor" });
    try {
      const [a, b, c] = someCalls(2, 3);
      const t = h.moe.issue(a!.layer, a!.x, a!.r);
      h.moe.injectDeviceLost();
      await t.ready();
      const y = new Float32Array(a!.r.S * D);
      t.take(y);
      new PooledError().add(a!.ref, y, CASE_BOUND, "lost call (ready, then take)");
      expect(h.moe.mode).toBe("cpu");
      expect(h.logs.filter((l) => l.includes("device lost"))).toHaveLength(1);
      const tb = h.moe.issue(b!.layer, b!.x, b!.r);
      await tb.ready();
      const yb = new Float32Array(b!.r.S * D);
      tb.take(yb);
      new PooledError().add(b!.ref, yb, CASE_BOUND, "after, CPU ticket");
      checkCalls(h, [c!], "after, forward");
      expect(h.logs).toHaveLength(1);
    } finally {
      h.finish();
    }
  });

  test("two tickets in flight when the device is lost: both answers right, no crash (child process)", () => {
    const out = runChild("lost-two.ts", `
      import { MoeHarness, makeExperts, randomRouting, reference, caseNmse, formatMessages } from ${CASES};
      import { randomGaussianF32, mulberry32 } from ${JSON.stringify(join(repoRoot, "src/quant/index.ts"))};
      const shape = ${JSON.stringify(SHAPE)}, E = ${E};
      const experts = makeExperts(shape, E, 1, 41);
      const h = new MoeHarness({ shape, experts: E, topK: 8, layers: 1, shared: true, weights: (l, e) => experts[l][e], budgetMB: 64, addressing: process.argv[2] });
      const rnd = mulberry32(5);
      const calls = [3, 5].map((S, i) => { const r = randomRouting(rnd, S, 4, E); const x = randomGaussianF32(S * shape.hidden, 10 + i); return { r, x, ref: reference(x, r, experts[0], E, true) }; });
      const tickets = calls.map((c) => h.moe.issue(0, c.x, c.r));
      h.moe.injectDeviceLost();
      const nmse = calls.map((c, i) => { const y = new Float32Array(c.r.S * shape.hidden); tickets[i].take(y); return caseNmse(c.ref, y); });
      const mode = h.moe.mode, logs = h.logs.slice();
      const messages = formatMessages(h.close());
      console.log(JSON.stringify({ nmse, mode, logs, messages }));
    `, { args: ["bda"] });
    expect(out.mode).toBe("cpu");
    expect(out.logs).toHaveLength(1);
    for (const n of out.nmse) expect(n).toBeLessThanOrEqual(CASE_BOUND);
    expect(out.messages).toBe("");
  });
});

describe("no GPU path: CPU mode with one line, same results", () => {
  test("VKMOE_GPU=0", () => {
    const h = open({}, validationEnv({ VKMOE_GPU: false }));
    try {
      expect(h.moe.mode).toBe("cpu");
      expect(h.moe.why).toBe("VKMOE_GPU=0");
      expect(h.logs).toEqual(["vkmoe: running the MoE layer on the CPU: VKMOE_GPU=0"]);
      expect(h.instance).toBeUndefined();
      const calls = someCalls(3, 5);
      checkCalls(h, calls, "cpu");
      const s = h.moe.stats();
      expect(s.gpuPairs).toBe(0);
      expect(s.cpuPairs).toBe(pairsOf(calls));
      expect(s.cache).toBeUndefined();
      // The GPU backend gives the same answers for the same calls.
      const g = open();
      try {
        expect(g.moe.mode).toBe("gpu");
        checkCalls(g, calls, "gpu");
        expect(g.moe.stats().cpuPairs).toBe(0);
      } finally {
        g.finish();
      }
      expect(h.logs).toHaveLength(1);
    } finally {
      h.finish();
    }
  });

  test("no Vulkan loader (VKMOE_LOADER=/nonexistent in a child's environment)", () => {
    const out = runChild("no-loader.ts", `
      import { MoeHarness, makeExperts, randomRouting, reference, PooledError, validationEnv } from ${CASES};
      import { randomGaussianF32, mulberry32 } from ${JSON.stringify(join(repoRoot, "src/quant/index.ts"))};
      const shape = ${JSON.stringify(SHAPE)}, E = ${E};
      const experts = makeExperts(shape, E, 1, 41);
      const h = new MoeHarness({ shape, experts: E, topK: 8, layers: 1, shared: true, weights: (l, e) => experts[l][e] }, validationEnv());
      const rnd = mulberry32(6), pooled = new PooledError();
      for (const S of [1, 7, 64]) {
        const r = randomRouting(rnd, S, 8, E), x = randomGaussianF32(S * shape.hidden, S);
        const y = new Float32Array(S * shape.hidden);
        h.moe.forward(0, x, r, y);
        pooled.add(reference(x, r, experts[0], E, true), y, 1e-6, "S=" + S);
      }
      console.log(JSON.stringify({ mode: h.moe.mode, why: h.moe.why, logs: h.logs, nmse: pooled.nmse, cpuPairs: h.moe.stats().cpuPairs }));
    `, { env: { VKMOE_LOADER: "/nonexistent/libvulkan.so.1" } });
    expect(out.mode).toBe("cpu");
    expect(out.logs).toHaveLength(1);
    expect(out.logs[0]).toContain("no Vulkan loader");
    expect(out.why).toContain("no Vulkan loader");
    expect(out.nmse).toBeLessThanOrEqual(NMSE_BOUND);
    expect(out.cpuPairs).toBe(72 * 9);
  });

  test("VKMOE_LOADER given in the env argument of MoeBackend.open is honoured", () => {
    // open(options, env) takes the whole VKMOE_* configuration; VKMOE_LOADER is part of it.
    const h = open({}, validationEnv({ VKMOE_LOADER: "/nonexistent/libvulkan.so.1" }));
    try {
      expect(h.moe.mode).toBe("cpu");
      expect(h.logs.join("\n")).toContain("/nonexistent/libvulkan.so.1");
    } finally {
      h.finish();
    }
  });

  describe("a missing shader (temp copy of src/ and shaders/, child process)", () => {
    /** A copy of the library whose shaders/ lacks `missing`; the child imports the backend from it. */
    function copyWithout(missing: string): string {
      const dir = mkdtempSync(join(tmp, "copy-"));
      cpSync(join(repoRoot, "src"), join(dir, "src"), { recursive: true });
      cpSync(join(repoRoot, "shaders"), join(dir, "shaders"), { recursive: true });
      symlinkSync(join(repoRoot, "node_modules"), join(dir, "node_modules"));
      rmSync(join(dir, "shaders", `${missing}.spv`));
      // The validation layer reads vk_layer_settings.txt from the working directory: log every
      // warning and error to a file too, so leaks at vkDestroyDevice are seen even after the
      // backend dropped its instance.
      writeFileSync(join(dir, "vk_layer_settings.txt"), [
        "khronos_validation.debug_action = VK_DBG_LAYER_ACTION_LOG_MSG",
        "khronos_validation.report_flags = error,warn",
        `khronos_validation.log_filename = ${join(dir, "layer.log")}`,
      ].join("\n") + "\n");
      return dir;
    }
    const layerLog = (dir: string) => (existsSync(join(dir, "layer.log")) ? readFileSync(join(dir, "layer.log"), "utf8") : "");
    const leaks = (log: string) => log.split("\n").filter((l) => /VUID|Validation (Error|Warning)/.test(l)).map((l) => l.slice(0, 300));

    const backendChild = (addressing: string) => `
      import { MoeBackend } from "./src/moe/backend.ts";
      import { makeExperts, randomRouting, reference, PooledError, validationEnv } from ${CASES};
      import { randomGaussianF32, mulberry32 } from "./src/quant/index.ts";
      const shape = ${JSON.stringify(SHAPE)}, E = ${E};
      const experts = makeExperts(shape, E, 1, 41);
      const logs = [];
      const moe = MoeBackend.open({ shape, experts: E, topK: 8, layers: 1, shared: true, addressing: ${JSON.stringify(addressing)}, weights: (l, e) => experts[l][e], log: (l) => logs.push(l) },
        validationEnv()); // the float path's files (the integer-dot ones are the probe's to vet)
      const rnd = mulberry32(7), pooled = new PooledError();
      for (const S of [1, 7]) {
        const r = randomRouting(rnd, S, 8, E), x = randomGaussianF32(S * shape.hidden, S);
        const y = new Float32Array(S * shape.hidden);
        moe.forward(0, x, r, y);
        pooled.add(reference(x, r, experts[0], E, true), y, 1e-6, "S=" + S);
      }
      moe[Symbol.dispose]();
      console.log(JSON.stringify({ mode: moe.mode, why: moe.why, logs, nmse: pooled.nmse }));
    `;

    const variants = [["moe_gateup_q4_bda", "bda", "auto"], ["moe_down_q4_desc", "descriptor", "auto"], ["moe_sum", "bda", "auto"], ["moe_gateup_q4_desc", "descriptor", "on"]] as const;
    for (const [missing, addressing, staged] of variants) {
      test(`${missing}.spv missing${staged === "on" ? " (VKMOE_STAGED=on: the pool has a staging uploader)" : ""}: CPU mode, one line naming the file, right answers, nothing leaked`, () => {
        const dir = copyWithout(missing);
        const out = runChild("backend-child.ts", backendChild(addressing), { cwd: dir, env: { VKMOE_STAGED: staged } });
        expect(out.mode).toBe("cpu");
        expect(out.logs).toHaveLength(1);
        expect(out.logs[0]).toContain(`${missing}.spv`);
        expect(out.why).toContain("cannot read");
        expect(out.nmse).toBeLessThanOrEqual(NMSE_BOUND);
        expect(leaks(layerLog(dir))).toEqual([]);
      });
    }

    test("createMoePipelines throws ShaderFileError and leaves no Vulkan object when the second pipeline's file is missing", () => {
      const dir = copyWithout("moe_down_q4_bda");
      const out = runChild("pipelines-child.ts", `
        import { createMoePipelines } from "./src/moe/shaders.ts";
        import { chooseKernelConfig } from "./src/kernels/tuning.ts";
        import { VulkanContext } from "./src/vk/context.ts";
        import { ShaderFileError } from "./src/vk/errors.ts";
        import { formatMessages } from ${CASES};
        const ctx = new VulkanContext({ validation: true });
        let error;
        try {
          createMoePipelines(ctx.device, chooseKernelConfig(ctx.device.info), ${JSON.stringify(SHAPE)}, "bda");
        } catch (e) {
          error = { name: e.name, isShaderFileError: e instanceof ShaderFileError, path: e.path };
        }
        ctx[Symbol.dispose]();
        console.log(JSON.stringify({ error, messages: formatMessages(ctx.instance.takeMessages()) }));
      `, { cwd: dir });
      expect(out.error).toMatchObject({ name: "ShaderFileError", isShaderFileError: true, path: join(dir, "shaders", "moe_down_q4_bda.spv") });
      expect(out.messages).toBe(""); // the gate+up pipeline made before the failure must be destroyed
    });
  });
});

describe("budgets", () => {
  test("a budget smaller than one expert: every pair on the CPU, results right", () => {
    const h = open({ budgetMB: MB(0.5) });
    try {
      expect(h.moe.mode).toBe("gpu");
      const calls = someCalls(4, 4);
      checkCalls(h, calls, "tiny budget");
      const s = h.moe.stats();
      expect(s.gpuPairs).toBe(0);
      expect(s.cpuPairs).toBe(pairsOf(calls));
      expect(s.cache!.residentBytes).toBe(0);
      expect(h.logs).toEqual([]);
    } finally {
      h.finish();
    }
  });

  for (const addressing of ["bda", "descriptor"] as const) {
    test(`hybrid (${addressing}): room for 6 of 34 experts; results right, GPU and CPU pairs both > 0`, () => {
      const h = open({ budgetMB: MB(6), addressing });
      try {
        const rnd = mulberry32(addressing === "bda" ? 8 : 9);
        const calls = [[1, 8], [7, 8], [64, 8], [3, 2], [16, 4], [2, 1]].map(([S, k], i) => makeCall(rnd, S!, k!, i % LAYERS));
        checkCalls(h, calls, "hybrid");
        const s = h.moe.stats();
        console.log(`  hybrid ${addressing}: gpuPairs ${s.gpuPairs}, cpuPairs ${s.cpuPairs}, resident ${s.cache!.residentCount} experts`);
        expect(s.gpuPairs).toBeGreaterThan(0);
        expect(s.cpuPairs).toBeGreaterThan(0);
        expect(s.cache!.residentBytes).toBeLessThanOrEqual(s.cache!.budget);
        expect(s.cache!.pinnedBytes).toBe(0);
      } finally {
        h.finish();
      }
    });
  }

  test("hybrid with two tickets in flight: each call gets its own CPU share", () => {
    const h = open({ budgetMB: MB(6) });
    try {
      const rnd = mulberry32(10);
      const calls = [3, 5, 2, 4, 6, 1].map((S, i) => makeCall(rnd, S, 4, i % LAYERS));
      const pooled = new PooledError();
      let prev: { c: Call; t: ReturnType<typeof h.moe.issue> } | undefined;
      const settle = (p: { c: Call; t: ReturnType<typeof h.moe.issue> }, i: number) => {
        const y = new Float32Array(p.c.r.S * D);
        p.t.take(y);
        pooled.add(p.c.ref, y, CASE_BOUND, `in flight, call ${i}`);
      };
      calls.forEach((c, i) => {
        const t = h.moe.issue(c.layer, c.x, c.r);
        if (prev) settle(prev, i - 1);
        prev = { c, t };
      });
      settle(prev!, calls.length - 1);
      const s = h.moe.stats();
      expect(s.gpuPairs).toBeGreaterThan(0);
      expect(s.cpuPairs).toBeGreaterThan(0);
      expect(pooled.nmse).toBeLessThanOrEqual(NMSE_BOUND);
    } finally {
      h.finish();
    }
  });
});

describe("wait styles", () => {
  // "spin" polls the completion word the last kernel (sum, or the fused kernel) writes into
  // host memory, then polls the fence a few times (vkGetFenceStatus) before sleeping on it.
  test("spin: right results, 3 to 6 FFI calls per call, and the completion word carries each call's sequence number (grouped and fused calls)", () => {
    const h = new MoeHarness({ shape: SHAPE, experts: E, topK: TOPK, layers: LAYERS, shared: true, weights: (l, e) => experts[l]![e]!, budgetMB: 64, wait: "spin", tickets: 1 });
    try {
      const calls = someCalls(41, 6);
      checkCalls(h, calls.slice(0, 1), "warm");
      const layer = (h.moe as any).gpu.layer;
      const ticket = layer.tickets[0];
      const seen: number[] = [];
      const fusedBefore = h.moe.stats().fusedCalls;
      for (const c of calls.slice(1)) {
        const y = new Float32Array(c.r.S * D);
        // submit, 1 to 3 vkGetFenceStatus (+ vkWaitForFences if the fence is still unsignaled), reset
        const n = countVulkanCalls(h.moe.context!.device.vk, () => h.moe.forward(c.layer, c.x, c.r, y));
        expect(n).toBeGreaterThanOrEqual(3);
        expect(n).toBeLessThanOrEqual(6);
        new PooledError().add(c.ref, y, CASE_BOUND, "spin wait");
        expect(ticket.views.done[0]).toBe(ticket.seq); // written by the GPU, after the fence
        seen.push(ticket.seq);
      }
      // S = 7, 64, 2, 5, 3: the two calls of S <= 4 ran fused (its last workgroup writes the word), the others grouped (sum does).
      expect(h.moe.stats().fusedCalls - fusedBefore).toBe(2);
      expect(new Set(seen).size).toBe(5); // a new number every call: a stale word cannot pass
      // Negative control: a word that does not match (as if the kernel had not written it) makes the
      // spin give up after its time limit; the fence still makes the answer right.
      ticket.views.done[0] = -1;
      const c = calls[0]!;
      const y = new Float32Array(c.r.S * D);
      h.moe.forward(c.layer, c.x, c.r, y);
      new PooledError().add(c.ref, y, CASE_BOUND, "spin wait after a clobbered word");
      expect(ticket.views.done[0]).toBe(ticket.seq);
    } finally {
      h.finish();
    }
  });
});

describe("tickets", () => {
  test("more calls issued than tickets before taking: every take is right, or issue says no with a typed error", () => {
    const h = open({ tickets: 2 });
    try {
      const calls = someCalls(11, 3);
      const tickets: (ReturnType<typeof h.moe.issue> | undefined)[] = [];
      for (const c of calls) {
        try {
          tickets.push(h.moe.issue(c.layer, c.x, c.r));
        } catch (e) {
          expect(e).toBeInstanceOf(InvalidArgumentError);
          tickets.push(undefined);
        }
      }
      calls.forEach((c, i) => {
        if (!tickets[i]) return;
        const y = new Float32Array(c.r.S * D);
        tickets[i]!.take(y);
        new PooledError().add(c.ref, y, CASE_BOUND, `call ${i} of 3 issued with 2 tickets`);
      });
    } finally {
      h.finish();
    }
  });

  test("a ticket taken twice is a typed error; a short y is a typed error that leaves nothing pinned", () => {
    const h = open({ budgetMB: MB(20) });
    try {
      const [c] = someCalls(12, 2).slice(1);
      const t = h.moe.issue(c!.layer, c!.x, c!.r);
      const y = new Float32Array(c!.r.S * D);
      t.take(y);
      expect(() => t.take(y)).toThrow(InvalidArgumentError);
      const short = new Float32Array(c!.r.S * D - 1);
      expect(() => h.moe.forward(c!.layer, c!.x, c!.r, short)).toThrow(MoeInputError);
      expect(h.moe.stats().cache!.pinnedBytes).toBe(0);
      checkCalls(h, [c!], "after the short y");
    } finally {
      h.finish();
    }
  });
});

describe("bad input: typed errors", () => {
  const rnd = mulberry32(13);
  const good = () => makeCall(rnd, 2, 3, 1);
  type Bad = [label: string, type: typeof RoutingError | typeof MoeInputError, make: () => [number, Float32Array, Routing]];
  const bad: Bad[] = [
    ["expert id = E", RoutingError, () => { const c = good(); c.r.ids[4] = E; return [c.layer, c.x, c.r]; }],
    ["expert id -1", RoutingError, () => { const c = good(); c.r.ids[0] = -1; return [c.layer, c.x, c.r]; }],
    ["duplicate id within a token", RoutingError, () => { const c = good(); c.r.ids[5] = c.r.ids[3]!; return [c.layer, c.x, c.r]; }],
    ["NaN router weight", RoutingError, () => { const c = good(); c.r.weights[2] = NaN; return [c.layer, c.x, c.r]; }],
    ["-Infinity router weight", RoutingError, () => { const c = good(); c.r.weights[1] = -Infinity; return [c.layer, c.x, c.r]; }],
    ["NaN shared weight", RoutingError, () => { const c = good(); c.r.sharedWeights = new Float32Array([1, NaN]); return [c.layer, c.x, c.r]; }],
    ["shared weights of the wrong length", RoutingError, () => { const c = good(); c.r.sharedWeights = new Float32Array(3); return [c.layer, c.x, c.r]; }],
    ["x one float short", MoeInputError, () => { const c = good(); return [c.layer, c.x.subarray(0, c.x.length - 1), c.r]; }],
    ["x one token long", MoeInputError, () => { const c = good(); return [c.layer, new Float32Array(c.x.length + D), c.r]; }],
    ["x as Float64Array", MoeInputError, () => { const c = good(); return [c.layer, Float64Array.from(c.x) as unknown as Float32Array, c.r]; }],
    ["S = 0", RoutingError, () => [0, new Float32Array(0), { S: 0, k: 1, ids: new Int32Array(0), weights: new Float32Array(0) }]],
    ["S = 65", RoutingError, () => { const c = makeCall(rnd, 65, 1); return [0, c.x, c.r]; }],
    ["S = 1.5", RoutingError, () => { const c = good(); return [c.layer, c.x, { ...c.r, S: 1.5 }]; }],
    ["k = 17", RoutingError, () => [0, new Float32Array(D), { S: 1, k: 17, ids: Int32Array.from({ length: 17 }, (_, i) => i % E), weights: new Float32Array(17) }]],
    ["k = 0", RoutingError, () => [0, new Float32Array(D), { S: 1, k: 0, ids: new Int32Array(0), weights: new Float32Array(0) }]],
    ["ids of the wrong length", RoutingError, () => { const c = good(); return [c.layer, c.x, { ...c.r, ids: c.r.ids.subarray(1) }]; }],
    ["ids as a plain array", RoutingError, () => { const c = good(); return [c.layer, c.x, { ...c.r, ids: Array.from(c.r.ids) as unknown as Int32Array }]; }],
    ["weights of the wrong length", RoutingError, () => { const c = good(); return [c.layer, c.x, { ...c.r, weights: c.r.weights.subarray(1) }]; }],
    ["layer -1", MoeInputError, () => { const c = good(); return [-1, c.x, c.r]; }],
    ["layer = layers", MoeInputError, () => { const c = good(); return [LAYERS, c.x, c.r]; }],
    ["layer 0.5", MoeInputError, () => { const c = good(); return [0.5, c.x, c.r]; }],
  ];

  for (const env of [validationEnv(), validationEnv({ VKMOE_GPU: false })]) {
    const where = env.VKMOE_GPU ? "GPU mode" : "CPU mode";
    test(`${where}: ${bad.length} kinds of bad input, each rejected with its type and no Vulkan call; the backend stays usable`, () => {
      const h = open({}, env);
      try {
        checkCalls(h, [good()], "before");
        const vk = h.moe.context?.device.vk;
        const before = h.moe.stats();
        for (const [label, type, make] of bad) {
          const [layer, x, r] = make();
          const attempt = () => h.moe.forward(layer, x, r, new Float32Array(Math.max(1, r.S) * D * 2));
          let err: unknown;
          const run = () => { try { attempt(); } catch (e) { err = e; } };
          const vkCalls = vk ? countVulkanCalls(vk, run) : (run(), 0);
          expect(err, label).toBeInstanceOf(type);
          expect(err, label).toBeInstanceOf(InvalidArgumentError);
          expect(vkCalls, `${label}: Vulkan calls`).toBe(0);
        }
        expect(h.moe.stats()).toEqual(before); // no call counted, no pair, no cache lookup
        const after = [good(), good()];
        const goodCalls = vk ? countVulkanCalls(vk, () => checkCalls(h, after, "after")) : (checkCalls(h, after, "after"), 0);
        if (vk) expect(goodCalls).toBeGreaterThan(0); // the counter sees the calls a good forward() makes
        expect(h.moe.mode).toBe(env.VKMOE_GPU ? "gpu" : "cpu");
      } finally {
        h.finish();
      }
    });
  }

  // x's values are checked while the GPU runs (off the critical path): the error is the same, the
  // call's GPU work is dropped. Three bad calls on two tickets: a ticket kept by a dropped call
  // would turn the third into TicketsExhaustedError; a pin kept would show in pinnedBytes.
  const badX: [label: string, at: number, value: number][] = [["NaN", D + 7, NaN], ["Infinity", 0, Infinity], ["-Infinity", 2 * D - 1, -Infinity]];
  const modes: [string, NonNullable<Parameters<typeof validationEnv>[0]>][] = [["GPU mode", {}], ["GPU mode, pre-launched", { VKMOE_PRELAUNCH: "on" }], ["CPU mode", { VKMOE_GPU: false }]];
  for (const [where, envChange] of modes) {
    test(`${where}: NaN or an infinity in x is a MoeInputError naming it; the call is dropped, tickets and pins freed, a call in flight unharmed`, () => {
      const h = open({ tickets: 2 }, validationEnv(envChange));
      try {
        const pending = makeCall(rnd, 1, 8);
        checkCalls(h, [pending], "before"); // S=1 twice in a row: arms a kernel where pre-launch is on
        const inFlight = h.moe.issue(pending.layer, pending.x, pending.r);
        for (const [label, at, value] of badX) {
          const c = makeCall(rnd, 2, 8);
          c.x[at] = value;
          let err: unknown;
          try {
            h.moe.forward(c.layer, c.x, c.r, new Float32Array(2 * D));
          } catch (e) {
            err = e;
          }
          expect(err, label).toBeInstanceOf(MoeInputError);
          expect((err as Error).message, label).toContain(`x[${Math.floor(at / D)}][${at % D}] is ${value}`);
        }
        const y = new Float32Array(D);
        inFlight.take(y);
        const inFlightError = new PooledError();
        inFlightError.add(pending.ref, y, CASE_BOUND, "the call in flight");
        expect(inFlightError.nmse).toBeLessThanOrEqual(NMSE_BOUND);
        expect(h.moe.stats().cache?.pinnedBytes ?? 0).toBe(0);
        checkCalls(h, [makeCall(rnd, 1, 8), makeCall(rnd, 3, 2), makeCall(rnd, 1, 8)], "after");
        expect(h.moe.mode).toBe(envChange.VKMOE_GPU === false ? "cpu" : "gpu");
      } finally {
        h.finish();
      }
    });
  }

  test("k above the backend's topK is a typed error, not a crash in the GPU tables", () => {
    const h = open(); // topK 8
    try {
      const c = makeCall(rnd, 64, 16);
      let err: unknown;
      const vk = h.moe.context!.device.vk;
      const vkCalls = countVulkanCalls(vk, () => {
        try {
          h.moe.forward(0, c.x, c.r, new Float32Array(64 * D));
        } catch (e) {
          err = e;
        }
      });
      expect(err).toBeInstanceOf(InvalidArgumentError);
      expect(vkCalls).toBe(0);
      expect(countVulkanCalls(vk, () => checkCalls(h, [good()], "after"))).toBeGreaterThan(0);
      expect(h.moe.stats().cache!.pinnedBytes).toBe(0);
    } finally {
      h.finish();
    }
  });
});
