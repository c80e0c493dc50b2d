-- luftpause schema 2: several runtimes on one database. Each run is held by one runtime at a time
-- through its lease (luftpause/runtime/runs/custody.py): the owner renews it; another runtime
-- takes over a lease that expired, with the generation one higher. Every record says which owner
-- and generation wrote it, and a record whose generation is not its run's lease's is refused.
CREATE TABLE luftpause_leases (
    handle      text PRIMARY KEY,       -- the run
    owner       text NOT NULL,          -- the runtime holding it ([runtime] listen on its host)
    generation  bigint NOT NULL,        -- one higher at every takeover: the fencing token
    expires_at  timestamptz NOT NULL    -- renewed by the owner; past it, any runtime may take over
);
CREATE INDEX luftpause_leases_by_owner ON luftpause_leases (owner, expires_at);
ALTER TABLE luftpause_records ADD COLUMN owner text, ADD COLUMN generation bigint;
