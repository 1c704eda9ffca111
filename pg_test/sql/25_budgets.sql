-- Size budgets. Retention bounds a claim's age, not the ledger's size: when claims arrive
-- fast enough, the ones younger than the retention alone can outgrow the disk. A declared
-- scope may set a row budget; idempotency.scope_sizes shows its size and where its rate
-- leads, and the purge warns (ID005) about every scope over its budget.
SELECT scope, row_budget FROM idem_declare_scope('budgeted', broker_retention => '2 days', buffer => '0');
SELECT scope, row_budget FROM idem_scope_budget('budgeted', 100);

-- 150 claims today, and 30 made three days ago, past the scope's two days of retention.
SELECT count(*) FILTER (WHERE idem_claim('b-' || i, 'budgeted')) AS claimed FROM generate_series(1, 180) AS i;
UPDATE idempotency.ledger SET claimed_at = claimed_at - interval '3 days'
WHERE scope_id = idem_scope_id('budgeted') AND key_digest IN (SELECT idem_digest('b-' || i, 'budgeted') FROM generate_series(1, 30) AS i);

-- Small ledgers are counted exactly; large ones from a sample of their blocks.
SELECT scope, retention, claims_now, bytes_now > 0 AS has_bytes, claims_per_day, projected_claims, row_budget, over_budget
FROM idempotency.scope_sizes WHERE scope = 'budgeted';

-- The purge deletes the 30 expired claims; the 150 left are still over the budget, so it warns
-- with SQLSTATE ID005 (shown first), and does so again the next time (with its message).
\set VERBOSITY sqlstate
CALL idem_purge(deleted => NULL);
\set VERBOSITY default
CALL idem_purge(deleted => NULL);
SELECT claims_now, over_budget FROM idempotency.scope_sizes WHERE scope = 'budgeted';

-- Under budget again once the budget is raised; a budget is removed with NULL.
SELECT scope, row_budget FROM idem_scope_budget('budgeted', 1000);
SELECT over_budget FROM idempotency.scope_sizes WHERE scope = 'budgeted';
SELECT scope, row_budget FROM idem_scope_budget('budgeted', NULL);
SELECT over_budget IS NULL AS no_budget FROM idempotency.scope_sizes WHERE scope = 'budgeted';

-- Redeclaring a scope keeps its budget.
SELECT scope, row_budget FROM idem_scope_budget('budgeted', 500);
SELECT scope, row_budget FROM idem_declare_scope('budgeted', broker_retention => '3 days', buffer => '0');

SELECT sqlstate_of($$SELECT idem_scope_budget('never_declared', 10)$$);
SELECT sqlstate_of($$SELECT idem_scope_budget('budgeted', 0)$$);
SELECT sqlstate_of($$SELECT idem_scope_budget(NULL, 10)$$);
-- The budget's floor holds for a direct write too.
SELECT sqlstate_of($$UPDATE idempotency.scopes SET row_budget = 0 WHERE scope = 'budgeted'$$);

-- Reading the sizes needs SELECT on the view only (it reads the ledger with its owner's
-- rights); idempotency.scope_retention needs nothing more than before.
CREATE ROLE sizes_reader NOLOGIN;
GRANT USAGE ON SCHEMA idempotency TO sizes_reader;
GRANT SELECT ON idempotency.scope_sizes, idempotency.scope_retention TO sizes_reader;
SET ROLE sizes_reader;
SELECT scope, claims_now, row_budget FROM idempotency.scope_sizes WHERE scope = 'budgeted';
SELECT scope, retention FROM idempotency.scope_retention WHERE scope = 'budgeted';
RESET ROLE;
DROP OWNED BY sizes_reader;
DROP ROLE sizes_reader;

SELECT idem_forget_scope('budgeted');
DELETE FROM idempotency.ledger WHERE scope_id = idem_scope_id('budgeted');
