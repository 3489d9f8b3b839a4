/** A fake node for the Worker's tests: a WebSocket server in this process. */
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import { after, before } from "node:test";
import WebSocket, { WebSocketServer } from "ws";

import { defineTool, type Tool, type ToolOptions, Worker, type WorkerOptions } from "../src";
import type * as p from "../src/protocol";

/** The Worker's log lines, as it writes them to stderr (from this module's import on). */
export const logged: string[] = [];
const write = process.stderr.write.bind(process.stderr);
process.stderr.write = ((chunk: string | Uint8Array, ...rest: never[]): boolean => {
  logged.push(String(chunk));
  return write(chunk, ...rest);
}) as typeof process.stderr.write;

/** A node that welcomes one Worker, acks every result and keeps every frame it gets. */
export class FakeNode {
  readonly server = new WebSocketServer({ port: 0, host: "127.0.0.1" });
  readonly frames: p.WorkerMessage[][] = [];
  /** Sent in the welcome when set (a cluster's nodes). */
  members: string[] | null = null;
  /** The welcome's resume token. */
  resume = "r1";
  private socket: WebSocket | null = null;
  private waiters: (() => void)[] = [];

  constructor() {
    this.server.on("connection", (ws) => {
      this.socket = ws;
      ws.on("message", (data) => {
        const frame = JSON.parse(data.toString()) as p.WorkerMessage[];
        this.frames.push(frame);
        const acks = frame
          .filter((m): m is p.Result => m.t === "done" || m.t === "fail" || m.t === "back")
          .map((m) => ({ t: "ack", attempt_id: m.attempt_id, ok: true }));
        if (frame[0]?.t === "hello") {
          const welcome = {
            t: "welcome",
            worker_id: "w",
            resume: this.resume,
            stop: [],
            ...(this.members === null ? {} : { members: this.members }),
          };
          this.send([{ ...welcome, heartbeat_timeout: 10, reconnect_grace: 5 }]);
        }
        if (acks.length > 0) this.send(acks);
        for (const wake of this.waiters.splice(0)) wake();
      });
    });
  }

  /** Resolves once the server listens (at once if it already does). */
  listening(): Promise<void> {
    if (this.server.address() !== null) return Promise.resolve();
    return new Promise((resolve) => this.server.once("listening", resolve));
  }

  get address(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  /** Whether a Worker is connected now. */
  get connected(): boolean {
    return this.socket !== null && this.socket.readyState === WebSocket.OPEN;
  }

  /** The node goes away: its connection drops and nothing listens on its port. */
  stop(): void {
    this.socket?.terminate();
    this.server.close();
  }

  /** The node drops the Worker's connection (after what it sent) and goes on listening. */
  drop(): void {
    this.socket?.close(1001, "going away");
  }

  send(messages: unknown[]): void {
    assert.ok(this.socket !== null, "no Worker connected");
    this.socket.send(JSON.stringify(messages));
  }

  /** The first frame (from ``from`` on) that has a message matching ``match``, within 5 s. */
  async frameWith(match: (m: p.WorkerMessage) => boolean, from = 0): Promise<p.WorkerMessage[]> {
    const deadline = Date.now() + 5000;
    for (;;) {
      const found = this.frames.slice(from).find((f) => f.some(match));
      if (found !== undefined) return found;
      assert.ok(Date.now() < deadline, "timed out waiting for a frame from the Worker");
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 50);
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  /** Serve the test file's tests: a Worker with ``options`` connects to this node before
   * they run and shuts down after them, and then the node closes. */
  serveWorker(options: Omit<WorkerOptions, "address">): void {
    let worker: Worker;
    let running: Promise<void>;
    before(async () => {
      await this.listening();
      worker = new Worker({ address: this.address, handleSignals: false, ...options });
      running = worker.run();
    });
    after(async () => {
      await worker.shutdown(5);
      await running;
      this.server.close();
    });
  }

  /** The message that settles ``attemptId``. */
  async result(attemptId: string): Promise<p.Result> {
    const isResult = (m: p.WorkerMessage): boolean =>
      (m.t === "done" || m.t === "fail" || m.t === "back") && m.attempt_id === attemptId;
    const frame = await this.frameWith(isResult);
    return frame.find(isResult) as p.Result;
  }
}

/** A read tool that takes no arguments. */
export function readTool(name: string, run: ToolOptions["run"]): Tool {
  return defineTool({ name, kind: "read", parameters: { type: "object", properties: {} }, run });
}

/** A ``write`` tool named "write" that counts its runs (``runs``). */
export function countedWrite(): { tool: Tool; runs: number } {
  const counted = {
    runs: 0,
    tool: defineTool({
      name: "write",
      kind: "write",
      parameters: { type: "object", properties: {} },
      run() {
        counted.runs++;
        return "written";
      },
    }),
  };
  return counted;
}

/** A read tool whose calls wait until ``release()``, counting how many run at once. */
export interface Held {
  readonly tool: Tool;
  /** Calls running now. */
  running: number;
  /** The most that ever ran at once. */
  most: number;
  release(): void;
}

/** A ``Held`` tool named ``name`` that answers ``answer`` once released. */
export function heldTool(name: string, answer: string): Held {
  let release = (): void => undefined;
  const released = new Promise<void>((resolve) => (release = resolve));
  const held: Held = {
    running: 0,
    most: 0,
    release: () => release(),
    tool: readTool(name, async () => {
      held.running++;
      held.most = Math.max(held.most, held.running);
      await released; // deaf to ctx.signal: a stopped attempt's code runs on
      held.running--;
      return answer;
    }),
  };
  return held;
}

/** Wait until ``cond`` holds, failing after 5 s with ``what`` it waited for. */
export async function until(what: string, cond: () => boolean): Promise<void> {
  const deadline = Date.now() + 5000;
  while (!cond()) {
    assert.ok(Date.now() < deadline, `timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/** A RunModel hand-out of ``agent``'s model: attempt 1 of Step ``id`` in ``session``, with
 * the history from ``base`` on. */
export function runModelStep(
  agent: string,
  session: string,
  id: string,
  base: number,
  history: unknown[],
): p.StepMessage {
  const step = { t: "step", attempt_id: id, session_id: session, step_id: id, attempt: 1 };
  const model = { step_type: "RunModel", agent, history_base: base, history };
  return { ...step, ...model } as p.StepMessage;
}
