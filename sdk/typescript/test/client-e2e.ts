/**
 * The TypeScript Client against a real server, for tests/e2e/test_typescript_client.py:
 * the server serves the test agents (test/agents.ts); this program, with the Client
 * alone, waits for the ``waiter`` agent, creates a session, sends a message whose tool
 * (``publish``) needs approval, finds the approval in the snapshot, the approvals, the
 * inbox and the session list, approves it, waits for the turn, reads the event stream
 * from the start and again from its first id; then denies a second call, forks the
 * session and makes a few calls the server refuses. Then flow control: a session created
 * with a tenant, a priority and a budget, its budget set and removed, model groups'
 * limits set and cleared (a group with slashes, one with characters to escape), and its
 * tenant's budget set, read back (the tenant, the list, the snapshot), refused when bad
 * and removed. It prints one JSON summary on stdout; the test asserts on it and on the
 * tool's ledger.
 *
 * Run: node dist/test/client-e2e.js   (DEX_ADDRESS: the addresses, a dead one first)
 */
import { ApiError, Client, type DexEvent, type SentMessage } from "../src";

const SESSION = "ts-client-1";
const BUDGETED = "ts-client-budget";
const GROUP = "anthropic/claude-sonnet-4-5";
const ODD_GROUP = "team #1/a?b%c d";

function publish(post: string): string {
  return "call: " + JSON.stringify([["publish", { post }]]);
}

async function refusal(
  call: () => Promise<unknown>,
): Promise<{ status: number; code: string; message: string }> {
  try {
    await call();
  } catch (e) {
    if (!(e instanceof ApiError)) throw e;
    return { status: e.status, code: e.code, message: e.message };
  }
  throw new Error("the call was not refused");
}

function waitingFor(
  sent: SentMessage,
): { call_id: string; kind: string; tool: string; arguments: unknown; arguments_hash: string }[] {
  return (sent.waiting_for ?? []).map((w) => ({
    call_id: w.call_id,
    kind: w.kind,
    tool: w.tool,
    arguments: w.arguments,
    arguments_hash: w.arguments_hash,
  }));
}

async function main(): Promise<void> {
  const client = new Client({ timeout: 20 }); // DEX_ADDRESS
  const deadline = Date.now() + 20_000;
  while (!(await client.listAgents()).some((a) => a.name === "waiter")) {
    if (Date.now() > deadline) throw new Error("the waiter agent was never registered");
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  const agents = (await client.listAgents()).map((a) => a.name).sort();

  const session = await client.createSession("waiter", { sessionId: SESSION });
  const sent = await client.sendMessage(session.id, publish("hello"), {
    messageId: "m-1",
    wait: true,
    timeout: 15,
  });
  const resent = await client.sendMessage(session.id, publish("hello"), { messageId: "m-1" });
  const [wait] = waitingFor(sent);

  const snapshot = await client.getAgentSnapshot(session.id);
  const approvals = await client.listApprovals(session.id);
  const inbox = await client.listInbox({ limit: 10 });
  const waitingSessions = await client.listSessions({ agent: "waiter", status: "waiting", createdSince: 0 });

  const approved = await client.approve(session.id, wait.call_id, {
    by: "ts-client",
    argumentsHash: wait.arguments_hash,
  });
  const approvedTwice = await refusal(() => client.approve(session.id, wait.call_id));
  const turn = await client.waitTurn(session.id, sent.turn, { timeout: 15 });

  // the stream from the start, up to the end of the turn; then again after its first event
  const events: DexEvent[] = [];
  for await (const event of client.streamEvents(session.id)) {
    events.push(event);
    if (event.type === "turn.completed" && event.data.turn === sent.turn) break;
  }
  let resumed: DexEvent | undefined;
  for await (const event of client.streamEvents(session.id, { lastEventId: events[0].id })) {
    resumed = event;
    break;
  }

  // a second call, denied: it never runs, and the model is told
  const second = await client.sendMessage(session.id, publish("spam"), { wait: true, timeout: 15 });
  const [secondWait] = waitingFor(second);
  const denied = await client.deny(session.id, secondWait.call_id, "not this one", { by: "ts-client" });
  const secondTurn = await client.waitTurn(session.id, second.turn, { timeout: 15 });

  const forked = await client.forkSession(session.id, secondTurn.turn + 1, {
    newSessionId: `${SESSION}-fork`,
  });
  const idleSessions = await client.listSessions({ agent: "waiter", status: "idle", limit: 1 });
  const nextPage = await client.listSessions({
    agent: "waiter",
    status: "idle",
    limit: 1,
    cursor: idleSessions.next_cursor ?? undefined,
  });

  // flow control: a session with a budget, the budget changed and removed; model limits
  const budgeted = await client.createSession("waiter", {
    sessionId: BUDGETED,
    tenant: "acme",
    priority: 3,
    budget: { maxTokens: 1000 },
  });
  const budgetSet = await client.setBudget(BUDGETED, { maxCostUsd: 2.5, by: "ts-client" });
  const budgetRefused = await refusal(() => client.setBudget(BUDGETED, {}));
  const budgetRemoved = await client.removeBudget(BUDGETED, { by: "ts-client" });
  const budgetUnknown = await refusal(() => client.setBudget("no-such-session", { maxTokens: 1 }));
  const limitsBefore = await client.getLimits();
  const limitSet = await client.setLimit(GROUP, { concurrency: 2, rpm: 60 });
  const oddSet = await client.setLimit(ODD_GROUP, { tpm: 1000 });
  const limitRefused = await refusal(() => client.setLimit(GROUP, { concurrency: 0 }));
  const limitCleared = await client.clearLimit(GROUP);

  // the budgeted session's tenant: its budget set, read back three ways, refused, removed
  const tenantSet = await client.setTenantBudget("acme", {
    maxTokensPerDay: 100_000,
    maxCostUsdPerMonth: 50,
    by: "ts-client",
  });
  const tenantRead = await client.getTenant("acme");
  const tenantListed = (await client.listTenants()).find((t) => t.tenant === "acme") ?? null;
  const tenantInSnapshot = (await client.getAgentSnapshot(BUDGETED)).session.tenant_usage ?? null;
  const tenantNoLimit = await refusal(() => client.setTenantBudget("acme", { by: "ts-client" }));
  const tenantZero = await refusal(() => client.setTenantBudget("acme", { maxTokensPerDay: 0 }));
  const tenantBadName = await refusal(() => client.getTenant("not a tenant"));
  const tenantAfterRefusals = await client.getTenant("acme");
  const tenantRemoved = await client.removeTenantBudget("acme", { by: "ts-client" });

  const summary = {
    addresses: client.addresses.length,
    agents,
    session: { id: session.id, agent: session.agent, status: session.status },
    sent: { turn: sent.turn, status: sent.status, created: sent.created, waiting_for: waitingFor(sent) },
    resent: { turn: resent.turn, created: resent.created },
    snapshot: {
      status: snapshot.session.status,
      approvals: snapshot.approvals.map((a) => a.call_id),
      current_turn: snapshot.current_turn?.number ?? null,
    },
    approvals: approvals.map((a) => ({ call_id: a.call_id, tool: a.tool, arguments: a.arguments })),
    inbox: inbox.items.map((i) => ({
      session_id: i.session_id,
      call_id: i.call_id,
      kind: i.kind,
      tool: i.tool,
    })),
    waiting_sessions: waitingSessions.sessions.map((s) => s.id),
    approved,
    approved_twice: approvedTwice,
    turn: {
      status: turn.status,
      text: turn.text ?? null,
      tool_calls: (turn.tool_calls ?? []).map((c) => ({
        id: c.id,
        name: c.name,
        status: c.status,
        idempotency_key: c.idempotency_key,
      })),
    },
    events: events.map((e) => ({ id: e.id, type: e.type })),
    resumed: resumed === undefined ? null : { id: resumed.id, type: resumed.type },
    denied,
    second_turn: { turn: secondTurn.turn, status: secondTurn.status, text: secondTurn.text ?? null },
    forked: { id: forked.id, forked_from: forked.forked_from },
    idle_pages: [idleSessions.sessions.map((s) => s.id), nextPage.sessions.map((s) => s.id)],
    cancel_idle: await refusal(() => client.cancelTurn(session.id)),
    unknown_session: await refusal(() => client.getAgentSnapshot("no-such-session")),
    workers: (await client.listWorkers()).length,
    cluster_members: (await client.getCluster()).members.length,
    budgeted: {
      id: budgeted.id,
      tenant: budgeted.tenant ?? null,
      set: budgetSet,
      refused: budgetRefused.status,
      removed: budgetRemoved,
      unknown: budgetUnknown.status,
    },
    limits: {
      before: limitsBefore.map((g) => g.group),
      set: limitSet.find((g) => g.group === GROUP) ?? null,
      odd: oddSet.find((g) => g.group === ODD_GROUP) ?? null,
      refused: limitRefused.status,
      cleared: limitCleared.map((g) => g.group),
    },
    tenant: {
      set: tenantSet,
      read: tenantRead,
      listed: tenantListed,
      in_snapshot: tenantInSnapshot,
      refused: [tenantNoLimit.status, tenantZero.status, tenantBadName.status],
      after_refusals: tenantAfterRefusals.budget,
      removed: tenantRemoved,
    },
  };
  process.stdout.write(JSON.stringify(summary) + "\n");
}

main().then(
  () => process.exit(0),
  (e: unknown) => {
    process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
    process.exit(1);
  },
);
