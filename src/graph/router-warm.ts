/**
 * The post norm + router + route step (dec_router_route with the norm folded in) run once ahead of
 * time on one row of stand-ins, beside the mixer's long step two steps before it (the attention, or
 * a linear-attention layer's delta rule), with no barrier between. In the decode graph the real
 * step then found its code, and the layer's router weights, in the cache: 20.9 → 15.2 µs a layer on
 * an H100 (docs/measurements.md, 2026-12-08), as NormFeed.recordWarm did for the norm after the experts.
 *
 * The stand-ins (ones, so the norm and the route take the real rows' code paths: stand-ins.ts) are
 * this module's own: the warm dispatch reads the layer's router weights, norm weights and expert
 * table, and writes nothing any other step reads or writes.
 */
import { InvalidArgumentError } from "../errors.ts";
import type { RouterRouteArgs, RouterRouteKernel } from "../kernels/decoder/router-route.ts";
import type { CommandBuffer } from "../vk/commands.ts";
import type { Device } from "../vk/device.ts";
import type { Buffer } from "../vk/memory.ts";
import { filledBuffer } from "./stand-ins.ts";

export class RouterWarm implements Disposable {
  private readonly owned = new DisposableStack();
  private readonly h: Buffer;
  private readonly add: Buffer;
  private readonly xn: Buffer;
  private readonly logits: Buffer;
  private readonly work: Buffer;
  private readonly pairs: Buffer;
  private readonly slotWeight: Buffer;
  private readonly slotExpert: Buffer;
  private readonly chosen: Buffer;
  /** The warm call's own arrival word (0 between calls, as the real one's). */
  private readonly arrived: Buffer;

  /** `cols`: the router's columns (the hidden size); `experts`, `topK`: the model's. */
  constructor(device: Device, cols: number, experts: number, topK: number) {
    const filled = (floats: number, value: number) => this.owned.use(filledBuffer(device, floats, value));
    try {
      this.h = filled(cols, 1);
      this.add = filled(cols, 1);
      this.xn = filled(cols, 0);
      this.logits = filled(experts, 0);
      this.work = filled(4 * (1 + topK), 0);
      this.pairs = filled(topK, 0);
      this.slotWeight = filled(topK, 0);
      this.slotExpert = filled(2 * topK, 0);
      this.chosen = filled(topK, 0);
      this.arrived = filled(4, 0);
    } catch (e) {
      this.owned.dispose();
      throw e;
    }
  }

  /**
   * Records `kernel` (one made with the norm folded in) as `a` would run it, with a's weights,
   * expert table, norm weights and flags, on one token of the stand-ins. The caller records it
   * beside an earlier step, with no barrier. Returns the dispatches recorded (1).
   */
  record(cb: CommandBuffer, kernel: RouterRouteKernel, a: RouterRouteArgs): number {
    if (!a.norm) throw new InvalidArgumentError("RouterWarm: the router step it warms folds the norm in (a.norm)");
    kernel.record(cb, {
      ...a, S: 1, x: this.xn, xOffset: 0, logits: this.logits, logitsOffset: 0, work: this.work, pairs: this.pairs, slotWeight: this.slotWeight,
      slotExpert: this.slotExpert, chosen: this.chosen, chosenOffset: 0, arrived: this.arrived,
      norm: { ...a.norm, h: this.h, add: this.add, xn: this.xn },
    });
    return 1;
  }

  [Symbol.dispose](): void {
    this.owned.dispose();
  }
}
