-- luftpause schema 4: the workspace's root write grants, shared by the runtimes on this database
-- (luftpause/runtime/pods/shared_roots.py). A run carved from the workspace with a scope that
-- writes has a row here while it holds that scope; a runtime grants such a scope only under the
-- advisory lock, after checking it writes nothing another runtime's row writes.
CREATE TABLE luftpause_root_grants (
    handle      text PRIMARY KEY,       -- the run holding the grant (its rows move with its lease)
    owner       text NOT NULL,          -- the runtime that wrote the row (luftpause_leases.owner)
    scope       text NOT NULL,          -- the granted scope: its rules as JSON (scope.py's to_json)
    granted_at  timestamptz NOT NULL DEFAULT now()
);
