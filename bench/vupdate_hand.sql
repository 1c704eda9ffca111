\set id random(1, 10000)
\set v random(1, 1000000000)
UPDATE vm_hand SET status = 's' || :v::bigint, version = :v::bigint WHERE id = :id::int AND version < :v::bigint;
