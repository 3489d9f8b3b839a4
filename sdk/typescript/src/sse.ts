/**
 * Reading ``text/event-stream``, as the HTML standard's event stream interpretation says
 * (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation),
 * as the Python Client's ``dex.client.sse`` does.
 *
 * Lines end with CRLF, LF or CR, also across chunks; a line starting with ``:`` is a
 * comment; ``field: value`` loses one space after the colon, and a line with no colon is a
 * field with an empty value. ``data`` lines are joined with LF; ``event`` names the type
 * (``message`` if none); ``id`` sets the last event id, which stays until an ``id`` changes
 * it; ``retry`` sets the reconnection time; anything else is ignored. A blank line
 * dispatches the event, if it has data. Lines are split as bytes, then decoded (UTF-8,
 * with replacement), so that no character inside a JSON string can end one.
 */

const LF = 0x0a;
const CR = 0x0d;
const COLON = 0x3a;
const SPACE = 0x20;
const BOM = [0xef, 0xbb, 0xbf];
const utf8 = new TextDecoder("utf-8"); // not fatal: a bad byte becomes U+FFFD

/** One dispatched event: ``id`` is the last event id when it was dispatched. */
export interface Message {
  id: string;
  type: string;
  data: string;
}

/** Turns the chunks of one stream into messages; keeps, between streams, the last event
 * id (``Last-Event-ID`` for a reconnect) and the server's reconnection time. */
export class Decoder {
  /** The id of the last event dispatched (or given to start from). */
  lastEventId: string;
  /** The reconnection time the server asked for (``retry:``), in seconds. */
  retry: number | null = null;
  private id: string; // the id buffer: set by a field, read at dispatch
  private type = "";
  private data: string[] = [];
  private partial: Uint8Array[] = []; // the pieces of a line not ended yet
  private afterCr = false;
  /** The stream's first bytes while they may still be a byte order mark cut between
   * chunks; null once it is past them. */
  private head: Uint8Array | null = new Uint8Array(0);

  constructor(lastEventId = "") {
    this.lastEventId = lastEventId;
    this.id = lastEventId;
  }

  /** A new connection: an event the last one did not finish is dropped. */
  reset(): void {
    this.type = "";
    this.data = [];
    this.partial = [];
    this.afterCr = false;
    this.id = this.lastEventId;
    this.head = new Uint8Array(0);
  }

  /** The messages that ``chunk`` completes. */
  feed(chunk: Uint8Array): Message[] {
    if (this.head !== null) {
      // a byte order mark, once, even cut between chunks
      const head: Uint8Array = Buffer.concat([this.head, chunk]);
      if (head.length < BOM.length && head.every((b, i) => BOM[i] === b)) {
        this.head = head;
        return [];
      }
      this.head = null;
      chunk = BOM.every((b, i) => head[i] === b) ? head.subarray(BOM.length) : head;
    }
    if (this.afterCr && chunk.length > 0 && chunk[0] === LF) {
      chunk = chunk.subarray(1); // the LF of a CRLF cut in two
      this.afterCr = false;
    }
    if (chunk.length === 0) return [];
    const last = chunk[chunk.length - 1];
    if (chunk.indexOf(LF) < 0 && chunk.indexOf(CR) < 0) {
      this.partial.push(chunk); // a long line: joined once it ends
      this.afterCr = false;
      return [];
    }
    if (this.partial.length > 0) {
      this.partial.push(chunk);
      chunk = Buffer.concat(this.partial);
      this.partial = [];
    }
    this.afterCr = last === CR;
    const messages: Message[] = [];
    let start = 0;
    for (let i = 0; i < chunk.length; i++) {
      const byte = chunk[i];
      if (byte !== LF && byte !== CR) continue;
      this.line(chunk.subarray(start, i), messages);
      if (byte === CR && chunk[i + 1] === LF) i++;
      start = i + 1;
    }
    if (start < chunk.length) this.partial = [chunk.slice(start)];
    return messages;
  }

  private line(line: Uint8Array, messages: Message[]): void {
    if (line.length === 0) {
      const data = this.dispatch();
      if (data !== null) {
        messages.push({ id: this.lastEventId, type: this.type || "message", data });
        this.type = "";
        this.data = [];
      }
      return;
    }
    const colon = line.indexOf(COLON);
    if (colon === 0) return; // a comment (a keep-alive)
    const name = utf8.decode(colon < 0 ? line : line.subarray(0, colon));
    let value = colon < 0 ? line.subarray(line.length) : line.subarray(colon + 1);
    if (value[0] === SPACE) value = value.subarray(1);
    if (name === "data") {
      this.data.push(utf8.decode(value));
    } else if (name === "event") {
      this.type = utf8.decode(value);
    } else if (name === "id") {
      if (value.indexOf(0) < 0) this.id = utf8.decode(value);
    } else if (name === "retry" && value.length > 0 && value.every((b) => b >= 0x30 && b <= 0x39)) {
      this.retry = Number(utf8.decode(value)) / 1000;
    }
  }

  /** The end of an event: its data, or null if it has none (it is not dispatched). */
  private dispatch(): string | null {
    this.lastEventId = this.id;
    if (this.data.length === 0) {
      this.type = "";
      return null;
    }
    return this.data.join("\n");
  }
}
