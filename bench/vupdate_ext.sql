\set id random(1, 10000)
\set v random(1, 1000000000)
SELECT idem_versioned_update('vm_ext', jsonb_build_object('id', :id::int), jsonb_build_object('status', 's' || :v::bigint, 'version', :v::bigint));
