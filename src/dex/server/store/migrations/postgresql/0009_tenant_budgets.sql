-- Tenant budgets (docs/flow-control.md, A tenant's budget): the budget of each tenant
-- that has one, set at run time (PUT /admin/tenants/{tenant}/budget, `dex tenants budget`),
-- and what each tenant's model calls used by UTC day, added to by the commit of each model
-- result (so a call counts once, in the commit that records it). Every node of a cluster
-- adds to the same rows and reads them every few seconds. The same as SQLite's
-- 0007_tenant_budgets.sql.
CREATE TABLE tenant_budgets (
    tenant TEXT COLLATE "C" PRIMARY KEY,
    spec TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE tenant_usage (
    tenant TEXT COLLATE "C" NOT NULL,
    day TEXT COLLATE "C" NOT NULL,
    input_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    cost_usd DOUBLE PRECISION NOT NULL,
    calls BIGINT NOT NULL,
    PRIMARY KEY (tenant, day)
);
