// The Restate side of berth's peer benchmarks: one service endpoint on the
// TypeScript SDK (@restatedev/restate-sdk 1.17.2), served over HTTP/2 on a
// loopback port and registered with restate-server by suite.py.
//
// Each workload is written the way a Restate user would write it:
//
// * `bench/timer`   — durable timer wake-up: `ctx.sleep(ms)` in a handler. The
//                     handler reads the journaled clock (`ctx.date.now()`)
//                     before and after, so lateness = t1 - t0 - ms is measured
//                     by the unit itself (ms since the epoch).
// * `bench/steps`   — durable step throughput: `n` no-op `ctx.run` steps, each
//                     journaled by the server before the next runs.
// * `sig` workflow  — control round trip: `run` resolves its own durable
//                     promise `parked` and then waits on the durable promise
//                     `go`; the shared handler `go` resolves it with the
//                     client's payload (the external signal); `ready` returns
//                     once `run` has parked, so the client signals a unit that
//                     is really waiting.
// * `bench/park`    — parked density: a long `ctx.sleep` (the unit stays
//                     parked for the rest of the run).
//
// Usage: node service.mjs PORT   (prints "listening PORT" once bound).

// @restatedev/restate-sdk 1.17.2 calls Promise.withResolvers, which Node 20
// lacks (it arrived in Node 22): a spec-conforming polyfill.
if (typeof Promise.withResolvers !== "function") {
  Object.defineProperty(Promise, "withResolvers", {
    configurable: true,
    writable: true,
    value: function withResolvers() {
      let resolve;
      let reject;
      const promise = new this((res, rej) => {
        resolve = res;
        reject = rej;
      });
      return { promise, resolve, reject };
    },
  });
}

const restate = await import("@restatedev/restate-sdk");

const bench = restate.service({
  name: "bench",
  handlers: {
    async timer(ctx, ms) {
      const t0 = await ctx.date.now();
      await ctx.sleep(ms);
      const t1 = await ctx.date.now();
      return { t0, t1 };
    },
    async steps(ctx, n) {
      for (let i = 0; i < n; i++) {
        await ctx.run(`step-${i}`, () => i);
      }
      return n;
    },
    async park(ctx, ms) {
      await ctx.sleep(ms);
      return "woke";
    },
    async noop() {
      return "ok";
    },
  },
});

const sig = restate.workflow({
  name: "sig",
  handlers: {
    async run(ctx) {
      await ctx.promise("parked").resolve(true);
      const payload = await ctx.promise("go");
      return payload;
    },
    async ready(ctx) {
      return await ctx.promise("parked");
    },
    async go(ctx, payload) {
      await ctx.promise("go").resolve(payload);
    },
  },
});

const port = Number(process.argv[2] ?? 9080);
const bound = await restate.serve({
  services: [bench, sig],
  port,
  // Only warnings and errors, to stderr (suite.py keeps it in a log file).
  logger: (meta, message, ...rest) => {
    if (meta.level === "warn" || meta.level === "error") {
      console.error(`${meta.level}: ${message}`, ...rest);
    }
  },
});
console.log(`listening ${bound ?? port}`);
