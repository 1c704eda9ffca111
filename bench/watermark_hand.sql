\set part random(0, 999)
UPDATE hand_offsets SET position = p FROM (SELECT nextval('hand_positions') AS p) AS next WHERE stream = 'orders' AND partition = :part::int AND position < p;
