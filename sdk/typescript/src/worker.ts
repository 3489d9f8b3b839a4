/**
 * The Worker: serves its agents to Dex until shutdown (docs/worker-protocol.md). Its
 * Connection carries the messages to and from the server (in a cluster one per node, the
 * Cluster's); its Runner runs the attempts it is handed.
 */
import { Cluster } from "./cluster";
import { Log } from "./log";
import { Runner } from "./runner";
import { Settings, WorkerOptions, resolveSettings } from "./settings";

export { WorkerRefusedError } from "./refused";
export type { WorkerOptions } from "./settings";

/** The tracing module, loaded only when tracing is on: with it off the Worker needs no
 * OpenTelemetry (an optional peer dependency). */
function loadTracing(): typeof import("./tracing") {
  try {
    require.resolve("@opentelemetry/api");
  } catch {
    throw new Error("tracing (DEX_TRACING) needs @opentelemetry/api: npm install @opentelemetry/api");
  }
  return require("./tracing") as typeof import("./tracing");
}

const sleep = (seconds: number): Promise<void> =>
  new Promise((resolve) => setTimeout(resolve, seconds * 1000));

export class Worker {
  readonly id: string;
  private readonly settings: Settings;
  private readonly log: Log;
  private readonly runner: Runner;
  private readonly cluster: Cluster;
  /** Why the Worker drains: shutdown (called in code), or a signal's name. */
  private stopReason = "shutdown";
  private running: Promise<void> | null = null;
  private shuttingDown: Promise<void> | null = null;

  constructor(options: WorkerOptions) {
    this.settings = resolveSettings(options);
    this.id = this.settings.workerId;
    const tracing = this.settings.tracing ? new (loadTracing().AttemptTracing)(this.id) : null;
    this.log = new Log(this.settings.logFormat, this.settings.logLevel);
    this.runner = new Runner(options.agents, this.settings.capacity, this.id, this.log, tracing);
    this.cluster = new Cluster(this.settings, this.runner, this.log);
  }

  /** Serve until shutdown(). Rejects with WorkerRefusedError if the server refuses us. */
  run(): Promise<void> {
    if (this.running === null) this.running = this.runOnce();
    return this.running;
  }

  /** Drain: no new hand-outs, running attempts finish, unstarted ones go back. */
  shutdown(timeout: number = this.settings.drainTimeout): Promise<void> {
    if (this.shuttingDown === null) this.shuttingDown = this.drain(timeout);
    return this.shuttingDown;
  }

  private async runOnce(): Promise<void> {
    const onSignal = (signal: NodeJS.Signals): void => {
      if (this.shuttingDown === null) this.stopReason = signal;
      void this.shutdown();
    };
    if (this.settings.handleSignals) {
      process.on("SIGTERM", onSignal);
      process.on("SIGINT", onSignal);
    }
    // Node ends a process whose event loop ran empty, with 0 and no word, though run()
    // never settled: a Worker that serves always waits on a connection or a timer, so
    // that end is a bug, and a supervisor must see it
    const onEmpty = (): void => {
      process.off("beforeExit", onEmpty);
      this.cluster.seed.life.stopped("error", "the Worker waited on nothing: nothing is left to wake it");
      process.exitCode = 1;
    };
    process.on("beforeExit", onEmpty);
    try {
      await this.cluster.serveUntilStopped();
      this.cluster.seed.life.stopped(this.stopReason);
    } catch (e) {
      this.cluster.seed.life.stopped("error", e instanceof Error ? e.message : String(e));
      throw e;
    } finally {
      process.off("beforeExit", onEmpty);
      process.off("SIGTERM", onSignal);
      process.off("SIGINT", onSignal);
      this.runner.abortAll();
    }
  }

  private async drain(timeout: number): Promise<void> {
    const running = this.runner.attempts.size;
    this.log.info(
      "worker.draining",
      `draining: taking no new Steps, finishing ${running} running attempts within ${timeout}s`,
      { running, timeout },
    );
    this.cluster.sendAll({ t: "drain" });
    this.runner.drain();
    const deadline = Date.now() + timeout * 1000;
    while (this.runner.attempts.size > 0 && Date.now() < deadline) await sleep(0.02);
    this.cluster.stop();
    await this.running;
  }
}
