/** The Worker's options from the environment: read when not set in code, and a value
 * that is no number, or out of range, refused by name (as the Python and Go Workers). */
import { afterEach, test } from "node:test";
import assert from "node:assert/strict";

import { Worker } from "../src";
import type { Settings } from "../src/settings";

const VARIABLES = [
  "DEX_ADDRESS",
  "DEX_WORKER_CAPACITY",
  "DEX_WORKER_HEARTBEAT_INTERVAL",
  "DEX_WORKER_RECONNECT_INITIAL",
  "DEX_WORKER_RECONNECT_MAX",
  "DEX_WORKER_CONNECT_TIMEOUT",
  "DEX_WORKER_PING_INTERVAL",
  "DEX_DRAIN_TIMEOUT",
  "DEX_TRACING",
  "DEX_LOG_FORMAT",
  "DEX_LOG_LEVEL",
];
const saved = new Map(VARIABLES.map((name) => [name, process.env[name]]));

afterEach(() => {
  for (const [name, value] of saved) {
    if (value === undefined) delete process.env[name];
    else process.env[name] = value;
  }
});

/** The settings a Worker keeps (private), where it keeps the options it read. */
const fields = (w: Worker): Settings => (w as unknown as { settings: Settings }).settings;

const worker = (options: Partial<ConstructorParameters<typeof Worker>[0]> = {}): Worker =>
  new Worker({ address: "http://127.0.0.1:1", agents: [], handleSignals: false, ...options });

test("with no address in code or DEX_ADDRESS, the Worker serves the local dex server", () => {
  delete process.env.DEX_ADDRESS;
  const addresses = (w: Worker): unknown => fields(w).addresses;
  assert.deepEqual(addresses(worker({ address: undefined })), ["http://127.0.0.1:7450"]);
  process.env.DEX_ADDRESS = "";
  assert.deepEqual(addresses(worker({ address: undefined })), ["http://127.0.0.1:7450"]);
  process.env.DEX_ADDRESS = "http://dex-a:8000/, http://dex-b:8000";
  assert.deepEqual(addresses(worker({ address: undefined })), ["http://dex-a:8000", "http://dex-b:8000"]);
  process.env.DEX_ADDRESS = " , ";
  assert.throws(() => worker({ address: undefined }), /no server address \(address or DEX_ADDRESS\)/);
});

test("a bad or out-of-range variable throws, naming it and its value", () => {
  const bad: [string, string, string][] = [
    ["DEX_WORKER_CAPACITY", "abc", "want a whole number from 1 to 100000"],
    ["DEX_WORKER_CAPACITY", "0", "want a whole number from 1 to 100000"],
    ["DEX_WORKER_CAPACITY", "2.5", "want a whole number from 1 to 100000"],
    ["DEX_WORKER_CAPACITY", "100001", "want a whole number from 1 to 100000"],
    ["DEX_WORKER_HEARTBEAT_INTERVAL", "0", "want a number of seconds above 0"],
    ["DEX_WORKER_RECONNECT_INITIAL", "-1", "want a number of seconds above 0"],
    ["DEX_WORKER_RECONNECT_MAX", "1s", "want a number of seconds above 0"],
    ["DEX_WORKER_CONNECT_TIMEOUT", "NaN", "want a number of seconds above 0"],
    ["DEX_WORKER_PING_INTERVAL", "Infinity", "want a number of seconds above 0"],
    ["DEX_WORKER_PING_INTERVAL", "0x10", "want a number of seconds above 0"],
    ["DEX_WORKER_PING_INTERVAL", "1e9", "(at most 2147483)"], // Node's longest timer
    ["DEX_DRAIN_TIMEOUT", "-0.5", "want a number of seconds, 0 or more"],
    ["DEX_TRACING", "maybe", "want true or false (or 1/0, yes/no, on/off)"],
    ["DEX_TRACING", "2", "want true or false"],
    ["DEX_LOG_FORMAT", "xml", "log format: choose console or json"],
    ["DEX_LOG_LEVEL", "loud", "log level: choose debug, info, warning or error"],
  ];
  for (const [name, value, want] of bad) {
    process.env[name] = value;
    assert.throws(
      () => worker(),
      (e: Error) =>
        e.message.startsWith(`${name}=${JSON.stringify(value)}: `) && e.message.includes(want),
      `${name}=${value}`,
    );
    delete process.env[name];
  }
});

test("good values are read; options set in code leave the variables unread", () => {
  Object.assign(process.env, {
    DEX_WORKER_CAPACITY: " 3 ",
    DEX_WORKER_HEARTBEAT_INTERVAL: "0.25",
    DEX_WORKER_RECONNECT_INITIAL: ".05",
    DEX_WORKER_RECONNECT_MAX: "2",
    DEX_WORKER_CONNECT_TIMEOUT: "1.5e0",
    DEX_WORKER_PING_INTERVAL: "0.75",
    DEX_DRAIN_TIMEOUT: "0", // a drain that waits for none
  });
  const read = fields(worker());
  assert.deepEqual(
    {
      capacity: read.capacity,
      heartbeatInterval: read.heartbeatInterval,
      reconnectInitial: read.reconnectInitial,
      reconnectMax: read.reconnectMax,
      connectTimeout: read.connectTimeout,
      pingInterval: read.pingInterval,
      drainTimeout: read.drainTimeout,
    },
    {
      capacity: 3,
      heartbeatInterval: 0.25,
      reconnectInitial: 0.05,
      reconnectMax: 2,
      connectTimeout: 1.5,
      pingInterval: 0.75,
      drainTimeout: 0,
    },
  );
  process.env.DEX_WORKER_CAPACITY = " "; // blank: unset, as in the Go Worker
  assert.equal(fields(worker()).capacity, 16);
  for (const name of VARIABLES) process.env[name] = "bad";
  assert.doesNotThrow(() =>
    worker({
      capacity: 1,
      heartbeatInterval: 1,
      reconnectInitial: 1,
      reconnectMax: 1,
      connectTimeout: 1,
      pingInterval: 1,
      drainTimeout: 1,
      tracing: false,
      logFormat: "json",
      logLevel: "warning",
    }),
  );
});

test("DEX_TRACING takes the Python Worker's words for on and off, in any case", () => {
  const tracing = (w: Worker): boolean =>
    (w as unknown as { runner: { tracing: unknown } }).runner.tracing !== null;
  assert.equal(tracing(worker()), false); // off unless asked
  for (const [value, on] of [
    ["true", true],
    [" YES ", true],
    ["1", true],
    ["On", true],
    ["false", false],
    ["no", false],
    ["0", false],
    ["", false],
  ] as const) {
    process.env.DEX_TRACING = value;
    assert.equal(tracing(worker()), on, `DEX_TRACING=${value}`);
  }
  process.env.DEX_TRACING = "false";
  assert.equal(tracing(worker({ tracing: true })), true); // the option wins
});

test("a bad option given in code throws too, naming it and its value", () => {
  const bad: [Partial<ConstructorParameters<typeof Worker>[0]>, string][] = [
    [{ capacity: 0 }, "WorkerOptions.capacity=0: want a whole number from 1 to 100000"],
    [{ capacity: 2.5 }, "WorkerOptions.capacity=2.5"],
    [{ heartbeatInterval: 0 }, "WorkerOptions.heartbeatInterval=0: want a number of seconds above 0"],
    [{ reconnectMax: Number.NaN }, "WorkerOptions.reconnectMax=null"],
    [{ pingInterval: -1 }, "WorkerOptions.pingInterval=-1"],
    [{ drainTimeout: -0.5 }, "WorkerOptions.drainTimeout=-0.5: want a number of seconds, 0 or more"],
  ];
  for (const [options, message] of bad) {
    assert.throws(() => worker(options), (e: Error) => e.message.startsWith(message), message);
  }
  // in range, they are kept as given
  const w = fields(worker({ capacity: 3, drainTimeout: 0, pingInterval: 0.25 }));
  assert.equal(w.capacity, 3);
  assert.equal(w.drainTimeout, 0);
  assert.equal(w.pingInterval, 0.25);
});
