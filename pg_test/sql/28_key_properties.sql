-- Properties of key derivation and payload canonicalisation, on thousands of generated
-- values, where the server's own types and output functions are the oracle: a part's text in
-- a key is what PostgreSQL prints for it in a fixed form, distinct parts never make one key,
-- and a payload's fingerprint ignores what jsonb ignores and trailing zeros. Each query
-- prints how many cases broke the property (0) and how many ran. The in-process fuzz targets
-- (fuzz/, make fuzz) check the same code without a server.
SELECT setseed(0.28);

-- Integers of every width key as their decimal text: magnitudes from 1 to 2^63.
WITH n AS (
  SELECT (CASE WHEN random() < 0.5 THEN -1 ELSE 1 END
          * floor(random() * 2 ^ (1 + floor(random() * 62))))::int8 AS v
  FROM generate_series(1, 3000)
)
SELECT count(*) FILTER (WHERE idem_key('p', v) <> idem_key('p', v::text)
                          OR (v BETWEEN -32768 AND 32767 AND idem_key('p', v::int2) <> idem_key('p', v::text))
                          OR (v BETWEEN -2147483648 AND 2147483647 AND idem_key('p', v::int4) <> idem_key('p', v::text))
                          OR idem_key('p', v::numeric) <> idem_key('p', v::text)) AS broken,
       count(*) AS cases
FROM n;

-- numeric keys as its text without trailing zeros, whatever scale it came with.
WITH n AS (
  SELECT round((random() - 0.5)::numeric * 10::numeric ^ floor(random() * 40)::int, floor(random() * 12)::int)
         * CASE WHEN random() < 0.5 THEN 1 ELSE 1.000 END AS v
  FROM generate_series(1, 3000)
)
SELECT count(*) FILTER (WHERE idem_key('p', v) <> idem_key('p', trim_scale(v)::text)) AS broken,
       count(*) FILTER (WHERE scale(v) > scale(trim_scale(v))) > 1000 AS many_with_trailing_zeros,
       count(*) AS cases
FROM n;

-- uuid keys in lowercase, timestamptz in UTC with microseconds, whatever the session says.
CREATE TEMP TABLE instants AS
  SELECT timestamptz '0001-01-01 00:00:00+00' + random() * interval '3652000 days' AS t,
         gen_random_uuid() AS u
  FROM generate_series(1, 2000);
SET TimeZone = 'Pacific/Chatham';
SET DateStyle = 'SQL, DMY';
SELECT count(*) FILTER (WHERE idem_key('p', t, u)
                              <> idem_key('p', to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                                          lower(u::text))) AS broken,
       count(*) AS cases
FROM instants;
SET TimeZone = 'America/St_Johns';
SET DateStyle = 'German';
SELECT count(*) FILTER (WHERE idem_key('p', t)
                              <> idem_key('p', to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))) AS broken,
       count(*) AS cases
FROM instants;
RESET TimeZone;
RESET DateStyle;

-- Distinct part lists never share a key, from parts made of the separator, the escape and
-- the empty string.
WITH lists AS (
  SELECT DISTINCT ARRAY(SELECT (ARRAY['', 'a', '|', '\', '\|', '|\', 'a|', '\\'])[1 + floor(random() * 8)::int]
                        FROM generate_series(1, 1 + floor(random() * 4)::int + 0 * i)) AS parts
  FROM generate_series(1, 20000) AS i
)
SELECT count(*) - count(DISTINCT idem_key(VARIADIC parts)) AS collisions,
       count(*) > 1000 AS enough_lists
FROM lists;

-- A payload's fingerprint: the same for every rescaling of its numbers, different for
-- payloads jsonb tells apart.
CREATE TEMP TABLE payloads AS
  SELECT i, jsonb_object_agg('k' || floor(random() * 12)::int,
                             CASE floor(random() * 5)::int
                               WHEN 0 THEN to_jsonb(round((random() * 1000)::numeric, floor(random() * 4)::int))
                               WHEN 1 THEN to_jsonb(CASE WHEN random() < 0.5 THEN floor(random() * 3)::int::text
                                                         ELSE 'a|\' || floor(random() * 3)::int END)
                               WHEN 2 THEN to_jsonb(ARRAY[round(random()::numeric, 2), 0.50])
                               WHEN 3 THEN jsonb_build_object('n', round((random() * 10)::numeric, 1), 's', 'x|y')
                               ELSE to_jsonb(random() < 0.5) END) AS doc
  FROM generate_series(1, 3000) AS i, generate_series(1, 1 + floor(random() * 6)::int)
  GROUP BY i;
CREATE FUNCTION pg_temp.rescaled(doc jsonb) RETURNS jsonb LANGUAGE sql AS $$
  SELECT CASE jsonb_typeof(doc)
    WHEN 'number' THEN to_jsonb(doc::text::numeric * 1.000)
    WHEN 'object' THEN (SELECT jsonb_object_agg(key, pg_temp.rescaled(value)) FROM jsonb_each(doc))
    WHEN 'array' THEN (SELECT jsonb_agg(pg_temp.rescaled(value) ORDER BY n)
                       FROM jsonb_array_elements(doc) WITH ORDINALITY AS e(value, n))
    ELSE doc END
$$;
SELECT count(*) FILTER (WHERE idem_fingerprint(doc) <> idem_fingerprint(pg_temp.rescaled(doc))) AS broken,
       count(*) FILTER (WHERE doc::text <> pg_temp.rescaled(doc)::text) > 2000 AS most_rescaled_differently,
       count(*) AS cases
FROM payloads;
SELECT count(DISTINCT doc) = count(DISTINCT idem_fingerprint(doc)) AS distinct_payloads_distinct_fingerprints
FROM payloads;

-- A key from payload paths takes a string's contents and any other value's canonical text.
SELECT count(*) FILTER (WHERE idem_key_from(doc, 'k1') IS DISTINCT FROM
                              CASE jsonb_typeof(doc -> 'k1')
                                WHEN 'string' THEN idem_key(doc ->> 'k1')
                                WHEN 'number' THEN idem_key(trim_scale((doc ->> 'k1')::numeric)::text)
                                WHEN 'boolean' THEN idem_key(doc ->> 'k1')
                              END) AS broken,
       count(*) > 200 AS enough_cases,
       count(DISTINCT jsonb_typeof(doc -> 'k1')) AS kinds
FROM payloads WHERE doc ? 'k1' AND jsonb_typeof(doc -> 'k1') IN ('string', 'number', 'boolean');
