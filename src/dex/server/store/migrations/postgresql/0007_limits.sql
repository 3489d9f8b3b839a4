-- Model limits set at run time (PUT /v1/limits/{group}, `dex limits set`): they outlive
-- the node, and every node of the cluster reads them (docs/flow-control.md).
CREATE TABLE model_limits (
    grp TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
