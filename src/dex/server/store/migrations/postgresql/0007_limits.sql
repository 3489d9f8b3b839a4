-- Model limits set at run time (PUT /v1/limits/{group}, `dex limits set`): they outlive
-- the node, and every node of the cluster reads them (docs/flow-control.md).
CREATE TABLE model_limits (
    grp TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);

-- Each node's demand on each limited model group (its calls running and waiting), which
-- every node reports and reads every few seconds to take its share of the group's
-- limits (dex.server.flow.ModelLimits.share_by_demand). Rows of a node that stopped
-- reporting are ignored once stale.
CREATE TABLE dex_limit_demand (
    node TEXT NOT NULL,
    grp TEXT NOT NULL,
    demand INTEGER NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (node, grp)
);
