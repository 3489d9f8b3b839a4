/**
 * The Worker's OpenTelemetry spans, as the Python Worker's: one per attempt it runs, under
 * the attempt's span on the server (the hand-out's ``traceparent``), active while the model
 * or tool code runs so that spans the user's code makes nest under it.
 *
 * Only the OpenTelemetry API is used: a no-op until the application registers an SDK
 * (and a context manager, for the nesting), as NodeSDK does.
 */
import {
  Context,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  Tracer,
  context,
  trace,
} from "@opentelemetry/api";

import { Interrupt, ToolError } from "./agent";
import type * as p from "./protocol";

/** W3C Trace Context: version-traceid-parentid-flags; a later version may add fields. */
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/**
 * The context holding the remote parent a ``traceparent`` names, or the root context
 * (a new trace) when it does not fit the W3C format, as OpenTelemetry's propagators read it.
 */
export function remoteParent(traceparent: string): Context {
  const match = TRACEPARENT.exec(traceparent.trim());
  if (match === null) return ROOT_CONTEXT;
  const [, version, traceId, spanId, flags, rest] = match;
  if (version === "ff" || (version === "00" && rest !== undefined)) return ROOT_CONTEXT;
  if (/^0+$/.test(traceId) || /^0+$/.test(spanId)) return ROOT_CONTEXT;
  return trace.setSpanContext(ROOT_CONTEXT, {
    traceId,
    spanId,
    traceFlags: parseInt(flags, 16),
    isRemote: true,
  });
}

export class AttemptTracing {
  private readonly tracer: Tracer;

  /** Spans go to the global tracer provider (the one registered when the span starts). */
  constructor(private readonly workerId: string) {
    this.tracer = trace.getTracer("dex.worker");
  }

  /**
   * Run ``body`` in the span of one attempt, named for what runs: ``dex.model AGENT``,
   * ``dex.compact AGENT`` or ``dex.tool TOOL``. A ToolError or another error sets its status
   * to error (the latter recorded as an exception event); a pause (``ctx.ask``,
   * ``ctx.sleep``) sets ``dex.paused``, and an attempt the server stopped or cancelled
   * meanwhile ``dex.cancelled``.
   */
  async span<T>(
    step: p.StepMessage,
    model: Record<string, unknown>,
    cancelled: () => boolean,
    body: () => Promise<T>,
  ): Promise<T> {
    const attributes: Record<string, string | number> = {
      "dex.session_id": step.session_id,
      "dex.step_id": step.step_id,
      "dex.step_type": step.step_type,
      "dex.attempt_id": step.attempt_id,
      "dex.attempt": step.attempt,
      "dex.agent": step.agent,
      "dex.worker_id": this.workerId,
    };
    let name: string;
    if (step.step_type === "RunModel") {
      name = `dex.model ${step.agent}`;
      attributes["gen_ai.system"] = String(model.provider ?? "");
      attributes["gen_ai.request.model"] = String(model.name ?? "");
    } else if (step.step_type === "CompactContext") {
      name = `dex.compact ${step.agent}`;
    } else {
      name = `dex.tool ${step.tool ?? ""}`;
      attributes["dex.tool"] = step.tool ?? "";
      attributes["dex.call_id"] = step.call_id ?? "";
    }
    const parent = step.traceparent ? remoteParent(step.traceparent) : context.active();
    const span = this.tracer.startSpan(name, { kind: SpanKind.CONSUMER, attributes }, parent);
    try {
      return await context.with(trace.setSpan(parent, span), body);
    } catch (e) {
      if (cancelled()) {
        // the finally below marks it
      } else if (e instanceof Interrupt) {
        span.setAttribute("dex.paused", true); // asked a question, or sleeps
      } else if (e instanceof ToolError) {
        span.setStatus({ code: SpanStatusCode.ERROR, message: e.message });
      } else {
        const error = e instanceof Error ? e : new Error(String(e));
        span.recordException(error);
        span.setStatus({ code: SpanStatusCode.ERROR, message: `${error.name}: ${error.message}` });
      }
      throw e;
    } finally {
      // JavaScript cannot stop a stopped attempt's code: its span ends when the code does
      if (cancelled()) span.setAttribute("dex.cancelled", true);
      span.end();
    }
  }
}
