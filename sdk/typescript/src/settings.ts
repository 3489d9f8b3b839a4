/**
 * The Worker's options: given in code, else read from the environment variables the
 * Python and Go Workers read, else their defaults; each checked, and a bad one refused by
 * name.
 */
import * as os from "node:os";
import { randomBytes } from "node:crypto";

import type { Agent } from "./agent";
import { LogFormat, LogLevel, logFormat, logLevel } from "./log";

/** The address of ``dex server`` with its default ``--listen``. */
const DEFAULT_ADDRESS = "http://127.0.0.1:7450";

export interface WorkerOptions {
  /** One node's address, several comma-separated, or a list: tried in turn (default:
   * DEX_ADDRESS, else http://127.0.0.1:7450). */
  address?: string | string[];
  agents: Agent[];
  /** How many attempts the server may hand this Worker at once, and how many it runs at
   * once: one beyond it (a stopped attempt's code may still run) waits for a slot. */
  capacity?: number;
  /** The server's worker token (default: DEX_WORKER_TOKEN). */
  token?: string;
  workerId?: string;
  /** Seconds between heartbeats (at most a quarter of the server's heartbeat timeout). */
  heartbeatInterval?: number;
  reconnectInitial?: number;
  reconnectMax?: number;
  connectTimeout?: number;
  /** Seconds between WebSocket pings; a node that does not answer one in time (it hung)
   * is given up and the next address tried. */
  pingInterval?: number;
  /** How long a drain waits for running attempts before the Worker stops anyway. */
  drainTimeout?: number;
  /** Drain on SIGTERM and SIGINT (default true). */
  handleSignals?: boolean;
  /** OpenTelemetry spans of the attempts it runs, under the server's, sent to the global
   * tracer provider (default: DEX_TRACING, else off). */
  tracing?: boolean;
  /** How it logs: console (one line for people, the default) or json (one object a
   * line), as the Python Worker (default: DEX_LOG_FORMAT). */
  logFormat?: LogFormat;
  /** The least level logged: debug, info (the default), warning or error (default:
   * DEX_LOG_LEVEL). */
  logLevel?: LogLevel;
}

/** The options a Worker runs with, each resolved and checked (see WorkerOptions). */
export interface Settings {
  readonly addresses: string[];
  readonly capacity: number;
  readonly token: string | undefined;
  readonly workerId: string;
  /** The longest gap between two heartbeats, in seconds. */
  readonly heartbeatInterval: number;
  readonly reconnectInitial: number;
  readonly reconnectMax: number;
  readonly connectTimeout: number;
  readonly pingInterval: number;
  readonly drainTimeout: number;
  readonly handleSignals: boolean;
  readonly tracing: boolean;
  readonly logFormat: LogFormat;
  readonly logLevel: LogLevel;
}

/** The Settings of ``options``: an option set in code wins over its variable. Throws an
 * error naming an option or a variable that is out of range or does not parse. */
export function resolveSettings(options: WorkerOptions): Settings {
  const address = options.address ?? env("DEX_ADDRESS") ?? DEFAULT_ADDRESS;
  const addresses = (Array.isArray(address) ? address : address.split(","))
    .map((a) => a.trim().replace(/\/+$/, ""))
    .filter((a) => a !== "");
  if (addresses.length === 0) throw new Error("no server address (address or DEX_ADDRESS)");
  return Object.freeze({
    addresses,
    capacity: optionCapacity(options.capacity) ?? envCapacity("DEX_WORKER_CAPACITY", 16),
    token: options.token ?? env("DEX_WORKER_TOKEN"),
    workerId:
      options.workerId ??
      env("DEX_WORKER_ID") ??
      `${os.hostname()}-${process.pid}-${randomBytes(3).toString("hex")}`,
    heartbeatInterval:
      optionSeconds("heartbeatInterval", options.heartbeatInterval) ??
      envSeconds("DEX_WORKER_HEARTBEAT_INTERVAL", 1.0),
    reconnectInitial:
      optionSeconds("reconnectInitial", options.reconnectInitial) ??
      envSeconds("DEX_WORKER_RECONNECT_INITIAL", 0.1),
    reconnectMax:
      optionSeconds("reconnectMax", options.reconnectMax) ?? envSeconds("DEX_WORKER_RECONNECT_MAX", 1.0),
    connectTimeout:
      optionSeconds("connectTimeout", options.connectTimeout) ??
      envSeconds("DEX_WORKER_CONNECT_TIMEOUT", 3.0),
    pingInterval:
      optionSeconds("pingInterval", options.pingInterval) ?? envSeconds("DEX_WORKER_PING_INTERVAL", 2.0),
    drainTimeout:
      optionSeconds("drainTimeout", options.drainTimeout, true) ??
      envSeconds("DEX_DRAIN_TIMEOUT", 30.0, true),
    handleSignals: options.handleSignals ?? true,
    tracing: options.tracing ?? envSwitch("DEX_TRACING", false),
    logFormat:
      options.logFormat !== undefined
        ? logFormat(options.logFormat, "WorkerOptions.logFormat")
        : logFormat(env("DEX_LOG_FORMAT")),
    logLevel:
      options.logLevel !== undefined
        ? logLevel(options.logLevel, "WorkerOptions.logLevel")
        : logLevel(env("DEX_LOG_LEVEL")),
  });
}

function env(name: string): string | undefined {
  const value = process.env[name];
  return value === undefined || value === "" ? undefined : value;
}

/** Node's longest timer (2^31 - 1 ms): a longer one would fire at once. */
const MAX_SECONDS = 2_147_483;
const MAX_CAPACITY = 100_000; // as the Python and Go Workers'
const DECIMAL = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;

function badVariable(name: string, value: string, want: string): Error {
  return new Error(`${name}=${JSON.stringify(value)}: ${want}`);
}

/** Seconds from the variable ``name`` (decimals allowed), or ``fallback`` when it is
 * unset or blank: above 0, or 0 or more with ``zeroOk``, as the Python Worker's settings take
 * them. A value that is no number, or out of range, throws an error naming both. */
function envSeconds(name: string, fallback: number, zeroOk = false): number {
  const value = env(name)?.trim();
  if (value === undefined || value === "") return fallback;
  const seconds = DECIMAL.test(value) ? Number(value) : NaN; // NaN fails below
  const inRange = (zeroOk ? seconds >= 0 : seconds > 0) && seconds <= MAX_SECONDS;
  if (!inRange) {
    const want = `a number of seconds${zeroOk ? ", 0 or more" : " above 0"} (at most ${MAX_SECONDS})`;
    throw badVariable(name, value, `want ${want}, such as 0.5`);
  }
  return seconds;
}

const TRUE = ["1", "true", "t", "yes", "y", "on"];
const FALSE = ["0", "false", "f", "no", "n", "off"];

/** A switch from the variable ``name``, or ``fallback`` when it is unset or blank: the
 * words the Python Worker's settings take, in any case. */
function envSwitch(name: string, fallback: boolean): boolean {
  const value = env(name)?.trim();
  if (value === undefined || value === "") return fallback;
  if (TRUE.includes(value.toLowerCase())) return true;
  if (FALSE.includes(value.toLowerCase())) return false;
  throw badVariable(name, value, "want true or false (or 1/0, yes/no, on/off)");
}

/** The Worker's capacity from the variable ``name``: a whole number from 1 to 100,000. */
function envCapacity(name: string, fallback: number): number {
  const value = env(name)?.trim();
  if (value === undefined || value === "") return fallback;
  const count = /^[+]?\d+$/.test(value) ? Number(value) : NaN;
  if (!(count >= 1 && count <= MAX_CAPACITY)) {
    throw badVariable(name, value, `want a whole number from 1 to ${MAX_CAPACITY}`);
  }
  return count;
}

/** An option given in code, checked as its variable is: ``seconds`` above 0 (or 0 or more
 * with ``zeroOk``), ``capacity`` a whole number from 1 to 100,000. */
function optionSeconds(name: string, value: number | undefined, zeroOk = false): number | undefined {
  if (value === undefined) return undefined;
  const inRange =
    typeof value === "number" && (zeroOk ? value >= 0 : value > 0) && value <= MAX_SECONDS;
  if (!inRange) {
    const want = `a number of seconds${zeroOk ? ", 0 or more" : " above 0"} (at most ${MAX_SECONDS})`;
    throw new Error(`WorkerOptions.${name}=${JSON.stringify(value)}: want ${want}`);
  }
  return value;
}

function optionCapacity(value: number | undefined): number | undefined {
  if (value === undefined) return undefined;
  if (!(Number.isInteger(value) && value >= 1 && value <= MAX_CAPACITY)) {
    throw new Error(
      `WorkerOptions.capacity=${JSON.stringify(value)}: want a whole number from 1 to ${MAX_CAPACITY}`,
    );
  }
  return value;
}
