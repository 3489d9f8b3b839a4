/** The Client against fake nodes (HTTP servers in this process): the addresses tried in
 * turn, what is retried and what is not, long polls, errors as ApiError, and the event
 * stream's reconnect with Last-Event-ID. */
import { after, test } from "node:test";
import assert from "node:assert/strict";
import * as http from "node:http";
import type { AddressInfo } from "node:net";

import { ApiError, Client, UnavailableError } from "../src";
import { addressesOf } from "../src/client";

interface Seen {
  method: string;
  path: string;
  query: URLSearchParams;
  headers: http.IncomingHttpHeaders;
  body: unknown;
}

type Handler = (seen: Seen, res: http.ServerResponse) => void;

/** A node: every request is kept in ``seen`` and answered by ``handler``. */
class FakeServer {
  readonly seen: Seen[] = [];
  readonly server: http.Server;
  handler: Handler;

  constructor(handler: Handler) {
    this.handler = handler;
    this.server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        const url = new URL(req.url ?? "/", "http://x");
        const text = Buffer.concat(chunks).toString();
        const seen = {
          method: req.method ?? "",
          path: url.pathname,
          query: url.searchParams,
          headers: req.headers,
          body: text === "" ? undefined : JSON.parse(text),
        };
        this.seen.push(seen);
        this.handler(seen, res);
      });
    });
    servers.push(this);
  }

  async start(): Promise<string> {
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  stop(): void {
    this.server.closeAllConnections();
    this.server.close();
  }
}

const servers: FakeServer[] = [];
after(() => servers.forEach((s) => s.stop()));

function json(res: http.ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(body));
}

const STANDBY: Handler = (_seen, res) =>
  json(res, 503, { error: { code: "unavailable", message: "a standby" } });

/** An address where nothing listens: the connection is refused. */
async function deadAddress(): Promise<string> {
  const server = http.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  await new Promise((resolve) => server.close(resolve));
  return `http://127.0.0.1:${port}`;
}

async function rejection(promise: Promise<unknown>): Promise<ApiError> {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof ApiError, `an ApiError, not ${String(e)}`);
    return e;
  }
  assert.fail("it did not throw");
}

test("addresses: a list or comma-separated, trimmed, each http(s)://", () => {
  assert.deepEqual(addressesOf(" http://a:1/, https://b:2 ,"), ["http://a:1", "https://b:2"]);
  assert.deepEqual(addressesOf(["http://a:1"]), ["http://a:1"]);
  assert.throws(() => addressesOf("a:1"), /starts with http:\/\/ or https:\/\//);
  assert.throws(() => addressesOf(" , "), /no Dex Server address/);
});

test("a connection refused and a 503 move on to the next address, which then answers first", async () => {
  const standby = new FakeServer(STANDBY);
  const active = new FakeServer((_s, res) => json(res, 200, { agents: [{ name: "a" }] }));
  const client = new Client({ address: [await deadAddress(), await standby.start(), await active.start()] });

  assert.deepEqual(await client.listAgents(), [{ name: "a" }]);
  assert.deepEqual(await client.listAgents(), [{ name: "a" }]);
  assert.equal(standby.seen.length, 1); // the second call went straight to the one that answered
  assert.equal(active.seen.length, 2);
});

test("a read is tried again in rounds until a node serves", async () => {
  let refusals = 3;
  const node = new FakeServer((_s, res) =>
    refusals-- > 0 ? STANDBY(_s, res) : json(res, 200, { node_id: null, members: [], partition_count: null }),
  );
  const client = new Client({ address: await node.start(), timeout: 10 });
  assert.deepEqual(await client.getCluster(), { node_id: null, members: [], partition_count: null });
  assert.equal(node.seen.length, 4);
});

test("a change that may have been committed is one round: each address once, then unavailable", async () => {
  const a = new FakeServer(STANDBY);
  const b = new FakeServer(STANDBY);
  const client = new Client({ address: `${await a.start()},${await b.start()}`, timeout: 5 });
  const started = Date.now();
  for (const call of [
    () => client.approve("s1", "c1", { by: "ann" }),
    () => client.deny("s1", "c1", "no"),
    () => client.answer("s1", "c1", "yes"),
    () => client.cancelTurn("s1"),
    () => client.reconcile("s1", "c1", { status: "failed", error: "lost" }),
    () => client.createSession("assistant"),
    () => client.forkSession("s1", 2),
    () => client.sendMessage("s1", "hi"),
    () => client.setLimit("openai/gpt-4o", { rpm: 60 }),
    () => client.clearLimit("openai/gpt-4o"),
  ]) {
    const e = await rejection(call());
    assert.ok(e instanceof UnavailableError);
    assert.equal(e.retryable, true);
    assert.match(e.message, /^no Dex Server answered at http:\/\/127\.0\.0\.1:\d+, http:\/\/127/);
  }
  assert.equal(a.seen.length, 10);
  assert.equal(b.seen.length, 10);
  assert.ok(Date.now() - started < 2000, "no backoff, no retry");
  assert.deepEqual(a.seen[0].body, { by: "ann", arguments_hash: null });
  assert.equal(a.seen[0].path, "/v1/sessions/s1/tool_calls/c1/approve");
});

test("a send with a message id is retried, one without is not", async () => {
  let refusals = 2;
  const node = new FakeServer((seen, res) =>
    refusals-- > 0
      ? STANDBY(seen, res)
      : json(res, 201, { session_id: "s1", turn: 1, status: "running", created: true }),
  );
  const client = new Client({ address: await node.start(), timeout: 10 });
  const sent = await client.sendMessage("s1", "hi", { messageId: "m1" });
  assert.equal(sent.turn, 1);
  assert.equal(node.seen.length, 3);
  assert.deepEqual(node.seen[2].body, { text: "hi", message_id: "m1" });

  refusals = 1;
  await rejection(client.sendMessage("s1", "hi"));
  assert.equal(node.seen.length, 4);
});

test("a budget's change is retried: setting it twice is setting it once", async () => {
  let refusals = 2;
  const set = { session_id: "s1", budget: { max_tokens: 5000, max_cost_usd: null } };
  const node = new FakeServer((seen, res) =>
    refusals-- > 0 ? STANDBY(seen, res) : json(res, 200, { ...set, usage: {}, status: "idle" }),
  );
  const client = new Client({ address: await node.start(), timeout: 10 });
  assert.deepEqual((await client.setBudget("s1", { maxTokens: 5000 })).budget, set.budget);
  assert.equal(node.seen.length, 3);

  refusals = 1;
  await client.removeBudget("s1");
  assert.equal(node.seen.length, 5);
  assert.deepEqual(
    node.seen.map((s) => s.method),
    ["PUT", "PUT", "PUT", "DELETE", "DELETE"],
  );
});

test("the budget and limit calls send the API's routes and bodies; a group keeps its slashes", async () => {
  const groups = [{ group: "anthropic/claude-sonnet-4-5", limit: { concurrency: 2 }, source: "api" }];
  const node = new FakeServer((seen, res) =>
    seen.path.startsWith("/admin/")
      ? json(res, 200, { groups })
      : json(res, seen.method === "POST" ? 201 : 200, { id: "s1" }),
  );
  const client = new Client({ address: await node.start() });
  await client.createSession("assistant", {
    sessionId: "s 1",
    tenant: "acme",
    priority: 5,
    budget: { maxCostUsd: 2.5 },
  });
  await client.createSession("assistant", { priority: 0 });
  await client.setBudget("s 1", { maxTokens: 10_000, maxCostUsd: 1, by: "ops" });
  await client.removeBudget("s 1", { by: "ann & bob" });
  await client.removeBudget("s1");
  assert.deepEqual(await client.getLimits(), groups);
  const set = await client.setLimit("anthropic/claude-sonnet-4-5", { concurrency: 2, tpm: 90_000 });
  assert.deepEqual(set, groups);
  await client.setLimit("team #1/a?b%c");
  assert.deepEqual(await client.clearLimit("anthropic/claude-sonnet-4-5"), groups);

  const sent = node.seen.map((s) => [s.method, s.path, s.query.toString(), s.body]);
  assert.deepEqual(sent, [
    [
      "POST",
      "/v1/sessions",
      "",
      {
        agent: "assistant",
        session_id: "s 1",
        tenant: "acme",
        priority: 5,
        budget: { max_tokens: null, max_cost_usd: 2.5 },
      },
    ],
    ["POST", "/v1/sessions", "", { agent: "assistant" }],
    ["PUT", "/v1/sessions/s%201/budget", "", { max_tokens: 10_000, max_cost_usd: 1, by: "ops" }],
    ["DELETE", "/v1/sessions/s%201/budget", "by=ann+%26+bob", undefined],
    ["DELETE", "/v1/sessions/s1/budget", "", undefined],
    ["GET", "/admin/limits", "", undefined],
    ["PUT", "/admin/limits/anthropic/claude-sonnet-4-5", "", { concurrency: 2, rpm: null, tpm: 90_000 }],
    ["PUT", "/admin/limits/team%20%231/a%3Fb%25c", "", { concurrency: null, rpm: null, tpm: null }],
    ["DELETE", "/admin/limits/anthropic/claude-sonnet-4-5", "", undefined],
  ]);
});

test("the tenant calls send the API's routes and bodies; a tenant budget's change is retried", async () => {
  const usage = { input_tokens: 0, output_tokens: 0, tokens: 0, cost_usd: 0, calls: 0 };
  const acme = {
    tenant: "acme",
    budget: { max_tokens_per_day: 1000 },
    day: "2026-12-08",
    today: usage,
    this_month: usage,
    reached: null,
  };
  let refusals = 0;
  const node = new FakeServer((seen, res) =>
    refusals-- > 0
      ? STANDBY(seen, res)
      : json(res, 200, seen.path === "/admin/tenants" ? { tenants: [acme] } : acme),
  );
  const client = new Client({ address: await node.start(), timeout: 10 });
  assert.deepEqual(await client.listTenants(), [acme]);
  assert.deepEqual(await client.getTenant("acme.eu"), acme);
  refusals = 2;
  const set = await client.setTenantBudget("acme", {
    maxTokensPerDay: 1000,
    maxCostUsdPerMonth: 50,
    by: "ops",
  });
  assert.deepEqual(set, acme);
  await client.setTenantBudget("acme", { maxCostUsdPerDay: 2.5, maxTokensPerMonth: 90_000 });
  refusals = 1;
  await client.removeTenantBudget("acme", { by: "ann & bob" });
  await client.removeTenantBudget("acme");

  const sent = node.seen.map((s) => [s.method, s.path, s.query.toString(), s.body]);
  const full = {
    max_tokens_per_day: 1000,
    max_cost_usd_per_day: null,
    max_tokens_per_month: null,
    max_cost_usd_per_month: 50,
    by: "ops",
  };
  const other = {
    max_tokens_per_day: null,
    max_cost_usd_per_day: 2.5,
    max_tokens_per_month: 90_000,
    max_cost_usd_per_month: null,
    by: null,
  };
  assert.deepEqual(sent, [
    ["GET", "/admin/tenants", "", undefined],
    ["GET", "/admin/tenants/acme.eu", "", undefined],
    ["PUT", "/admin/tenants/acme/budget", "", full], // a standby: tried again
    ["PUT", "/admin/tenants/acme/budget", "", full],
    ["PUT", "/admin/tenants/acme/budget", "", full],
    ["PUT", "/admin/tenants/acme/budget", "", other],
    ["DELETE", "/admin/tenants/acme/budget", "by=ann+%26+bob", undefined],
    ["DELETE", "/admin/tenants/acme/budget", "by=ann+%26+bob", undefined],
    ["DELETE", "/admin/tenants/acme/budget", "", undefined],
  ]);
});

test("a read that finds no node gives up after its timeout, unavailable", async () => {
  const client = new Client({ address: await deadAddress(), timeout: 0.5 });
  const started = Date.now();
  const e = await rejection(client.getAgentSnapshot("s1"));
  assert.ok(e instanceof UnavailableError);
  assert.equal(e.status, 503);
  assert.equal(e.code, "unavailable");
  assert.match(e.message, /ECONNREFUSED/);
  const took = Date.now() - started;
  assert.ok(took < 1500, `gave up after ${took} ms`);

  // a standby all along: asked again (the backoff stops before the timeout would pass)
  const standby = new FakeServer(STANDBY);
  const patient = new Client({ address: await standby.start(), timeout: 0.5 });
  const refused = await rejection(patient.listInbox());
  assert.match(refused.message, /is not serving/);
  assert.ok(standby.seen.length >= 2, `asked ${standby.seen.length} times`);
});

test("an error answer is thrown at once with its status, code, message and details", async () => {
  const node = new FakeServer((seen, res) => {
    if (seen.path.endsWith("/approve")) {
      json(res, 409, {
        error: { code: "conflict", message: "call c1 is not waiting", details: { call_status: "succeeded" } },
      });
    } else if (seen.path === "/v1/sessions/nope") {
      json(res, 404, { error: { code: "not_found", message: "unknown session 'nope'" } });
    } else if (seen.path === "/v1/inbox") {
      json(res, 429, { error: { code: "rate_limited", message: "slow down", details: { retry_after: 1 } } });
    } else if (seen.path === "/v1/agents") {
      res.writeHead(500);
      res.end("oops");
    } else {
      res.writeHead(422);
      res.end();
    }
  });
  const client = new Client({ address: await node.start(), token: "t0k" });

  const conflict = await rejection(client.approve("s1", "c1"));
  assert.deepEqual(
    [conflict.status, conflict.code, conflict.message, conflict.details, conflict.retryable],
    [409, "conflict", "call c1 is not waiting", { call_status: "succeeded" }, false],
  );
  const missing = await rejection(client.getAgentSnapshot("nope"));
  assert.deepEqual(
    [missing.status, missing.code, missing.message],
    [404, "not_found", "unknown session 'nope'"],
  );
  const limited = await rejection(client.listInbox());
  assert.deepEqual(
    [limited.status, limited.code, limited.details],
    [429, "rate_limited", { retry_after: 1 }],
  );
  const broken = await rejection(client.listAgents());
  assert.deepEqual([broken.status, broken.code, broken.message], [500, "server_error", "HTTP 500"]);
  const bare = await rejection(client.listWorkers());
  assert.deepEqual([bare.status, bare.code, bare.message], [422, "invalid_input", "HTTP 422"]);

  assert.equal(node.seen.length, 5); // none of them tried again
  assert.ok(node.seen.every((s) => s.headers.authorization === "Bearer t0k"));
  assert.equal(node.seen[0].headers["content-type"], "application/json");
  assert.equal(node.seen[1].headers["content-type"], undefined);
});

test("a store that cannot commit is a retryable storage_error, at the same address", async () => {
  const full = new FakeServer((_s, res) =>
    json(res, 503, { error: { code: "storage_error", message: "disk full", details: { cause: "ENOSPC" } } }),
  );
  const other = new FakeServer(STANDBY);
  const client = new Client({ address: [await full.start(), await other.start()] });
  const e = await rejection(client.approve("s1", "c1"));
  assert.deepEqual(
    [e.status, e.code, e.message, e.details, e.retryable],
    [503, "storage_error", "disk full", { cause: "ENOSPC" }, true],
  );
  assert.equal(other.seen.length, 0); // the node serves: its store is what failed
});

test("listSessions sends its filters as the API's query parameters", async () => {
  const node = new FakeServer((_s, res) => json(res, 200, { sessions: [], next_cursor: null }));
  const client = new Client({ address: await node.start() });
  await client.listSessions();
  await client.listSessions({
    agent: "a b",
    status: "outcome_unknown",
    createdSince: new Date(1_700_000_000_500),
    updatedBefore: 1.5,
    order: "updated",
    limit: 5,
    cursor: "c",
  });
  assert.equal(node.seen[0].query.toString(), "order=created&limit=100");
  assert.deepEqual(Object.fromEntries(node.seen[1].query), {
    agent: "a b",
    status: "outcome_unknown",
    created_since: "1700000000.5",
    updated_before: "1.5",
    order: "updated",
    limit: "5",
    cursor: "c",
  });
});

test("sendMessage sends onBusy as on_busy and returns what the message did", async () => {
  const node = new FakeServer((_seen, res) =>
    json(res, 201, {
      session_id: "s1",
      turn: 2,
      status: "running",
      created: true,
      outcome: "interrupted",
      interrupted: 1,
    }),
  );
  const client = new Client({ address: await node.start(), timeout: 10 });
  const sent = await client.sendMessage("s1", "stop", { onBusy: "interrupt" });
  assert.equal(sent.outcome, "interrupted");
  assert.equal(sent.interrupted, 1);
  assert.deepEqual(node.seen[0].body, { text: "stop", on_busy: "interrupt" });
});

test("sendMessage with wait long-polls the turn until it ends or waits for a person", async () => {
  let polls = 0;
  const node = new FakeServer((seen, res) => {
    if (seen.method === "POST")
      return json(res, 201, { session_id: "s1", turn: 3, status: "running", created: true });
    polls++;
    const status = polls < 3 ? "running" : "waiting";
    json(res, 200, {
      session_id: "s1",
      turn: 3,
      status,
      waiting_for: status === "waiting" ? [{ call_id: "c0" }] : [],
    });
  });
  const client = new Client({ address: await node.start() });
  const turn = await client.sendMessage("s1", "go", { wait: true, timeout: 10 });
  assert.equal(turn.status, "waiting");
  assert.equal(turn.created, true);
  assert.equal(turn.waiting_for?.[0].call_id, "c0");
  assert.deepEqual(node.seen[0].body, { text: "go", wait_seconds: 2 });
  const waits = node.seen.slice(1).map((s) => [s.path, Number(s.query.get("wait_seconds"))]);
  assert.equal(waits.length, 3);
  for (const [path, wait] of waits) {
    assert.equal(path, "/v1/sessions/s1/turns/3");
    assert.ok((wait as number) > 0 && (wait as number) <= 2);
  }
});

test("waitTurn returns the running turn once its timeout passed", async () => {
  const node = new FakeServer((seen, res) => {
    const wait = Number(seen.query.get("wait_seconds"));
    setTimeout(() => json(res, 200, { session_id: "s1", turn: 1, status: "running" }), wait * 1000);
  });
  const client = new Client({ address: await node.start() });
  const started = Date.now();
  const turn = await client.waitTurn("s1", 1, { timeout: 0.3 });
  assert.equal(turn.status, "running");
  assert.ok(Date.now() - started < 1500);
});

/** An event stream: ``write`` the events of each connection, in order; a connection past
 * the last script is held open with nothing. */
function streamServer(scripts: Handler[]): FakeServer {
  let n = 0;
  return new FakeServer((seen, res) => {
    const script = scripts[n++];
    if (script === undefined) {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(": keep-alive\n\n");
      return;
    }
    script(seen, res);
  });
}

const sse = (res: http.ServerResponse): void => {
  res.writeHead(200, { "content-type": "text/event-stream" });
};

test("the event stream resumes with Last-Event-ID after a break, no sooner than retry:", async () => {
  const node = streamServer([
    (_seen, res) => {
      sse(res);
      res.write(
        'retry: 200\n\nid: 1\nevent: turn.started\ndata: {"turn":1}\n\nid: 2\nevent: model.delta\ndata: {"te',
      );
      setTimeout(() => res.destroy(), 20); // the connection breaks mid-event
    },
    STANDBY, // a node restarting
    (_seen, res) => {
      sse(res);
      res.end(
        'id: 2\nevent: model.delta\ndata: {"text":"hi"}\n\nid: 3\nevent: turn.completed\ndata: {"turn":1}\n\n',
      );
    },
  ]);
  const client = new Client({ address: await node.start(), timeout: 5 });
  const got: [string, string, unknown][] = [];
  const started = Date.now();
  for await (const event of client.streamEvents("s1")) {
    got.push([event.id, event.type, event.data]);
    if (event.type === "turn.completed") break;
  }
  assert.deepEqual(got, [
    ["1", "turn.started", { turn: 1 }],
    ["2", "model.delta", { text: "hi" }],
    ["3", "turn.completed", { turn: 1 }],
  ]);
  assert.equal(node.seen[0].headers["last-event-id"], undefined);
  assert.equal(node.seen[0].headers.accept, "text/event-stream");
  assert.equal(node.seen[1].headers["last-event-id"], "1");
  assert.equal(node.seen[2].headers["last-event-id"], "1");
  assert.ok(Date.now() - started >= 400, "two waits of at least retry: 200 ms");
});

test("an event stream starts after lastEventId, and ends with the stream without reconnect", async () => {
  const node = streamServer([
    (seen, res) => {
      sse(res);
      res.end(
        `: keep-alive\n\nid: 9\nevent: history.item\ndata: {"after":"${String(seen.headers["last-event-id"])}"}\n\n`,
      );
    },
  ]);
  const client = new Client({ address: await node.start() });
  const got = [];
  for await (const event of client.streamEvents("s1", { lastEventId: "8", reconnect: false }))
    got.push(event);
  assert.deepEqual(got, [{ id: "9", type: "history.item", data: { after: "8" } }]);
});

test("without reconnect a break throws unavailable; a 4xx throws at once either way", async () => {
  const node = streamServer([
    (_seen, res) => {
      sse(res);
      res.write('id: 1\nevent: turn.started\ndata: {"turn":1}\n\n');
      setTimeout(() => res.destroy(), 20);
    },
    (_seen, res) => json(res, 404, { error: { code: "not_found", message: "unknown session 's2'" } }),
  ]);
  const client = new Client({ address: await node.start(), timeout: 5 });
  const got: string[] = [];
  const e = await rejection(
    (async () => {
      for await (const event of client.streamEvents("s1", { reconnect: false })) got.push(event.id);
    })(),
  );
  assert.deepEqual(got, ["1"]);
  assert.ok(e instanceof UnavailableError);
  assert.match(e.message, /^the event stream of s1 broke/);

  const missing = await rejection(client.streamEvents("s2").next());
  assert.deepEqual([missing.status, missing.code], [404, "not_found"]);
  assert.equal(node.seen.length, 2);
});

test("an event stream that finds no node gives up after the client's timeout", async () => {
  const client = new Client({ address: await deadAddress(), timeout: 0.4 });
  const started = Date.now();
  const e = await rejection(client.streamEvents("s1").next());
  assert.ok(e instanceof UnavailableError);
  assert.ok(Date.now() - started < 1500);
});

test("the signal and close() end an open stream's iteration", async () => {
  const node = streamServer([
    (_seen, res) => {
      sse(res);
      res.write('id: 1\nevent: turn.started\ndata: {"turn":1}\n\n');
    },
  ]);
  const client = new Client({ address: await node.start() });
  const stop = new AbortController();
  const got: string[] = [];
  const reading = (async () => {
    for await (const event of client.streamEvents("s1", { signal: stop.signal })) got.push(event.id);
  })();
  while (got.length === 0) await new Promise((resolve) => setTimeout(resolve, 5));
  stop.abort();
  await reading;
  assert.deepEqual(got, ["1"]);

  const closing = (async () => {
    for await (const event of client.streamEvents("s1")) got.push(event.id);
  })();
  await new Promise((resolve) => setTimeout(resolve, 50));
  client.close();
  await closing; // the held-open stream (no events) ends
  assert.equal(node.seen.length, 2);
});
