-- Durable state of the control plane on PostgreSQL: the same tables as schema.sql, in PostgreSQL's types
-- (REAL there is 8 bytes; here it is DOUBLE PRECISION). Run by the control plane that holds the lock.

-- The schema version this database was last made to (control.store.postgres.SCHEMA_VERSION), in one
-- row: an older release refuses a database a newer one changed rather than misread it. The row is written
-- by the same transaction as the tables; a database made before it was kept has the tables and no row.
CREATE TABLE IF NOT EXISTS corral_schema (
    one     BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),  -- at most one row
    version INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS jobs (
    seq              BIGINT           PRIMARY KEY,  -- submission order
    id               TEXT             NOT NULL UNIQUE,
    name             TEXT             NOT NULL,
    type             TEXT             NOT NULL,
    payload          TEXT             NOT NULL,     -- JSON object
    priority         INTEGER          NOT NULL,
    thread_demand    INTEGER          NOT NULL,
    threads_granted  INTEGER          NOT NULL,
    state            SMALLINT         NOT NULL,     -- JobState
    attempts         BIGINT           NOT NULL,     -- leases granted: the fencing token of the latest
    charged_attempts BIGINT           NOT NULL,     -- attempts counted against max_attempts
    max_attempts     BIGINT           NOT NULL,
    timeout_sec      DOUBLE PRECISION NOT NULL,
    scheduled_at     DOUBLE PRECISION,
    created_at       DOUBLE PRECISION NOT NULL,
    ready_at         DOUBLE PRECISION NOT NULL,
    started_at       DOUBLE PRECISION,
    finished_at      DOUBLE PRECISION,
    queue_seconds    DOUBLE PRECISION NOT NULL,
    exec_seconds     DOUBLE PRECISION NOT NULL,
    worker_id        TEXT             NOT NULL,
    lease_expires_at DOUBLE PRECISION,
    result           TEXT             NOT NULL,     -- JSON object, '' until SUCCEEDED
    error_code       TEXT             NOT NULL,
    error_message    TEXT             NOT NULL,
    idempotency_key  TEXT             NOT NULL,
    labels           TEXT             NOT NULL,     -- JSON object
    updated_at       DOUBLE PRECISION NOT NULL,
    request_id       TEXT             NOT NULL DEFAULT '',
    owner            TEXT             NOT NULL DEFAULT '',
    worker_selector  TEXT             NOT NULL DEFAULT '',
    output           TEXT             NOT NULL DEFAULT '',
    depends_on       TEXT             NOT NULL DEFAULT '',
    gpu_count        INTEGER          NOT NULL DEFAULT 0,
    memory_mb        INTEGER          NOT NULL DEFAULT 0,
    notify           TEXT             NOT NULL DEFAULT '',
    start_when       INTEGER          NOT NULL DEFAULT 0
);

-- Columns added since the first release with this schema (a database made then gains them). Only when
-- missing: ALTER TABLE takes its ACCESS EXCLUSIVE lock before IF NOT EXISTS is looked at, so on every
-- takeover it waited behind any reader of jobs (a pg_dump: minutes), and every query after it waited too.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'jobs'::regclass AND attname = 'gpu_count' AND NOT attisdropped) THEN
        ALTER TABLE jobs ADD COLUMN gpu_count INTEGER NOT NULL DEFAULT 0;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'jobs'::regclass AND attname = 'memory_mb' AND NOT attisdropped) THEN
        ALTER TABLE jobs ADD COLUMN memory_mb INTEGER NOT NULL DEFAULT 0;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'jobs'::regclass AND attname = 'notify' AND NOT attisdropped) THEN
        ALTER TABLE jobs ADD COLUMN notify TEXT NOT NULL DEFAULT '';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'jobs'::regclass AND attname = 'start_when' AND NOT attisdropped) THEN
        ALTER TABLE jobs ADD COLUMN start_when INTEGER NOT NULL DEFAULT 0;
    END IF;
END
$$;

CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, seq);
CREATE INDEX IF NOT EXISTS jobs_by_type ON jobs (type, seq);
CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs (owner, seq) WHERE owner != '';
-- ListJobs by labels (control.store.postgres.list_jobs writes its WHERE to match): a page over a large
-- table reads the matching jobs, not every job's labels. Jobs without labels cost no entry.
CREATE INDEX IF NOT EXISTS jobs_by_labels ON jobs USING GIN ((labels::jsonb) jsonb_path_ops) WHERE labels != '{}';

CREATE TABLE IF NOT EXISTS idempotency_keys (
    key          TEXT             PRIMARY KEY,
    request_hash TEXT             NOT NULL,
    job_id       TEXT             NOT NULL,
    expires_at   DOUBLE PRECISION NOT NULL
);

CREATE INDEX IF NOT EXISTS idempotency_keys_by_expiry ON idempotency_keys (expires_at);

CREATE TABLE IF NOT EXISTS job_types (
    name        TEXT             PRIMARY KEY,
    schema      TEXT             NOT NULL,          -- JSON Schema of the payload
    description TEXT             NOT NULL,
    updated_at  DOUBLE PRECISION NOT NULL
);

CREATE TABLE IF NOT EXISTS accounts (
    name                TEXT PRIMARY KEY,
    password_hash       TEXT NOT NULL,              -- bcrypt, salt and cost inside
    session             TEXT NOT NULL,              -- made anew with each password; logins carry it
    created_at          DOUBLE PRECISION NOT NULL,
    password_changed_at DOUBLE PRECISION NOT NULL
);

-- Values the control planes of one store share: the key that signs logins.
CREATE TABLE IF NOT EXISTS settings (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- The audit log (control.audit): who changed what, when, and whether it was allowed.
CREATE TABLE IF NOT EXISTS audit (
    seq        BIGSERIAL        PRIMARY KEY,
    time       DOUBLE PRECISION NOT NULL,
    actor      TEXT             NOT NULL,
    action     TEXT             NOT NULL,
    target     TEXT             NOT NULL,
    outcome    TEXT             NOT NULL,
    request_id TEXT             NOT NULL
);

CREATE INDEX IF NOT EXISTS audit_by_actor ON audit (actor, seq);
-- The retention sweep (control.store.audit_rows.purge_sql, oldest by time first) and --target searches
-- read these, not the whole log: between sweeps nothing is old enough, and a scan of it each minute
-- held the event loop (SQLite) or the writer (PostgreSQL).
CREATE INDEX IF NOT EXISTS audit_by_time ON audit (time, seq);
CREATE INDEX IF NOT EXISTS audit_by_target ON audit (target, seq);
