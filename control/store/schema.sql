-- Durable state of the control plane. Everything in memory (queues, registry) is rebuilt from here.
PRAGMA journal_mode = WAL;

CREATE TABLE IF NOT EXISTS jobs (
    seq              INTEGER PRIMARY KEY,      -- submission order
    id               TEXT    NOT NULL UNIQUE,
    name             TEXT    NOT NULL,
    type             TEXT    NOT NULL,
    payload          TEXT    NOT NULL,         -- JSON object
    priority         INTEGER NOT NULL,
    thread_demand    INTEGER NOT NULL,
    threads_granted  INTEGER NOT NULL,
    state            INTEGER NOT NULL,         -- JobState
    attempts         INTEGER NOT NULL,         -- leases granted: the fencing token of the latest
    charged_attempts INTEGER NOT NULL,         -- attempts counted against max_attempts
    max_attempts     INTEGER NOT NULL,
    timeout_sec      REAL    NOT NULL,
    scheduled_at     REAL,
    created_at       REAL    NOT NULL,
    ready_at         REAL    NOT NULL,
    started_at       REAL,
    finished_at      REAL,
    queue_seconds    REAL    NOT NULL,
    exec_seconds     REAL    NOT NULL,
    worker_id        TEXT    NOT NULL,
    lease_expires_at REAL,
    result           TEXT    NOT NULL,         -- JSON object, '' until SUCCEEDED
    error_code       TEXT    NOT NULL,
    error_message    TEXT    NOT NULL,
    idempotency_key  TEXT    NOT NULL,
    labels           TEXT    NOT NULL,         -- JSON object
    updated_at       REAL    NOT NULL,
    request_id       TEXT    NOT NULL DEFAULT '', -- the call that created the job (empty when unknown) for its log lines
    owner            TEXT    NOT NULL DEFAULT '', -- name of the client token that submitted it (empty without auth)
    worker_selector  TEXT    NOT NULL DEFAULT '', -- JSON object of labels a worker must have (empty: any)
    output           TEXT    NOT NULL DEFAULT '', -- the end of what the latest attempt printed
    depends_on       TEXT    NOT NULL DEFAULT '', -- ids of the jobs it starts after (space-separated)
    gpu_count        INTEGER NOT NULL DEFAULT 0,  -- GPUs it holds while it runs
    memory_mb        INTEGER NOT NULL DEFAULT 0,  -- memory (MiB) it holds while it runs
    notify           TEXT    NOT NULL DEFAULT '', -- JSON list of where its ends are announced (empty: nowhere)
    start_when       INTEGER NOT NULL DEFAULT 0   -- what depends_on must do first: 0 all succeed, 1 all end
);

CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, seq);
CREATE INDEX IF NOT EXISTS jobs_by_type ON jobs (type, seq);

CREATE TABLE IF NOT EXISTS idempotency_keys (
    key          TEXT PRIMARY KEY,
    request_hash TEXT NOT NULL,
    job_id       TEXT NOT NULL,
    expires_at   REAL NOT NULL
) WITHOUT ROWID;  -- the key is the row: one b-tree to write per key instead of a table and its index

CREATE INDEX IF NOT EXISTS idempotency_keys_by_expiry ON idempotency_keys (expires_at);

CREATE TABLE IF NOT EXISTS job_types (
    name        TEXT PRIMARY KEY,
    schema      TEXT NOT NULL,                 -- JSON Schema of the payload
    description TEXT NOT NULL,
    updated_at  REAL NOT NULL
);

CREATE TABLE IF NOT EXISTS accounts (
    name                TEXT PRIMARY KEY,
    password_hash       TEXT NOT NULL,              -- bcrypt, salt and cost inside
    session             TEXT NOT NULL,              -- made anew with each password; logins carry it
    created_at          REAL NOT NULL,
    password_changed_at REAL NOT NULL
);

-- Values the control planes of one store share: the key that signs logins.
CREATE TABLE IF NOT EXISTS settings (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- The audit log (control.audit): who changed what, when, and whether it was allowed.
CREATE TABLE IF NOT EXISTS audit (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused, even after a purge
    time       REAL NOT NULL,
    actor      TEXT NOT NULL,
    action     TEXT NOT NULL,
    target     TEXT NOT NULL,
    outcome    TEXT NOT NULL,
    request_id TEXT NOT NULL
);

CREATE INDEX IF NOT EXISTS audit_by_actor ON audit (actor, seq);
-- The retention sweep (control.store.audit_rows.purge_sql, oldest by time first) and --target searches
-- read these, not the whole log: between sweeps nothing is old enough, and a scan of it each minute
-- held the event loop (SQLite) or the writer (PostgreSQL).
CREATE INDEX IF NOT EXISTS audit_by_time ON audit (time, seq);
CREATE INDEX IF NOT EXISTS audit_by_target ON audit (target, seq);
