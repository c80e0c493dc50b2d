-- luftpause schema 1: the runs' and the MCP tasks' records, in the order they were appended
-- (luftpause/runtime/runs/journal.py gives their shapes; each is one row).
CREATE TABLE luftpause_records (
    seq     bigserial PRIMARY KEY,      -- the order records were appended in
    stream  text NOT NULL,              -- 'runs' (runs.jsonl) or 'tasks' (tasks.jsonl)
    rid     uuid NOT NULL UNIQUE,       -- the record's own id: a batch retried after a commit
                                        -- whose answer was lost is not written twice
    handle  text NOT NULL,              -- the run the record is about
    kind    text NOT NULL,              -- the record's "type"
    caller  text,                       -- the run's tenant (its MCP caller), on start and run records
    body    text NOT NULL               -- the record as JSON, exactly as runs.jsonl would hold it
);
CREATE INDEX luftpause_records_by_stream ON luftpause_records (stream, seq);
CREATE INDEX luftpause_records_by_handle ON luftpause_records (handle);
