/**
 * Test 2: replay correctness. The backend records one command buffer per ticket and replays it with
 * new tables every call, so a stale work list, stale indirect counts, a stale x or a missing barrier
 * would show as one call returning (part of) another call's answer. 1,000 consecutive calls with
 * changing S (1..64), k (1..topK), layer, routing, shared weights and x, each against a fresh f64
 * reference: with forward() on one addressing path and with issue()/take() two tickets in flight on
 * the other, and on the integer-dot path (against its emulation). Negative control: each output is also compared with the previous call's reference
 * (when S matches), which the per-case bound must reject every time.
 *
 * Synchronization validation: MoeBackend.open builds its VulkanContext from the env config only
 * (`new VulkanContext({}, env)`), so `syncValidation` cannot be passed in. The validation layer also
 * reads VK_LAYER_ENABLES from the process environment at vkCreateInstance, so a child process with
 * VK_LAYER_ENABLES=VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT runs a shorter replay
 * under sync validation; in the same child a command buffer with a deliberate read-after-write hazard
 * must be reported, which proves the setting took effect (without it, nothing is reported).
 */
import { describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { ExpertShape } from "../src/pool/expert-layout.ts";
import { mulberry32 } from "../src/quant/index.ts";
import type { MoePath } from "../src/moe/reference.ts";
import { BankOracle, CASE_BOUND, MoeHarness, NMSE_BOUND, PooledError, makeExperts, randomRouting, runReplay, validationEnv } from "./cases/moe.ts";
import { repoRoot } from "./support/paths.ts";
import { runProcess, runtimeExecutable } from "./support/proc.ts";

const SHAPE: ExpertShape = { format: "q4", groupSize: 32, scaleType: "f16", hidden: 32, intermediate: 32 };
const E = 16, TOPK = 4, LAYERS = 2;
const experts = makeExperts(SHAPE, E, LAYERS, 31);
const oracle = new BankOracle(experts, E, SHAPE.hidden, 64, 500);
const idpOracle = new BankOracle(experts, E, SHAPE.hidden, 64, 500, undefined, "integer-dot");
const CALLS = 1000;

function open(addressing: "bda" | "descriptor", tickets = 2, path: MoePath = "float"): MoeHarness {
  return new MoeHarness({ shape: SHAPE, experts: E, topK: TOPK, layers: LAYERS, shared: true, tickets, weights: (l, e) => experts[l]![e]!, addressing, budgetMB: 64 },
    validationEnv({ VKMOE_IDP: path === "integer-dot" ? "on" : "off" }));
}

describe("replay: 1,000 consecutive calls, each against a fresh reference", () => {
  const modes = [["bda", 1, "float"], ["descriptor", 2, "float"], ["bda", 2, "integer-dot"]] as const;
  for (const [addressing, inFlight, path] of modes) {
    test(`${addressing}, ${path} path, ${inFlight === 1 ? "forward()" : "issue()/take() with 2 tickets in flight"}`, () => {
      const t0 = performance.now();
      const h = open(addressing, 2, path);
      try {
        expect(h.moe.mode, h.moe.why).toBe("gpu");
        expect(h.moe.gemvPath).toBe(path);
        const r = runReplay({ moe: h.moe, oracle: path === "float" ? oracle : idpOracle, E, topK: TOPK, layers: LAYERS, shared: true, calls: CALLS, inFlight, seed: inFlight * 10 + 1, label: `${addressing} ${path}` });
        const s = h.moe.stats();
        console.log(`  ${addressing} inFlight=${inFlight}: ${r.pooled.cases} calls, ${r.distinctS} distinct S (max ${r.maxS}), pooled NMSE ${r.pooled.nmse.toExponential(2)}, worst ${r.pooled.worst.toExponential(2)}; stale-output control rejected ${r.staleDetected}/${r.staleChecks}; ${((performance.now() - t0) / 1000).toFixed(1)} s`);
        expect(r.pooled.cases).toBe(CALLS);
        expect(r.pooled.nmse).toBeLessThanOrEqual(NMSE_BOUND);
        expect(r.maxS).toBeGreaterThanOrEqual(33);
        expect(r.distinctS).toBeGreaterThanOrEqual(16);
        expect(s.calls).toBe(CALLS);
        expect(s.cpuPairs).toBe(0);
        expect(s.cache!.pinnedBytes).toBe(0);
        expect(h.logs).toEqual([]);
        // Negative control (b): the previous call's answer is never accepted for this call.
        expect(r.staleChecks).toBeGreaterThan(50);
        expect(r.staleDetected).toBe(r.staleChecks);
      } finally {
        h.finish();
      }
    });
  }

  test("negative control: call N's output checked against call N-1's reference fails", () => {
    const h = open("bda");
    try {
      const D = SHAPE.hidden, S = 3, rnd = mulberry32(99);
      const refs: Float64Array[] = [], ys: Float32Array[] = [];
      for (let call = 0; call < 2; call++) {
        const r = randomRouting(rnd, S, TOPK, E, true);
        const rows = Int32Array.from({ length: S }, () => Math.floor(rnd() * oracle.rows.length));
        const y = new Float32Array(S * D);
        h.moe.forward(1, oracle.x(rows), r, y);
        refs.push(oracle.reference(1, rows, r, true));
        ys.push(y);
      }
      const pooled = new PooledError();
      pooled.add(refs[1]!, ys[1]!, CASE_BOUND, "call 1 vs its own reference");
      expect(pooled.nmse).toBeLessThanOrEqual(NMSE_BOUND);
      expect(() => new PooledError().add(refs[0]!, ys[1]!, CASE_BOUND, "call 1 vs call 0's reference")).toThrow(/above the per-case bound/);
    } finally {
      h.finish();
    }
  });
});

/** The child: hazard control, then replays on both addressing paths (forward and 2 in flight), staged uploads, hybrid, and the integer-dot path. */
const CHILD = `
import { BankOracle, MoeHarness, makeExperts, runReplay, validationEnv, formatMessages } from ${JSON.stringify(join(repoRoot, "test/cases/moe.ts"))};
import { expertLayout } from ${JSON.stringify(join(repoRoot, "src/pool/expert-layout.ts"))};
import { Buffer, CommandPool, ComputePipeline, DescriptorPool, Fence, Submission, VulkanContext } from ${JSON.stringify(join(repoRoot, "src/vk/index.ts"))};
const out = { hazard: [], runs: [] };
{ // control: two dispatches, the second reads what the first wrote, no barrier between
  const ctx = new VulkanContext({}, validationEnv());
  {
    using x = new Buffer(ctx.device, { size: 1024n, memory: "upload" });
    using y = new Buffer(ctx.device, { size: 1024n, memory: "readback" });
    using p = new ComputePipeline(ctx.device, { spirv: ${JSON.stringify(join(repoRoot, "shaders/saxpy.spv"))}, storageBuffers: 2, pushConstantBytes: 12, specialization: { 0: 64 } });
    using pool = new DescriptorPool(ctx.device, 2, 4);
    const a = pool.allocate(p, [{ buffer: x }, { buffer: y }]), b = pool.allocate(p, [{ buffer: y }, { buffer: x }]);
    using cmd = new CommandPool(ctx.device);
    const cb = cmd.allocate().begin().bind(p, a).pushConstants(p, new Uint32Array([256, 0, 0])).dispatch(4).bind(p, b).dispatch(4).barrier("computeToHost").end();
    using f = new Fence(ctx.device);
    using s = new Submission(ctx.device, [cb], { fence: f });
    s.submit();
    f.wait();
  }
  ctx[Symbol.dispose]();
  out.hazard = ctx.instance.takeMessages().map((m) => m.idName);
}
const shape = ${JSON.stringify(SHAPE)};
const E = ${E}, topK = ${TOPK}, layers = ${LAYERS};
const experts = makeExperts(shape, E, layers, 31);
const oracles = { float: new BankOracle(experts, E, shape.hidden, 64, 500), "integer-dot": new BankOracle(experts, E, shape.hidden, 64, 500, undefined, "integer-dot") };
const calls = Number(process.argv[2]);
// budgetExperts: 0 = every expert resident; else room for about that many (hybrid: the rest run on the CPU).
// path "integer-dot" (VKMOE_IDP=on) adds the activation-quantize dispatch and its barrier (not hybrid:
// pairs the CPU runs use float x, so a hybrid call mixes the two paths and no single oracle fits it).
for (const [addressing, inFlight, staged, budgetExperts, path] of [["bda", 1, "auto", 0, "float"], ["descriptor", 2, "auto", 0, "float"], ["bda", 2, "on", 0, "float"], ["descriptor", 1, "on", 6, "float"], ["bda", 2, "auto", 0, "integer-dot"], ["descriptor", 1, "on", 0, "integer-dot"]]) {
  const h = new MoeHarness({ shape, experts: E, topK, layers, shared: true, weights: (l, e) => experts[l][e], addressing, budgetMB: budgetExperts ? (budgetExperts * expertLayout(shape).bytes) / 2 ** 20 : 64 },
    validationEnv({ VKMOE_STAGED: staged, VKMOE_IDP: path === "integer-dot" ? "on" : "off" }));
  let result;
  try {
    result = runReplay({ moe: h.moe, oracle: oracles[path], E, topK, layers, shared: true, calls, inFlight, seed: 7, label: addressing + " " + path });
  } catch (e) {
    result = { error: String(e) };
  }
  const stats = h.moe.stats();
  const memory = h.moe.context?.device.memory.model;
  const messages = h.close();
  out.runs.push({ addressing, inFlight, staged, budgetExperts, path, memory, mode: stats.mode, why: stats.why, gpuPairs: stats.gpuPairs, cpuPairs: stats.cpuPairs,
    nmse: result.pooled?.nmse, cases: result.pooled?.cases, error: result.error, messages: formatMessages(messages), count: messages.length });
}
console.log(JSON.stringify(out));
`;

describe("synchronization validation (child process, VK_LAYER_ENABLES)", () => {
  test("a deliberate hazard is reported (control); replays on both paths, staged uploads and hybrid report nothing", () => {
    const dir = mkdtempSync(join(tmpdir(), "vkmoe-sync-"));
    const file = join(dir, "sync-child.ts");
    writeFileSync(file, CHILD);
    const calls = 100;
    const t0 = performance.now();
    let r;
    try {
      r = runProcess([runtimeExecutable(), file, String(calls)], { env: { VK_LAYER_ENABLES: "VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT" } });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    expect(r.signal).toBeNull();
    expect(r.code, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout.trim().split("\n").at(-1)!);
    console.log(`  sync validation child: ${calls} calls × ${out.runs.length} runs in ${((performance.now() - t0) / 1000).toFixed(1)} s; control reported ${out.hazard.join(", ")}`);
    expect(out.hazard).toContain("SYNC-HAZARD-READ-AFTER-WRITE");
    for (const run of out.runs) {
      const label = `${run.addressing} ${run.path} inFlight=${run.inFlight} staged=${run.staged} budgetExperts=${run.budgetExperts}`;
      expect(run.error, label).toBeUndefined();
      expect(run.mode, label).toBe("gpu");
      expect(run.why, label).toContain(`${run.path} path`);
      expect(run.cases, label).toBe(calls);
      expect(run.nmse, label).toBeLessThanOrEqual(NMSE_BOUND);
      expect(run.messages, label).toBe("");
      expect(run.gpuPairs, label).toBeGreaterThan(0);
      if (run.budgetExperts) expect(run.cpuPairs, label).toBeGreaterThan(0);
      if (run.staged === "on") expect(run.memory, label).toBe("staged");
    }
  });
});
