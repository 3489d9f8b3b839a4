/** The Worker's ends: a shutdown while a connection is still being opened ends the
 * Worker (the node that answers then does not keep it), and a Worker whose event loop ran
 * empty while it served says so rather than end its process without a word. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import type { IncomingMessage } from "node:http";
import type { AddressInfo } from "node:net";
import { WebSocketServer } from "ws";

import { defineAgent, say, Scripted, Worker } from "../src";
import { until } from "./fake-node";

const agent = defineAgent({ name: "c", model: new Scripted(() => say("hi")) });

test("a shutdown while the connection opens ends the Worker, though the node answers after", async () => {
  // a node slow to accept: the upgrade waits until the test lets it through
  let accept: (() => void) | null = null;
  const server = new WebSocketServer({
    port: 0,
    host: "127.0.0.1",
    verifyClient: (_info: { req: IncomingMessage }, done: (ok: boolean) => void) => {
      accept = () => done(true);
    },
  });
  server.on("connection", (ws) => {
    ws.on("message", () => {
      const welcome = { t: "welcome", worker_id: "w", resume: "r", stop: [], heartbeat_timeout: 10 };
      ws.send(JSON.stringify([welcome]));
    });
  });
  await new Promise((resolve) => server.once("listening", resolve));
  const address = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const worker = new Worker({ address, agents: [agent], handleSignals: false, connectTimeout: 30 });
  let ended = false;
  const running = worker.run().finally(() => (ended = true));
  try {
    await until("the Worker connecting", () => accept !== null);
    const stopped = worker.shutdown(1);
    accept!(); // the node answers once the Worker stops
    await until("the Worker ended", () => ended);
    await stopped;
    await running;
  } finally {
    for (const client of server.clients) client.terminate();
    server.close();
  }
});

test("a Worker whose event loop ran empty while it served logs it and exits with 1", () => {
  // nothing is left to wake it (here: its only connection waits on a change that never
  // comes); Node would end the process with 0 and no word
  const script = `
    const { Worker, defineAgent, say, Scripted } = require(${JSON.stringify(require.resolve("../src"))});
    const { Cluster } = require(${JSON.stringify(require.resolve("../src/cluster"))});
    Cluster.prototype.serveUntilStopped = () => new Promise(() => undefined);
    const agent = defineAgent({ name: "c", model: new Scripted(() => say("hi")) });
    new Worker({ address: "http://127.0.0.1:9", agents: [agent], handleSignals: false }).run();
  `;
  const child = spawnSync(process.execPath, ["-e", script], { encoding: "utf8", timeout: 20000 });
  assert.equal(child.status, 1, child.stderr);
  assert.match(child.stderr, /action=worker\.stopped/);
  assert.match(child.stderr, /nothing is left to wake it/);
});
