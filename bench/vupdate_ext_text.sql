-- idem_versioned_update with its arguments as a driver sends jsonb parameters: JSON text,
-- parsed by jsonb's input function (pgbench cannot bind a text variable, so the text is built
-- here), where vupdate_ext.sql builds them with jsonb_build_object. Informational only.
\set id random(1, 10000)
\set v random(1, 1000000000)
SELECT idem_versioned_update('vm_ext', ('{"id": ' || :id || '}')::jsonb, ('{"status": "s' || :v || '", "version": ' || :v || '}')::jsonb);
