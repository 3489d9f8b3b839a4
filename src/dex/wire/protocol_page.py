"""Writes ``docs/worker-protocol.md`` from the frame types (``dex.wire.worker_frames``,
``dex.wire.server_frames``), the rules and close codes of ``dex.wire.protocol``, and the
payloads' pydantic types.

    python -m dex.wire.protocol_page docs/worker-protocol.md

``tests/unit/test_worker_protocol_page.py`` fails when the committed page is stale.
"""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path
from typing import Any

import msgspec
from pydantic import BaseModel, TypeAdapter

from dex.wire import ModelResponse, Summary, ToolOutcome, protocol, server_frames, worker_frames

INTRO = """\
# The Worker protocol

Generated from the frame types in `src/dex/wire/worker_frames.py` and
`src/dex/wire/server_frames.py` by
`python -m dex.wire.protocol_page docs/worker-protocol.md`. Do not edit by hand.

A Worker in any language is written from this page alone: it connects, says hello,
runs the Steps it is handed, heartbeats them, and sends their results. The JSON Schema
of every message follows the rules.

## Connecting

Open a WebSocket to `GET /v1/workers/connect` on the active node (with
`Authorization: Bearer <worker token>` when the server has auth on: no token is an
HTTP 401 before the upgrade, a token of another role a 403; exit with a clear message
then, do not retry). Given several addresses, try them in turn; a node that is not
ready (starting, stopping, a standby) closes with code 4503: try the next one. In a
cluster the node you reach names the others in its `welcome`: connect to each (rule 13).

Every WebSocket message, both ways, is a **frame**: a JSON array of messages, each an
object whose `t` names its type. Batch whatever is ready into one frame. The first
message of the first frame is `hello`, and `hello` appears nowhere else. The server
answers `welcome` first.

## Rules

"""

RULES = """\
1. **A hand-out is durable before it is sent** (`step`). Run it, then send `done`
   (the result), `fail` (an exception: a `RecoveryError` with
   `attempt_progress: "NOT_COMPLETED"` once the code may have run) or `back` (you never
   started it: no attempt is used). Keep each result until its `ack` arrives; after a
   reconnect send it again. An `ack` with `ok: false` means the server refused it
   (the attempt is not yours, or no longer runs): drop it.
2. **Heartbeats.** Send `hb` with every attempt you hold at least four times per
   `welcome.heartbeat_timeout`. The reply's `status` says per attempt `ok` (go on) or
   `stop` (the server failed or cancelled it: stop its code, drop its result).
   `delta` (streamed model text) also counts as a heartbeat. Join the text of one
   attempt that waits to be sent into one `delta`: the server joins consecutive deltas
   of one attempt in a frame too, and sends subscribers one event for each.
3. **Start acknowledgement.** A `step` with `needs_start_ack: true`
   (a `CallSingleAttemptTool`: a write that must never run twice) may start its tool
   body only after an `hb` naming it (with a `seq` of yours) was answered `ok` with the
   same `seq` within half the heartbeat timeout; a later answer does not count (send
   another `hb`). If the answer is `stop`, do not start it, and forget it. A node that is
   not sure it still leads sends no answer.
4. **Ownership.** An attempt belongs to the connection it was handed out on. Messages
   about other attempts change nothing (`stop`, or `ack` with `ok: false`).
5. **Reconnecting.** When the connection drops, reconnect (backoff with jitter) and
   send a `hello` whose `attempts` lists every attempt you were handed and have not
   seen settled (acked, stopped or cancelled), and whose `resume` is the token of your
   last `welcome`. Within `welcome.reconnect_grace` seconds of the drop they are bound
   to the new connection; `welcome.stop` lists those the node no longer runs (the grace
   ran out, or they ended): stop them at once. An attempt bound to you that your
   `hello` does not name was never received: it goes back to its queue unused. Keep
   running your attempts while you reconnect, and keep your `resume` token across
   addresses: the server keeps a digest of it with each attempt, so a node that
   restarted, or a standby that took over, lets the same process reclaim its attempts
   with the same `hello` for a few seconds after it serves (the server's reclaim
   window); their results are then kept. A claimed attempt it fails instead is in
   `welcome.stop`.
6. **Draining.** To stop, send `drain` (no new hand-outs), let running attempts finish,
   and send `back` for any you had not started.
7. **Refusals.** A frame that does not fit this page closes the connection with code
   4400 and the problem as the reason. An integer anywhere in a frame lies between
   -2^63 and 2^64-1 (JSON here carries no larger one: a frame that holds one does not
   fit). Each field has the JSON type its schema gives, as it is: a number or a
   boolean sent as a string, or a boolean sent as a number, does not fit. A `worker_id`
   that a live connection uses
   already, without its `resume` token, is closed with code 4409.
8. **Order.** Messages of one frame are read in order; results of one frame commit
   together (their acks may come in any order).
9. **What a Worker runs.** `step_type` is one of `RunModel` (call the agent's model on
   the history; send each streamed piece of text as a `delta`), `CompactContext`
   (summarize the history), `CallTool` and `CallSingleAttemptTool` (run the tool body
   with `arguments`), `PollToolTask` (run the task tool's poll with `task_handle`) and
   `CheckToolCall` (run the write's check probe: did the call with this
   `idempotency_key` happen?). The `Await…` types are waits the server keeps: a Worker
   is never handed one. Each `done` carries the result that fits its Step (see
   *Results*). A tool's known failure (its own error, bad arguments, an unknown tool) is
   a `done` with a `ToolOutcome` of status `failed`, not a `fail`: a `fail` is an attempt
   that did not finish (it may be tried again if `retryable`).
10. **History cache.** `hello.history_cache` is how many sessions' histories the
   Worker keeps (0: none; the server then always sends whole histories). It keeps, per
   session, the whole view of its last `RunModel` hand-out on this connection, dropping
   the least recently used session beyond that number, as the server assumes.
11. **Questions and sleeps.** A tool that asks the user answers `done` with a
   `ToolOutcome` of status `asked` (`question`, `choices`); it is handed out again with
   the answers so far in `answers`. A tool that sleeps durably answers status `sleep`
   (`sleep_seconds`); it is handed out again with `sleeps_done` counting the sleeps over.
   A task tool's first call returns its handle as `result`; a poll answers `pending`
   while the task runs.
12. **Agents.** `hello.agents` describes what the Worker serves (the server
   registers each agent and its tools from it). `model` is plain data
   naming the model (never a key). A tool's `kind`: `read` (runs again after a crash),
   `idempotent_write` (runs again with the same `idempotency_key`), `write` (runs at
   most once, as a `CallSingleAttemptTool`), `task` (starts a job that `PollToolTask`
   polls every `poll_interval_seconds`); `has_check` says it has a check probe;
   `approval: "predicate"` means the Worker decides per call: it lists the ids of the
   calls that need approval in `ModelResponse.approval_required`.
13. **Clusters.** In a cluster each node hands out only the Steps of its own sessions,
   so a Worker connects to every node. `welcome.members` (and each later `members`
   frame) lists the base URLs of the nodes to be connected to, this one included (empty:
   a single node). Keep one connection to each listed node you are not connected to yet
   (the connection you reached it on counts for its address), each with its own
   `hello`, `resume` token, history cache and reconnect loop, under the same
   `worker_id`. Let go of a node that no connected node lists any more once its
   connection is down; while no node is connected, keep trying them all. Every message
   about an attempt goes on the connection that handed it out, and a `hello` names in
   `attempts` only that connection's. Each `hello` announces the Worker's whole
   `capacity`, so a node's view of it is an upper bound: run at most `capacity`
   attempts over all connections, and answer a `step` that comes while they are all
   taken with `back` at once (the Step queues again, for another Worker, and uses no
   attempt).
14. **Strays.** In a cluster, when the node that handed an attempt out dies or gives its
   session up, another node takes the session over and waits its reclaim window for
   the attempt's Worker. Beat every attempt a connection holds in one `hb` with a `seq`
   of its own, at each heartbeat. Call an attempt a stray when its connection to a node
   that listed members drops, or when the reply to that beat leaves it out (the node no
   longer owns its session; it answers nothing about attempts of other nodes'
   sessions, in `hb` or in `welcome.stop`). Keep running a stray, and send `claim` on
   every connection whose node listed members (a single node needs none: a `hello`
   reclaims), when a connection drops and at each heartbeat before that connection's
   `hb`, with each stray and the `resume` token of the connection it was handed out on
   (keep that token with the attempt). The node that took its session over answers
   `claimed`: `ok`, the attempt is that connection's from now on (its heartbeats, text
   and result go there), or `stop`, stop it and drop its result. Nodes that do not own
   the session leave it out. An `ok` to a stray in an `hb` reply of its own
   connection's node (back, and owning it again) takes it too. Send a stray's result
   to no node: keep it, and send it on the connection that takes the stray, at once. A
   single-attempt tool that waits for its start acknowledgement asks for it only once
   its attempt is taken.

## Close codes

| code | meaning |
|---|---|
"""


RESULTS = """
## Results

What `done.result` holds, by the Step type of the hand-out: a `ModelResponse` for
`RunModel`, a `Summary` for `CompactContext`, a `ToolOutcome` for `CallTool`,
`CallSingleAttemptTool`, `PollToolTask` (`status: "pending"` while the task runs) and
`CheckToolCall` (`status: "checked"`). A tool's known failure is a `done` with
`status: "failed"`; an exception is a `fail`. A result that does not fit its Step is
refused (`ack` with `ok: false`). The `Await…` Steps never reach a Worker.
"""


REF = "#/$defs/{model}"


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema: dict[str, Any] = model.model_json_schema()
    return schema


def _frame_schema(struct: type[msgspec.Struct], tag: str) -> dict[str, Any]:
    """A frame's JSON Schema: the struct's object, with the schemas of what it refers to
    (and of the payloads it carries: their pydantic types) under its ``$defs``."""
    payloads: dict[str, Any] = {}

    def payload(kind: type) -> dict[str, Any]:
        """A payload inside a frame (a ``hello``'s agents): its pydantic type's schema."""
        if not (isinstance(kind, type) and issubclass(kind, BaseModel)):
            raise NotImplementedError(kind)
        described = kind.model_json_schema(ref_template=REF)
        payloads.update(described.pop("$defs", {}))
        payloads[kind.__name__] = described
        return {"$ref": REF.format(model=kind.__name__)}

    generated = msgspec.json.schema(struct, schema_hook=payload)
    defs: dict[str, Any] = {**generated["$defs"], **payloads}
    schema: dict[str, Any] = defs.pop(struct.__name__)
    properties = schema["properties"]
    properties["t"] = {"const": tag, "type": "string"}
    for name, hint in typing.get_type_hints(struct, include_extras=True).items():
        of = _json_of(hint)
        if of is not None:  # raw JSON: the type it holds
            described = TypeAdapter(of.kind).json_schema(ref_template=REF)
            defs.update(described.pop("$defs", {}))
            properties[name] = {**described, **properties[name]}
    if defs:
        schema["$defs"] = defs
    return schema


def _json_of(hint: Any) -> protocol.JSONOf | None:
    for arg in (hint, *typing.get_args(hint)):
        for meta in getattr(arg, "__metadata__", ()):
            if isinstance(meta, protocol.JSONOf):
                return meta
    return None


def render() -> str:
    parts = [INTRO, RULES]
    for name in ("CLOSE_BAD_FRAME", "CLOSE_UNAUTHORIZED", "CLOSE_ID_IN_USE", "CLOSE_NOT_READY"):
        code = getattr(protocol, name)
        doc = {
            "CLOSE_BAD_FRAME": "a frame that does not fit the protocol; the reason says where",
            "CLOSE_UNAUTHORIZED": "the token was refused",
            "CLOSE_ID_IN_USE": "another live connection uses this `worker_id`",
            "CLOSE_NOT_READY": "the node is starting, stopping or a standby: try the next",
        }[name]
        parts.append(f"| {code} | {doc} |\n")
    sections = [
        ("Worker → server", worker_frames.MESSAGES),
        ("Server → Worker", server_frames.MESSAGES),
    ]
    for title, structs in sections:
        parts.append(f"\n## {title}\n")
        for struct in structs:
            tag = msgspec.inspect.type_info(struct).tag  # type: ignore[attr-defined]
            doc = (struct.__doc__ or "").strip()
            parts.append(f"\n### `{tag}`\n\n{doc}\n\n")
            schema = json.dumps(_frame_schema(struct, tag), indent=2, sort_keys=True)
            parts.append(f"```json\n{schema}\n```\n")
    parts.append(RESULTS)
    for model in (ModelResponse, Summary, ToolOutcome):
        doc = (model.__doc__ or "").strip()
        parts.append(
            f"\n### `{model.__name__}`\n\n{doc}\n\n" if doc else f"\n### `{model.__name__}`\n\n"
        )
        schema = json.dumps(_schema(model), indent=2, sort_keys=True)
        parts.append(f"```json\n{schema}\n```\n")
    parts.append(f"\nProtocol version: {protocol.PROTOCOL_VERSION} (sent in `hello.protocol`).\n")
    return "".join(parts)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m dex.wire.protocol_page PATH", file=sys.stderr)
        return 2
    Path(argv[0]).write_text(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
