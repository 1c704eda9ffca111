\set part random(0, 999)
SELECT idem_watermark_advance('orders', :part::int, nextval('ext_positions'));
