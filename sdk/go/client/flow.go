package client

// The flow-control calls (docs/flow-control.md): a session's budget, model groups'
// limits and tenants' budgets.

import (
	"context"
	"net/url"
	"strings"
)

// --- a session's budget ---------------------------------------------------------------

// BudgetOptions are a session's new budget: one limit or both (0: that limit does not
// apply; both 0 is ErrInvalidInput: RemoveBudget removes a budget).
type BudgetOptions struct {
	// MaxTokens counts input and output tokens together.
	MaxTokens int
	// MaxCostUSD is in US dollars.
	MaxCostUSD float64
	// By names who changes it.
	By string
}

// SetBudget sets the session's budget. A turn that waits for its budget goes on if the
// new one is not used up. It returns the budget, the usage and the session's status.
// Tried again on every address until the timeout: setting it twice is setting it once.
func (c *Client) SetBudget(ctx context.Context, sessionID string, opts BudgetOptions) (*BudgetSet, error) {
	b := budgetOf(opts.MaxTokens, opts.MaxCostUSD)
	body := setBudget{MaxTokens: b.MaxTokens, MaxCostUSD: b.MaxCostUSD, By: opts.By}
	var out BudgetSet
	err := c.do(ctx, request{method: "PUT", path: sessionPath(sessionID, "budget"), body: body, safe: true}, &out)
	return result(&out, err)
}

// RemoveBudget removes the session's budget: no limit; a turn that waits for its budget
// goes on. by ("": none) names who removes it. Tried again as SetBudget is.
func (c *Client) RemoveBudget(ctx context.Context, sessionID, by string) (*BudgetSet, error) {
	var query url.Values
	if by != "" {
		query = url.Values{"by": {by}}
	}
	var out BudgetSet
	err := c.do(ctx, request{method: "DELETE", path: sessionPath(sessionID, "budget"), query: query, safe: true}, &out)
	return result(&out, err)
}

// --- model limits -------------------------------------------------------------------

// GetLimits returns the model groups with limits or calls: each one's Limit, its Source
// (LimitFromConfig, or LimitFromAPI when set at run time), and its calls Running and
// Steps Waiting on the node that answered. It needs an admin token when the server has
// auth on (docs/flow-control.md).
func (c *Client) GetLimits(ctx context.Context) ([]GroupLimits, error) {
	var out limitsView
	err := c.do(ctx, request{method: "GET", path: "/admin/limits"}, &out)
	return out.Groups, err
}

// LimitOptions are a model group's limits (0: that limit does not apply; all 0 lifts
// every limit of the group, whatever the server's config says).
type LimitOptions struct {
	// Concurrency is the model calls running at once.
	Concurrency int
	// RPM is the model calls started per minute.
	RPM float64
	// TPM is the input plus output tokens per minute (input estimated).
	TPM float64
}

// SetLimit sets a model group's limits at run time: stored, and enforced by every node
// within seconds; they replace the server config's for the group. group is an agent's
// model group, or the provider and the model ("anthropic/claude-sonnet-4-5": its
// slashes are sent as they are). It returns every group, as GetLimits. Not tried again
// on another address, as the Python Client's set_limit.
func (c *Client) SetLimit(ctx context.Context, group string, opts LimitOptions) ([]GroupLimits, error) {
	var body Limit
	if opts.Concurrency != 0 {
		body.Concurrency = &opts.Concurrency
	}
	if opts.RPM != 0 {
		body.RPM = &opts.RPM
	}
	if opts.TPM != 0 {
		body.TPM = &opts.TPM
	}
	var out limitsView
	err := c.do(ctx, request{method: "PUT", path: limitPath(group), body: body}, &out)
	return out.Groups, err
}

// ClearLimit drops the limits set at run time for a group: the server config's apply
// again. It returns every group, as GetLimits.
func (c *Client) ClearLimit(ctx context.Context, group string) ([]GroupLimits, error) {
	var out limitsView
	err := c.do(ctx, request{method: "DELETE", path: limitPath(group)}, &out)
	return out.Groups, err
}

// --- tenants --------------------------------------------------------------------------

// ListTenants returns each tenant with a budget or with usage this month: its Budget,
// what its sessions' model calls used Today and ThisMonth (UTC), and Reached (how its
// budget is used up, or ""). It needs an admin token when the server has auth on
// (docs/flow-control.md).
func (c *Client) ListTenants(ctx context.Context) ([]Tenant, error) {
	var out tenantsView
	err := c.do(ctx, request{method: "GET", path: "/admin/tenants"}, &out)
	return out.Tenants, err
}

// GetTenant returns one tenant's budget and usage, as ListTenants shows each (a tenant
// with neither: no budget and zeros). A name that is no tenant's is ErrInvalidInput.
func (c *Client) GetTenant(ctx context.Context, tenant string) (*Tenant, error) {
	var out Tenant
	err := c.do(ctx, request{method: "GET", path: tenantPath(tenant)}, &out)
	return result(&out, err)
}

// TenantBudgetOptions are a tenant's new budget, what all of its sessions may use in a
// UTC day and in a UTC month: one limit or more (0: that limit does not apply; all 0 is
// ErrInvalidInput: RemoveTenantBudget removes a budget).
type TenantBudgetOptions struct {
	// MaxTokensPerDay and MaxTokensPerMonth count input and output tokens together.
	MaxTokensPerDay   int
	MaxTokensPerMonth int
	// MaxCostUSDPerDay and MaxCostUSDPerMonth are in US dollars.
	MaxCostUSDPerDay   float64
	MaxCostUSDPerMonth float64
	// By names who changes it.
	By string
}

// SetTenantBudget sets a tenant's budget, in place of the one it had. Its sessions'
// turns that wait for it go on if it allows them. It returns the tenant, as GetTenant.
// Tried again on every address until the timeout: setting it twice is setting it once.
func (c *Client) SetTenantBudget(ctx context.Context, tenant string, opts TenantBudgetOptions) (*Tenant, error) {
	var body setTenantBudget
	if opts.MaxTokensPerDay != 0 {
		body.MaxTokensPerDay = &opts.MaxTokensPerDay
	}
	if opts.MaxCostUSDPerDay != 0 {
		body.MaxCostUSDPerDay = &opts.MaxCostUSDPerDay
	}
	if opts.MaxTokensPerMonth != 0 {
		body.MaxTokensPerMonth = &opts.MaxTokensPerMonth
	}
	if opts.MaxCostUSDPerMonth != 0 {
		body.MaxCostUSDPerMonth = &opts.MaxCostUSDPerMonth
	}
	body.By = opts.By
	var out Tenant
	err := c.do(ctx, request{method: "PUT", path: tenantPath(tenant) + "/budget", body: body, safe: true}, &out)
	return result(&out, err)
}

// RemoveTenantBudget removes a tenant's budget: no limit; its sessions' turns that wait
// for it go on. by ("": none) names who removes it. Tried again as SetTenantBudget is.
func (c *Client) RemoveTenantBudget(ctx context.Context, tenant, by string) (*Tenant, error) {
	var query url.Values
	if by != "" {
		query = url.Values{"by": {by}}
	}
	var out Tenant
	err := c.do(ctx, request{method: "DELETE", path: tenantPath(tenant) + "/budget", query: query, safe: true}, &out)
	return result(&out, err)
}

// limitPath is a model group's route: each part of the group between slashes escaped,
// the slashes kept, as the server's route (the rest of the path) and the Python Client
// have it.
func limitPath(group string) string {
	parts := strings.Split(group, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return "/admin/limits/" + strings.Join(parts, "/")
}

// tenantPath is a tenant's route.
func tenantPath(tenant string) string {
	return "/admin/tenants/" + url.PathEscape(tenant)
}

// budgetOf is a budget of the limits that are not 0.
func budgetOf(maxTokens int, maxCostUSD float64) *Budget {
	b := &Budget{}
	if maxTokens != 0 {
		b.MaxTokens = &maxTokens
	}
	if maxCostUSD != 0 {
		b.MaxCostUSD = &maxCostUSD
	}
	return b
}
