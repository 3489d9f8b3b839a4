-- Tenant budgets (docs/flow-control.md, A tenant's budget): the budget of each tenant
-- that has one, set at run time (PUT /admin/tenants/{tenant}/budget, `dex tenants budget`),
-- and what each tenant's model calls used by UTC day, added to by the commit of each model
-- result (so a call counts once, in the commit that records it).
CREATE TABLE tenant_budgets (
    tenant TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE tenant_usage (
    tenant TEXT NOT NULL,
    day TEXT NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cost_usd DOUBLE PRECISION NOT NULL,
    calls INTEGER NOT NULL,
    PRIMARY KEY (tenant, day)
);
