// Command testclient drives a real Dex server with the Go Client, for
// tests/e2e/test_go_client.py: it creates a session of the test agents' waiter, sends a
// message that calls publish (a tool that needs approval), finds the approval in the
// turn, the snapshot, the inbox and the session's approvals, approves it, waits for the
// turn, reads the event stream from the start and again from the middle, forks the
// session and denies the fork's call, and meets the errors the API answers. Then flow
// control: a session created with a tenant, a priority and a budget, its budget set and
// removed, model groups' limits set and cleared (one with slashes, one with characters
// to escape), and its tenant's budget set, read back (the tenant, the list, the
// snapshot), refused when bad and removed. It prints a JSON summary of what it saw; the
// test asserts on it. -addresses is the server's addresses, comma-separated (a dead one
// first tries the fail-over).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/dex-run/dex/sdk/go/client"
)

func main() {
	addresses := flag.String("addresses", "", "the server's addresses, comma-separated")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	summary, err := run(ctx, *addresses)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testclient:", err)
		os.Exit(1)
	}
	out, _ := json.MarshalIndent(summary, "", "  ")
	fmt.Println(string(out))
}

const (
	sessionID = "go-client-1"
	forkID    = "go-client-fork"
	budgetID  = "go-client-budget"
	group     = "anthropic/claude-sonnet-4-5"
	oddGroup  = "team #1/a?b%c d"
	publish   = `call: [["publish", {"post": "hello"}]]`
)

func run(ctx context.Context, addresses string) (map[string]any, error) {
	c, err := client.New(client.Options{Addresses: []string{addresses}, Timeout: 20 * time.Second})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	summary := map[string]any{"addresses": c.Addresses()}
	if err := waitForAgent(ctx, c, "waiter"); err != nil {
		return nil, err
	}

	// a session, and its id again
	session, err := c.CreateSession(ctx, "waiter", sessionID)
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	summary["session"] = map[string]any{"id": session.ID, "agent": session.Agent, "status": session.Status}
	_, err = c.CreateSession(ctx, "waiter", sessionID)
	summary["create_again"] = kindOf(err)

	// a message whose turn waits for an approval
	sent, err := c.SendMessage(ctx, sessionID, publish, client.SendOptions{MessageID: "m-1", Wait: true, Timeout: 20 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("send: %w", err)
	}
	if len(sent.WaitingFor) != 1 {
		return nil, fmt.Errorf("the turn waits for %d things, not the approval: %+v", len(sent.WaitingFor), sent)
	}
	waiting := sent.WaitingFor[0]
	summary["sent"] = map[string]any{
		"turn": sent.Turn, "status": sent.Status, "created": sent.Created,
		"waiting_for": map[string]any{"kind": waiting.Kind, "tool": waiting.Tool, "arguments": waiting.Arguments},
	}

	snapshot, err := c.AgentSnapshot(ctx, sessionID)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	var approvalInSnapshot []string
	for _, a := range snapshot.Approvals {
		approvalInSnapshot = append(approvalInSnapshot, a.CallID)
	}
	var steps []string
	for _, step := range snapshot.CurrentTurn.Steps {
		steps = append(steps, fmt.Sprintf("%s %s %d", step.Type, step.Status, len(step.Attempts)))
	}
	summary["snapshot_waiting"] = map[string]any{
		"status": snapshot.Session.Status, "approvals": approvalInSnapshot, "steps": steps,
		"turn_status": snapshot.CurrentTurn.Status, "waiting_since": snapshot.Session.WaitingSince != nil,
	}

	inbox, err := c.ListInbox(ctx, client.InboxOptions{Limit: 10})
	if err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	var item *client.PersonWait
	for i := range inbox.Items {
		if inbox.Items[i].SessionID == sessionID {
			item = &inbox.Items[i]
		}
	}
	if item == nil {
		return nil, fmt.Errorf("the inbox has no wait of %s: %+v", sessionID, inbox)
	}
	summary["inbox"] = map[string]any{"call_id": item.CallID, "kind": item.Kind, "tool": item.Tool, "turn": item.Turn}

	approvals, err := c.ListApprovals(ctx, sessionID)
	if err != nil {
		return nil, fmt.Errorf("approvals: %w", err)
	}
	summary["approvals"] = len(approvals)

	// approve what the inbox shows, bound to the arguments it shows
	approved, err := c.Approve(ctx, sessionID, item.CallID, client.ApproveOptions{By: "go-client", ArgumentsHash: item.ArgumentsHash})
	if err != nil {
		return nil, fmt.Errorf("approve: %w", err)
	}
	summary["approved"] = approved.Approved && approved.CallID == waiting.CallID
	_, err = c.Approve(ctx, sessionID, item.CallID, client.ApproveOptions{})
	summary["approve_again"] = kindOf(err)

	turn, err := c.WaitTurn(ctx, sessionID, sent.Turn, 20*time.Second)
	if err != nil {
		return nil, fmt.Errorf("wait: %w", err)
	}
	summary["turn"] = map[string]any{"status": turn.Status, "text": turn.Text, "tool_calls": len(turn.ToolCalls)}
	if len(turn.ToolCalls) == 1 {
		call := turn.ToolCalls[0]
		summary["tool_call"] = map[string]any{
			"name": call.Name, "status": call.Status, "idempotency_key": call.IdempotencyKey,
			"result": call.Result, "approval_by": call.Approval["by"],
		}
	}
	again, err := c.SendMessage(ctx, sessionID, publish, client.SendOptions{MessageID: "m-1", Wait: true})
	if err != nil {
		return nil, fmt.Errorf("send again: %w", err)
	}
	summary["send_again"] = map[string]any{"turn": again.Turn, "created": again.Created, "status": again.Status}

	// the events, from the start, then again after the wait started
	events, err := readUntilTurnEnds(ctx, c, client.StreamOptions{}, sent.Turn)
	if err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	summary["events"] = types(events)
	resumeAt := -1
	for i, e := range events {
		if e.Type == client.EventWaitStarted {
			resumeAt = i
		}
	}
	if resumeAt < 0 {
		return nil, fmt.Errorf("no wait.started in %v", types(events))
	}
	resumed, err := readUntilTurnEnds(ctx, c, client.StreamOptions{LastEventID: events[resumeAt].ID}, sent.Turn)
	if err != nil {
		return nil, fmt.Errorf("events resumed: %w", err)
	}
	summary["resumed_events"] = types(resumed)
	summary["resumed_ids_follow"] = len(resumed) > 0 && resumed[0].ID == events[resumeAt+1].ID

	// the fleet views
	page, err := c.ListSessions(ctx, client.ListSessionsOptions{Agent: "waiter", Status: client.SessionIdle})
	if err != nil {
		return nil, fmt.Errorf("sessions: %w", err)
	}
	var listed []string
	for _, s := range page.Sessions {
		listed = append(listed, s.ID)
	}
	summary["listed_idle"] = listed
	workers, err := c.ListWorkers(ctx)
	if err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	var served []string
	for _, w := range workers {
		for _, a := range w.Agents {
			served = append(served, a.Name)
		}
	}
	summary["workers"] = map[string]any{"count": len(workers), "agents": served}
	cluster, err := c.Cluster(ctx)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	summary["cluster"] = map[string]any{"members": len(cluster.Members), "node_id": cluster.NodeID}

	// a fork, whose call is denied
	forked, err := c.ForkSession(ctx, sessionID, sent.Turn+1, forkID)
	if err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}
	summary["fork"] = map[string]any{"id": forked.ID, "from": forked.ForkedFrom, "messages_received": forked.MessagesReceived}
	forkSent, err := c.SendMessage(ctx, forkID, `call: [["publish", {"post": "second"}]]`, client.SendOptions{Wait: true, Timeout: 20 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("send to the fork: %w", err)
	}
	if forkSent.Status != client.TurnWaiting {
		return nil, fmt.Errorf("the fork's turn does not wait: %+v", forkSent)
	}
	if _, err := c.Deny(ctx, forkID, forkSent.WaitingFor[0].CallID, "not today", "go-client"); err != nil {
		return nil, fmt.Errorf("deny: %w", err)
	}
	forkTurn, err := c.WaitTurn(ctx, forkID, forkSent.Turn, 20*time.Second)
	if err != nil {
		return nil, fmt.Errorf("wait for the fork: %w", err)
	}
	summary["fork_turn"] = map[string]any{
		"turn": forkSent.Turn, "status": forkTurn.Status, "call_status": forkTurn.ToolCalls[0].Status,
		"call_error": forkTurn.ToolCalls[0].Error,
	}

	// the snapshot once the turn ended: its history and tool calls
	final, err := c.AgentSnapshot(ctx, sessionID)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	var history []string
	for _, item := range final.History {
		history = append(history, item.Type)
	}
	var calls []string
	for _, call := range final.ToolCalls {
		calls = append(calls, fmt.Sprintf("%d %s %s", call.Turn, call.Name, call.Status))
	}
	summary["snapshot_ended"] = map[string]any{
		"status": final.Session.Status, "last_turn_status": final.Session.LastTurnStatus,
		"current_turn": final.CurrentTurn != nil, "history": history, "tool_calls": calls,
		"approvals": len(final.Approvals),
	}

	// errors
	_, err = c.CancelTurn(ctx, sessionID, "")
	summary["cancel_idle"] = kindOf(err)
	_, err = c.AgentSnapshot(ctx, "no-such-session")
	summary["unknown_session"] = kindOf(err)
	stream := c.StreamEvents(ctx, "no-such-session", client.StreamOptions{})
	stream.Next()
	summary["unknown_session_events"] = kindOf(stream.Err())

	if err := flowControl(ctx, c, summary); err != nil {
		return nil, err
	}
	return summary, nil
}

// flowControl creates a session with a budget, changes and removes the budget, and sets
// and clears model groups' limits.
func flowControl(ctx context.Context, c *client.Client, summary map[string]any) error {
	created, err := c.CreateSession(ctx, "waiter", budgetID, client.CreateOptions{Tenant: "acme", Priority: 3, MaxTokens: 1000})
	if err != nil {
		return fmt.Errorf("create with a budget: %w", err)
	}
	snapshot, err := c.AgentSnapshot(ctx, budgetID)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	set, err := c.SetBudget(ctx, budgetID, client.BudgetOptions{MaxCostUSD: 2.5, By: "go-client"})
	if err != nil {
		return fmt.Errorf("set the budget: %w", err)
	}
	_, refusedErr := c.SetBudget(ctx, budgetID, client.BudgetOptions{})
	removed, err := c.RemoveBudget(ctx, budgetID, "go-client")
	if err != nil {
		return fmt.Errorf("remove the budget: %w", err)
	}
	_, unknownErr := c.SetBudget(ctx, "no-such-session", client.BudgetOptions{MaxTokens: 1})
	summary["budgeted"] = map[string]any{
		"id": created.ID, "tenant": created.Tenant,
		"created": map[string]any{"priority": snapshot.Session.Priority, "budget": snapshot.Session.Budget},
		"set":     set, "refused": kindOf(refusedErr), "removed": removed, "unknown": kindOf(unknownErr),
	}

	before, err := c.GetLimits(ctx)
	if err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	limitSet, err := c.SetLimit(ctx, group, client.LimitOptions{Concurrency: 2, RPM: 60})
	if err != nil {
		return fmt.Errorf("set a limit: %w", err)
	}
	oddSet, err := c.SetLimit(ctx, oddGroup, client.LimitOptions{TPM: 1000})
	if err != nil {
		return fmt.Errorf("set the odd group's limit: %w", err)
	}
	_, refusedErr = c.SetLimit(ctx, group, client.LimitOptions{Concurrency: -1})
	cleared, err := c.ClearLimit(ctx, group)
	if err != nil {
		return fmt.Errorf("clear a limit: %w", err)
	}
	summary["limits"] = map[string]any{
		"before": groups(before), "set": find(limitSet, group), "odd": find(oddSet, oddGroup),
		"refused": kindOf(refusedErr), "cleared": groups(cleared),
	}
	return tenantBudget(ctx, c, summary)
}

// tenantBudget sets the budgeted session's tenant's budget, reads it back three ways,
// meets the server's refusals and removes it.
func tenantBudget(ctx context.Context, c *client.Client, summary map[string]any) error {
	set, err := c.SetTenantBudget(ctx, "acme", client.TenantBudgetOptions{
		MaxTokensPerDay: 100000, MaxCostUSDPerMonth: 50, By: "go-client",
	})
	if err != nil {
		return fmt.Errorf("set the tenant's budget: %w", err)
	}
	read, err := c.GetTenant(ctx, "acme")
	if err != nil {
		return fmt.Errorf("get the tenant: %w", err)
	}
	tenants, err := c.ListTenants(ctx)
	if err != nil {
		return fmt.Errorf("list the tenants: %w", err)
	}
	var listed *client.Tenant
	for i := range tenants {
		if tenants[i].Tenant == "acme" {
			listed = &tenants[i]
		}
	}
	snapshot, err := c.AgentSnapshot(ctx, budgetID)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	_, noLimitErr := c.SetTenantBudget(ctx, "acme", client.TenantBudgetOptions{By: "go-client"})
	_, negativeErr := c.SetTenantBudget(ctx, "acme", client.TenantBudgetOptions{MaxTokensPerDay: -1})
	_, badNameErr := c.GetTenant(ctx, "not a tenant")
	afterRefusals, err := c.GetTenant(ctx, "acme")
	if err != nil {
		return fmt.Errorf("get the tenant again: %w", err)
	}
	removed, err := c.RemoveTenantBudget(ctx, "acme", "go-client")
	if err != nil {
		return fmt.Errorf("remove the tenant's budget: %w", err)
	}
	summary["tenant"] = map[string]any{
		"set": set, "read": read, "listed": listed, "in_snapshot": snapshot.Session.TenantUsage,
		"refused":        []string{kindOf(noLimitErr), kindOf(negativeErr), kindOf(badNameErr)},
		"after_refusals": afterRefusals.Budget, "removed": removed,
	}
	return nil
}

func groups(limits []client.GroupLimits) []string {
	out := []string{}
	for _, g := range limits {
		out = append(out, g.Group)
	}
	return out
}

func find(limits []client.GroupLimits, name string) *client.GroupLimits {
	for i := range limits {
		if limits[i].Group == name {
			return &limits[i]
		}
	}
	return nil
}

// waitForAgent waits until a Worker serves agent.
func waitForAgent(ctx context.Context, c *client.Client, agent string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		agents, err := c.ListAgents(ctx)
		if err != nil {
			return fmt.Errorf("agents: %w", err)
		}
		for _, a := range agents {
			if a.Name == agent && a.Workers > 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no Worker serves %s after 20 s", agent)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// readUntilTurnEnds reads the session's events until turn ends.
func readUntilTurnEnds(ctx context.Context, c *client.Client, opts client.StreamOptions, turn int) ([]client.Event, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	stream := c.StreamEvents(ctx, sessionID, opts)
	defer stream.Close()
	var events []client.Event
	for stream.Next() {
		e := stream.Event()
		events = append(events, e)
		if e.Type == client.EventTurnCompleted || e.Type == client.EventTurnFailed || e.Type == client.EventTurnCancelled {
			var data struct{ Turn int }
			if err := json.Unmarshal(e.Data, &data); err != nil {
				return nil, err
			}
			if data.Turn == turn {
				return events, nil
			}
		}
	}
	return nil, fmt.Errorf("the stream ended after %v: %w", types(events), stream.Err())
}

func types(events []client.Event) []string {
	out := []string{}
	for _, e := range events {
		out = append(out, e.Type)
	}
	return out
}

// kindOf names an error for the summary: its status and code, or "none".
func kindOf(err error) string {
	var e *client.Error
	switch {
	case err == nil:
		return "none"
	case errors.As(err, &e):
		return fmt.Sprintf("%d %s", e.Status, e.Code)
	default:
		return err.Error()
	}
}
