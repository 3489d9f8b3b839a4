/** The Client's event stream reader (src/sse.ts): the HTML standard's interpretation of
 * text/event-stream, chunk by chunk, as the Python Client's dex.client.sse reads it. */
import { test } from "node:test";
import assert from "node:assert/strict";

import { Decoder, type Message } from "../src/sse";

const bytes = (text: string): Uint8Array => new TextEncoder().encode(text);

/** Every message the chunks complete, fed one after another to one decoder. */
function read(decoder: Decoder, ...chunks: (string | Uint8Array)[]): Message[] {
  return chunks.flatMap((c) => decoder.feed(typeof c === "string" ? bytes(c) : c));
}

test("an event is its id, type and data, dispatched on the blank line", () => {
  const d = new Decoder();
  assert.deepEqual(read(d, 'id: 7\nevent: turn.started\ndata: {"turn":1}\n'), []);
  assert.deepEqual(read(d, "\n"), [{ id: "7", type: "turn.started", data: '{"turn":1}' }]);
  assert.equal(d.lastEventId, "7");
});

test("lines end with LF, CRLF or CR, also when a CRLF is cut between two chunks", () => {
  const d = new Decoder();
  const got = read(d, "id: 1\r\ndata: a\r\n\r\nid: 2\rdata: b\r\r", "id: 3\r", "\ndata: c\r", "\n\r", "\n");
  assert.deepEqual(
    got.map((m) => [m.id, m.data]),
    [
      ["1", "a"],
      ["2", "b"],
      ["3", "c"],
    ],
  );
});

test("a line split over chunks, and a character split over chunks, are joined first", () => {
  const d = new Decoder();
  const euro = bytes('data: {"t":"€"}\n\n'); // the euro sign is three bytes
  const cut = euro.indexOf(0xe2) + 1;
  const got = read(d, "event: model.delta\nda", "ta: ", euro.subarray(6, cut), euro.subarray(cut));
  assert.deepEqual(got, [{ id: "", type: "model.delta", data: '{"t":"€"}' }]);
});

test("data lines join with LF; comments, unknown fields and an event without data are skipped", () => {
  const d = new Decoder();
  const got = read(d, ": keep-alive\n\ndata: one\ndata\ndata:  two\nfoo: bar\n\nevent: x\n\ndata: last\n\n");
  assert.deepEqual(
    got.map((m) => [m.type, m.data]),
    [
      ["message", "one\n\n two"],
      ["message", "last"],
    ],
  );
});

test("an id stays until another one sets it; one with NUL is ignored; an empty one clears it", () => {
  const d = new Decoder("5");
  const got = read(d, "data: a\n\nid: 6\ndata: b\n\ndata: c\n\nid: 7\0\ndata: d\n\nid\ndata: e\n\n");
  assert.deepEqual(
    got.map((m) => m.id),
    ["5", "6", "6", "6", ""],
  );
});

test("retry sets the reconnection time in seconds, only from digits", () => {
  const d = new Decoder();
  read(d, "retry: 1500\n\n");
  assert.equal(d.retry, 1.5);
  read(d, "retry: 2s\n\nretry:\n\n");
  assert.equal(d.retry, 1.5);
});

test("a byte order mark is dropped once, at the start", () => {
  const d = new Decoder();
  const got = read(d, new Uint8Array([0xef, 0xbb, 0xbf]), "data: x\n\n");
  assert.deepEqual(got, [{ id: "", type: "message", data: "x" }]);
});

test("a CRLF cut between chunks, then a blank line's LF alone, still dispatches", () => {
  assert.deepEqual(read(new Decoder(), "data: 1\r", "\n", "\n"), [{ id: "", type: "message", data: "1" }]);
});

test("a byte order mark cut between chunks is dropped", () => {
  const one = [{ id: "", type: "message", data: "1" }];
  const mark = [0xef, 0xbb, 0xbf];
  assert.deepEqual(read(new Decoder(), new Uint8Array(mark.slice(0, 2)), new Uint8Array([0xbf]), "data: 1\n\n"), one);
  assert.deepEqual(read(new Decoder(), ...mark.map((b) => new Uint8Array([b])), "data: 1\n\n"), one);
  assert.deepEqual(read(new Decoder(), new Uint8Array(0), new Uint8Array([0xef]), new Uint8Array([0xbb, 0xbf, 0x64]), "ata: 1\n\n"), one);
});

test("reset drops an event the broken connection did not finish, and keeps the last id", () => {
  const d = new Decoder();
  assert.deepEqual(read(d, "id: 1\ndata: a\n\nid: 2\ndata: half"), [{ id: "1", type: "message", data: "a" }]);
  d.reset();
  assert.equal(d.lastEventId, "1");
  assert.deepEqual(read(d, "id: 3\ndata: b\n\n"), [{ id: "3", type: "message", data: "b" }]);
});
