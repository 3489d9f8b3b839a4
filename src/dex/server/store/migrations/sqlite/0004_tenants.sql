-- Tenants (docs/flow-control.md): a session may belong to a tenant, given when it is
-- created and never changed. The column lets the session list and the inbox keep to one
-- tenant's sessions. A session stored before has none (its state has no tenant either).
ALTER TABLE sessions ADD COLUMN tenant TEXT;

-- A tenant's list in either order, and its inbox, read one range of one index, as each
-- filter of 0003_fleet.sql does. Partial: a session without a tenant costs them nothing.
CREATE INDEX sessions_tenant ON sessions (tenant, created_at, id) WHERE tenant IS NOT NULL;
CREATE INDEX sessions_tenant_updated ON sessions (tenant, updated_at, id)
    WHERE tenant IS NOT NULL;
CREATE INDEX sessions_tenant_waiting ON sessions (tenant, waiting_since, id)
    WHERE tenant IS NOT NULL AND waiting_since IS NOT NULL;
