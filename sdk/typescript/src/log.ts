/**
 * The Worker's log lines, in the format of the Python server and Worker (docs/operations.md,
 * "Logs"): `console` (the default, for people) or `json` (one object a line), chosen by
 * DEX_LOG_FORMAT, and a level (DEX_LOG_LEVEL: debug, info, warning, error; default info).
 *
 *   2026-12-07 01:02:03,456 INFO dex.worker connected to http://127.0.0.1:7450 action=worker.connected address=http://127.0.0.1:7450 agents=concierge capacity=16 worker_id=...
 *   {"time":"2026-12-07T01:02:03.456Z","level":"info","logger":"dex.worker","message":"connected to ...","action":"worker.connected",...}
 *
 * The console line's time is local, as Python's logging writes it; the JSON's is UTC.
 */

export type LogFormat = "console" | "json";
export type LogLevel = "debug" | "info" | "warning" | "error";
export type Fields = Record<string, unknown>;

export const LOG_FORMATS: readonly LogFormat[] = ["console", "json"];
const LEVELS: readonly LogLevel[] = ["debug", "info", "warning", "error"];

/** A log format from the variable DEX_LOG_FORMAT's ``value`` (unset: console), or an
 * error naming the choices, as the `dex` command's. */
export function logFormat(value: string | undefined, name = "DEX_LOG_FORMAT"): LogFormat {
  const text = value?.trim().toLowerCase() ?? "";
  if (text === "") return "console";
  if ((LOG_FORMATS as readonly string[]).includes(text)) return text as LogFormat;
  throw new Error(`${name}=${JSON.stringify(value)}: log format: choose console or json`);
}

/** A log level from the variable DEX_LOG_LEVEL's ``value`` (unset: info). */
export function logLevel(value: string | undefined, name = "DEX_LOG_LEVEL"): LogLevel {
  const text = value?.trim().toLowerCase() ?? "";
  if (text === "") return "info";
  if ((LEVELS as readonly string[]).includes(text)) return text as LogLevel;
  throw new Error(`${name}=${JSON.stringify(value)}: log level: choose debug, info, warning or error`);
}

const pad = (n: number, width = 2): string => String(n).padStart(width, "0");

/** Local time as Python's logging writes it: ``2026-12-07 01:02:03,456``. */
function localTime(t: Date): string {
  return (
    `${t.getFullYear()}-${pad(t.getMonth() + 1)}-${pad(t.getDate())} ` +
    `${pad(t.getHours())}:${pad(t.getMinutes())}:${pad(t.getSeconds())},${pad(t.getMilliseconds(), 3)}`
  );
}

/** A field's value in a console line: a list as its items joined by commas, and quoted as
 * a JSON string when it would not read as one word. */
export function fieldText(value: unknown): string {
  const text = Array.isArray(value) ? value.map(String).join(",") : String(value);
  return text === "" || /[\s"=]/.test(text) ? JSON.stringify(text) : text;
}

export class Log {
  constructor(
    readonly format: LogFormat = "console",
    readonly level: LogLevel = "info",
    private readonly write: (line: string) => void = (line) => void process.stderr.write(line),
    readonly logger = "dex.worker",
  ) {}

  debug(action: string, message: string, fields: Fields = {}): void {
    this.line("debug", action, message, fields);
  }

  info(action: string, message: string, fields: Fields = {}): void {
    this.line("info", action, message, fields);
  }

  warning(action: string, message: string, fields: Fields = {}): void {
    this.line("warning", action, message, fields);
  }

  error(action: string, message: string, fields: Fields = {}): void {
    this.line("error", action, message, fields);
  }

  private line(level: LogLevel, action: string, message: string, fields: Fields): void {
    if (LEVELS.indexOf(level) < LEVELS.indexOf(this.level)) return;
    const present = Object.entries(fields).filter(([, v]) => v !== undefined);
    const now = new Date();
    if (this.format === "json") {
      const entry = {
        time: now.toISOString(),
        level,
        logger: this.logger,
        message,
        action,
        ...Object.fromEntries(present),
      };
      this.write(JSON.stringify(entry) + "\n");
      return;
    }
    const extra = [["action", action], ...present].map(([k, v]) => `${k}=${fieldText(v)}`);
    this.write(
      `${localTime(now)} ${level.toUpperCase()} ${this.logger} ${message} ${extra.join(" ")}\n`,
    );
  }
}

/** The lines about the Worker's connection: one per change, not one per retry (the same
 * as the Python Worker's ``dex.worker.connection_log`` and the Go Worker's). */
export class ConnectionLog {
  /** Whether any node ever welcomed this Worker. */
  private everConnected = false;
  /** When the last connection was lost, until the next welcome. */
  private lostAt: number | null = null;
  /** Tries that failed since the last welcome (or since the start). */
  private failedTries = 0;

  constructor(
    private readonly log: Log,
    private readonly workerId: string,
    private readonly agents: string[],
    private readonly capacity: number,
    private readonly clock: () => number = () => performance.now() / 1000,
  ) {}

  /** A node welcomed this Worker. */
  connected(address: string): void {
    if (!this.everConnected) {
      this.log.info("worker.connected", `connected to ${address}`, {
        address,
        agents: this.agents,
        capacity: this.capacity,
        worker_id: this.workerId,
      });
    } else {
      const tries = this.failedTries + 1;
      const seconds = Math.round((this.clock() - (this.lostAt ?? this.clock())) * 1000) / 1000;
      this.log.info(
        "worker.reconnected",
        `reconnected to ${address} after ${seconds}s and ${tries} ${tries === 1 ? "try" : "tries"}`,
        { address, tries, seconds, worker_id: this.workerId },
      );
    }
    this.everConnected = true;
    this.lostAt = null;
    this.failedTries = 0;
  }

  /** A try reached no node that serves (unreachable, or closed before its welcome). */
  failed(address: string, error: string): void {
    this.failedTries++;
    const first = !this.everConnected && this.failedTries === 1;
    const message = `cannot reach ${address}: ${error}${first ? "; trying again until it answers" : ""}`;
    const fields = { address, error };
    if (first) this.log.warning("worker.connect_failed", message, fields);
    else this.log.debug("worker.connect_failed", message, fields);
  }

  /** A connection that had been welcomed ended, and the Worker goes on (without reconnecting
   * to a node that no connected node lists any more). */
  lost(address: string, error: string, reconnecting = true): void {
    this.lostAt = this.clock();
    this.failedTries = 0;
    const then = reconnecting ? "reconnecting" : "no node lists it any more, not reconnecting";
    this.log.warning("worker.connection_lost", `lost the connection to ${address}: ${error}; ${then}`, {
      address,
      error,
    });
  }

  /** A cluster member whose connection is down and that no connected node lists any more. */
  letGo(address: string): void {
    this.log.info("worker.node_left", `no connected node lists ${address} any more: not reconnecting to it`, {
      address,
    });
  }

  /** The Worker stops: drained after ``reason`` (a signal's name, or shutdown), or given
   * up on ``error``. */
  stopped(reason: string, error?: string): void {
    if (error !== undefined) {
      this.log.error("worker.stopped", `stopped: ${error}`, {
        reason: "error",
        error,
        worker_id: this.workerId,
      });
    } else {
      this.log.info("worker.stopped", `stopped: ${reason}, drained`, { reason, worker_id: this.workerId });
    }
  }
}
