-- luftpause schema 3: where each runtime answers (luftpause/runtime/mcp/routing.py). An MCP call
-- about a run another runtime holds is forwarded to that runtime's URL, found here by the lease's
-- owner; each runtime writes its row at start.
CREATE TABLE luftpause_runtimes (
    owner       text PRIMARY KEY,       -- the runtime, as luftpause_leases.owner names it
    url         text NOT NULL,          -- its [runtime] advertise_url (default: http://<listen>)
    started_at  timestamptz NOT NULL DEFAULT now()
);
