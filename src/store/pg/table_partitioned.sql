CREATE TABLE IF NOT EXISTS idempotency (
    id               text        NOT NULL,
    status           text        NOT NULL CHECK (status IN ('IN_PROGRESS', 'COMPLETED')),
    owner            text        NOT NULL,
    fingerprint      text        NOT NULL,
    expiration_s     bigint      NOT NULL,
    lease_until_ms   bigint,
    response         bytea,
    created_at_ms    bigint,
    completed_at_ms  bigint,
    attempt          integer     NOT NULL DEFAULT 1,
    first_started_ms bigint,
    steps            jsonb,
    claimed_at       timestamptz NOT NULL,
    PRIMARY KEY (id, claimed_at)
) PARTITION BY RANGE (claimed_at);
