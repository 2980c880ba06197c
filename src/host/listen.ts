/** Serving a fetch handler on Bun (Bun.serve) or Deno (Deno.serve): the only runtime-specific part of the host. */
export type FetchHandler = (request: Request) => Response | Promise<Response>;

export interface Listener {
  readonly hostname: string;
  readonly port: number;
  /** Stops listening and closes open connections. */
  close(): Promise<void>;
}

export function listen(fetch: FetchHandler, options: { hostname: string; port: number }): Listener {
  const g = globalThis as any;
  if (g.Deno) {
    const abort = new AbortController();
    const server = g.Deno.serve({ hostname: options.hostname, port: options.port, signal: abort.signal, onListen: () => {} }, fetch);
    return {
      hostname: server.addr.hostname,
      port: server.addr.port,
      close: async () => {
        abort.abort();
        await server.finished;
      },
    };
  }
  if (g.Bun) {
    // idleTimeout 0: a non-streamed reply sends nothing until it is done; the host's own time limit bounds a request
    const server = g.Bun.serve({ hostname: options.hostname, port: options.port, fetch, idleTimeout: 0 });
    return {
      hostname: server.hostname,
      port: server.port,
      close: async () => {
        await server.stop(true);
      },
    };
  }
  throw new Error("the host runs under Bun or Deno");
}
